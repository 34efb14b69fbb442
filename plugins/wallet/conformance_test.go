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
// in-flight request is a read waiting 300ms for a seq that never comes:
// it answers 200 with the current snapshot when its wait ends, or at once
// when the drain begins. The durability check issues 1 to account dur-I
// with key dur-I, and reads the account's balance back after kill -9.
func TestConformance(t *testing.T) {
	plugintest.Conformance(t, plugintest.Build(t, "."), `committers = 2`,
		plugintest.InFlight("GET /v1/accounts/conformance?min_seq=18446744073709551615&wait=300ms"),
		plugintest.Durability(
			func(ctx context.Context, do plugintest.Do, i int) error {
				h := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {fmt.Sprintf("dur-%d", i)}}
				code, body, err := do(ctx, "POST", "/v1/issue", h, fmt.Appendf(nil, `{"to":"dur-%d","amount":1}`, i))
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("issue answered %d %s", code, body)
				}
				return err
			},
			func(ctx context.Context, do plugintest.Do, i int) error {
				code, body, err := do(ctx, "GET", fmt.Sprintf("/v1/accounts/dur-%d", i), nil, nil)
				var a struct{ Balance uint64 }
				switch {
				case err != nil:
					return err
				case code != http.StatusOK || json.Unmarshal(body, &a) != nil || a.Balance != 1:
					return fmt.Errorf("account dur-%d = %d %s, want balance 1", i, code, body)
				}
				return nil
			}))
}
