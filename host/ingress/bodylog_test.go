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
	steps := []struct {
		name      string
		pluginMax int64  // the plugin block's max_body_bytes
		message   string // logged once however many updates follow
		fields    string
	}{
		{"no plugin block limit", 0, "route has its own body limit", `route="POST /v1/epochs/{id}/compute" max_body_bytes=16777216`},
		{"a reload sets one below the route's", 4 << 20, "route body limit capped by the plugin block's max_body_bytes", "declared=16777216 max_body_bytes=4194304"},
	}
	for _, st := range steps {
		target := &fakeTarget{spec: supervisor.Spec{Name: "rewarder", Mount: "/rewarder", MaxBodyBytes: st.pluginMax}, manifest: manifest}
		g.Update([]Target{target})
		g.Update([]Target{target})
		if got := strings.Count(log.String(), st.message); got != 1 {
			t.Errorf("%s: log after two updates has %d lines %q, want 1:\n%s", st.name, got, st.message, log.String())
		}
		if !strings.Contains(log.String(), st.fields) {
			t.Errorf("%s: log = %s, want %s", st.name, log.String(), st.fields)
		}
	}
}
