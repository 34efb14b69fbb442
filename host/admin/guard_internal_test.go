package admin

import (
	"net/http"
	"testing"
)

// TestClientOf: the wrong-token allowance is kept per IPv4 address and
// per IPv6 /64, as max_conns_per_ip counts clients, so that a client
// with a /64 does not get an allowance per address in it.
func TestClientOf(t *testing.T) {
	tests := []struct{ remote, want string }{
		{"192.0.2.7:4711", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:4711", "192.0.2.7"},
		{"[2001:db8:1:2:aaaa::1]:4711", "2001:db8:1:2::"},
		{"[2001:db8:1:2:bbbb::9]:80", "2001:db8:1:2::"},
		{"[2001:db8:1:3::1]:4711", "2001:db8:1:3::"},
		{"[fe80::1%eth0]:4711", "fe80::"},
		{"[::1]:4711", "::"},
		{"pipe", "pipe"},
	}
	for _, tt := range tests {
		if got := clientOf(&http.Request{RemoteAddr: tt.remote}); got != tt.want {
			t.Errorf("clientOf(%q) = %q, want %q", tt.remote, got, tt.want)
		}
	}
}
