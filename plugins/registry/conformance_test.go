package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/plughost/plughost/host/plugintest"
)

// TestConformance runs the SDK's conformance kit on the built binary. The
// in-flight request is a stream, which ends with 200 as the drain begins.
// The durability check proposes artifact {"dur":i}, approves it by a and
// b, and counts it acknowledged once the quorum approval answers 200
// with its version; after kill -9 that version holds that artifact.
func TestConformance(t *testing.T) {
	var versions sync.Map // i → version
	jsonHdr := http.Header{"Content-Type": {"application/json"}}
	plugintest.Conformance(t, plugintest.Build(t, "."), approvers(),
		plugintest.InFlight("GET /v1/stream?consumer=conformance"),
		plugintest.Durability(
			func(ctx context.Context, do plugintest.Do, i int) error {
				code, body, err := do(ctx, "POST", "/v1/proposals", jsonHdr, fmt.Appendf(nil, `{"artifact":{"dur":%d}}`, i))
				var p proposed
				switch {
				case err != nil:
					return err
				case code != http.StatusAccepted || json.Unmarshal(body, &p) != nil:
					return fmt.Errorf("propose answered %d %s", code, body)
				}
				for _, name := range []string{"a", "b"} {
					code, body, err = do(ctx, "POST", "/v1/proposals/"+p.ProposalID+"/approvals", jsonHdr,
						fmt.Appendf(nil, `{"approver":%q,"signature":%q}`, name, sign(t, name, p.Digest)))
					if err != nil {
						return err
					}
				}
				var a approved
				if code != http.StatusOK || json.Unmarshal(body, &a) != nil || !a.Committed {
					return fmt.Errorf("quorum approval answered %d %s", code, body)
				}
				versions.Store(i, a.Version)
				return nil
			},
			func(ctx context.Context, do plugintest.Do, i int) error {
				v, ok := versions.Load(i)
				if !ok {
					return fmt.Errorf("write %d acknowledged without a version", i)
				}
				code, body, err := do(ctx, "GET", fmt.Sprintf("/v1/entries/%d", v), nil, nil)
				var e entry
				switch {
				case err != nil:
					return err
				case code != http.StatusOK || json.Unmarshal(body, &e) != nil || string(e.Artifact) != fmt.Sprintf(`{"dur":%d}`, i):
					return fmt.Errorf("entry %d = %d %s, want artifact {\"dur\":%d}", v, code, body, i)
				}
				return nil
			}))
}
