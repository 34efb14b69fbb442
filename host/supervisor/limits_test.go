package supervisor

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

func TestConfigureLimits(t *testing.T) {
	host := &pluginv1.Limits{MaxBodyBytes: 1 << 20, RequestTimeoutMs: 5000}
	tests := []struct {
		name    string
		maxBody int64
		want    *pluginv1.Limits
	}{
		{"block sets none", 0, &pluginv1.Limits{MaxBodyBytes: 1 << 20, RequestTimeoutMs: 5000}},
		{"block raises it", 8 << 20, &pluginv1.Limits{MaxBodyBytes: 8 << 20, RequestTimeoutMs: 5000}},
		{"block lowers it", 1024, &pluginv1.Limits{MaxBodyBytes: 1024, RequestTimeoutMs: 5000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := configureLimits(Spec{MaxBodyBytes: tt.maxBody}, host)
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("configureLimits(Spec{MaxBodyBytes: %d}, %v) mismatch (-want +got):\n%s", tt.maxBody, host, diff)
			}
		})
	}
	if host.GetMaxBodyBytes() != 1<<20 {
		t.Errorf("configureLimits changed the host's limits to %v", host)
	}
}
