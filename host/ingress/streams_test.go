package ingress_test

import (
	"testing"
	"time"

	"github.com/plughost/plughost/host/ingress"
)

// TestJittered checks that a stream's lifetime moves by at most 10% of
// stream_max_lifetime either way, and over the whole of that range.
func TestJittered(t *testing.T) {
	const d = 30 * time.Minute
	for _, tt := range []struct {
		u    float64
		want time.Duration
	}{
		{0, 27 * time.Minute},
		{0.5, d},
		{0.999999, 33 * time.Minute},
	} {
		if got := ingress.Jittered(d, tt.u); got < tt.want-time.Second || got > tt.want+time.Second {
			t.Errorf("Jittered(%v, %v) = %v, want %v", d, tt.u, got, tt.want)
		}
	}
}
