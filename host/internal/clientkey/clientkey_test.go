package clientkey

import (
	"net/netip"
	"testing"
)

func TestOf(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"192.0.2.7", "192.0.2.7"},
		{"::ffff:192.0.2.7", "192.0.2.7"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::"},
		{"2001:db8:1:2:ffff::1", "2001:db8:1:2::"},
		{"fe80::1%eth0", "fe80::"},
	} {
		if got := Of(netip.MustParseAddr(tt.in)); got != netip.MustParseAddr(tt.want) {
			t.Errorf("Of(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}
