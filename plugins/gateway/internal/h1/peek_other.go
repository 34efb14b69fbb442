//go:build !linux

package h1

import "net"

// closedByPeer cannot tell without waiting here: a request that meets a
// closed connection fails, and is sent again only if retryable allows;
// one that meets bytes sent while the connection was idle fails too.
func closedByPeer(net.Conn) bool { return false }
