// Package clientkey says which client an address belongs to, for the
// limits the host keeps per client: the ingress's connection caps and the
// admin listener's allowance of wrong tokens.
package clientkey

import "net/netip"

// Of returns the key under which a per-client limit counts ip: an IPv4
// address (an IPv4-mapped IPv6 one included) as it is, and an IPv6
// address's /64. One subscriber usually gets a whole /64 (RFC 6177), and
// could otherwise take each limit once per address in it.
func Of(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.WithZone("").Prefix(64)
		return p.Addr()
	}
	return ip
}
