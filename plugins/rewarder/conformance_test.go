package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/plughost/plughost/host/plugintest"
)

// TestConformance runs the SDK's conformance kit on the built binary. The
// durability check seals epoch dur-I (acknowledged by 202) and, after kill
// -9, finds it stored with the same inputs_hash. No wallet runs there:
// the epochs are computed and then quarantined as settlement_unavailable,
// which the check does not look at.
func TestConformance(t *testing.T) {
	body := func(i int) []byte {
		return fmt.Appendf(nil, `{"pool_account":"pool","pool_amount":%d,"contributions":[{"account":"a","weight":1},{"account":"b","weight":2}]}`, 100+i)
	}
	plugintest.Conformance(t, plugintest.Build(t, "."), `compute_workers = 2`,
		plugintest.Durability(
			func(ctx context.Context, do plugintest.Do, i int) error {
				code, b, err := do(ctx, "POST", fmt.Sprintf("/v1/epochs/dur-%d/compute", i), http.Header{"Content-Type": {"application/json"}}, body(i))
				if err == nil && code != http.StatusAccepted && code != http.StatusOK {
					err = fmt.Errorf("compute answered %d %s", code, b)
				}
				return err
			},
			func(ctx context.Context, do plugintest.Do, i int) error {
				code, b, err := do(ctx, "GET", fmt.Sprintf("/v1/epochs/dur-%d", i), nil, nil)
				var e epoch
				switch {
				case err != nil:
					return err
				case code != http.StatusOK || json.Unmarshal(b, &e) != nil:
					return fmt.Errorf("epoch dur-%d = %d %s, want it stored", i, code, b)
				}
				var in Inputs
				_ = json.Unmarshal(body(i), &in)
				if _, h := seal(fmt.Sprintf("dur-%d", i), in); e.InputsHash != h {
					return fmt.Errorf("epoch dur-%d has inputs_hash %s, want %s", i, e.InputsHash, h)
				}
				return nil
			}))
}
