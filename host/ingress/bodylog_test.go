package ingress

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/host/internal/testbin"
	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// TestLogBodyLimits: the ingress logs at info each route that declares
// its own body limit, and whether the plugin block caps it, once for
// each set of limits however often the table is rebuilt.
func TestLogBodyLimits(t *testing.T) {
	log := &testbin.SyncBuffer{}
	g := New(hclog.New(&hclog.LoggerOptions{Output: log, Level: hclog.Info}), metrics.New(), Limits{MaxBodyBytes: 1 << 20})
	manifest := &pluginv1.DescribeResponse{Name: "rewarder", Version: "1", Routes: []*pluginv1.Route{
		{Method: "POST", Pattern: "/v1/epochs/{id}/compute", MaxBodyBytes: 16 << 20},
		{Method: "GET", Pattern: "/v1/epochs/{id}"},
	}}
	target := &fakeTarget{spec: supervisor.Spec{Name: "rewarder", Mount: "/rewarder"}, manifest: manifest}
	g.Update([]Target{target})
	g.Update([]Target{target})
	if got := strings.Count(log.String(), "route has its own body limit"); got != 1 {
		t.Fatalf("log after two updates has %d lines on the route's own limit, want 1:\n%s", got, log.String())
	}
	if !strings.Contains(log.String(), "route=\"POST /v1/epochs/{id}/compute\" max_body_bytes=16777216") {
		t.Errorf("log = %s, want the route and its limit", log.String())
	}
	// A reload that sets the plugin block's max_body_bytes below it.
	target = &fakeTarget{spec: supervisor.Spec{Name: "rewarder", Mount: "/rewarder", MaxBodyBytes: 4 << 20}, manifest: manifest}
	g.Update([]Target{target})
	g.Update([]Target{target})
	if got := strings.Count(log.String(), "route body limit capped by the plugin block's max_body_bytes"); got != 1 {
		t.Fatalf("log after two updates with a plugin block's limit has %d lines on the cap, want 1:\n%s", got, log.String())
	}
	if !strings.Contains(log.String(), "declared=16777216 max_body_bytes=4194304") {
		t.Errorf("log = %s, want the declared limit and the capped one", log.String())
	}
}
