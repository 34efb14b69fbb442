//go:build !linux

package h1

import "net"

// closedByPeer cannot tell without waiting here: a request that meets a
// closed connection fails, and is sent again only if retryable allows.
func closedByPeer(net.Conn) bool { return false }
