package wire_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/sdk/route"
	"github.com/plughost/plughost/sdk/wire"
)

func TestRoutesRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   []route.Route
	}{
		{"none", []route.Route{}},
		{"method and pattern", []route.Route{{Method: "GET", Pattern: "/items/{id}"}}},
		{"any method, streaming, timeout", []route.Route{{Pattern: "/events", Streaming: true, Timeout: 30 * time.Second}}},
		{"no body", []route.Route{{Method: "POST", Pattern: "/reset", NoBody: true}}},
		{"body limit", []route.Route{{Method: "POST", Pattern: "/upload", MaxBody: 8 << 20}}},
		{"several", []route.Route{{Method: "GET", Pattern: "/{$}"}, {Method: "POST", Pattern: "/x", Timeout: 1500 * time.Millisecond}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := wire.RoutesFromProto(wire.RoutesToProto(tt.in))
			if diff := cmp.Diff(tt.in, got); diff != "" {
				t.Errorf("RoutesFromProto(RoutesToProto(%v)) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}
