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
// in-flight request is a stream of an empty topic, which ends with 200 as
// the drain begins. The durability check sends message i to topic dur-I with
// key dur-I, and after kill -9 finds it in the topic's counts.
func TestConformance(t *testing.T) {
	plugintest.Conformance(t, plugintest.Build(t, "."), `committers = 2`,
		plugintest.InFlight("GET /v1/recv/stream?topic=conformance-in-flight"),
		plugintest.Durability(
			func(ctx context.Context, do plugintest.Do, i int) error {
				h := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {fmt.Sprintf("dur-%d", i)}}
				code, body, err := do(ctx, "POST", "/v1/send", h, fmt.Appendf(nil, `{"topic":"dur-%d","payload":"eA=="}`, i))
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("send answered %d %s", code, body)
				}
				return err
			},
			func(ctx context.Context, do plugintest.Do, i int) error {
				code, body, err := do(ctx, "GET", fmt.Sprintf("/v1/topics/dur-%d", i), nil, nil)
				var s stats
				switch {
				case err != nil:
					return err
				case code != http.StatusOK || json.Unmarshal(body, &s) != nil || s.Ready+s.Inflight+s.Delayed != 1:
					return fmt.Errorf("topic dur-%d = %d %s, want one message", i, code, body)
				}
				return nil
			}))
}
