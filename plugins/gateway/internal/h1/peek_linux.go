package h1

import (
	"errors"
	"net"
	"syscall"
)

// closedByPeer reports whether the upstream closed nc, or sent what no
// request asked for, while it sat idle in the pool: a read that does not
// wait finds an end of stream, an error, or bytes.
func closedByPeer(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var b [1]byte
	gone := false
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		gone = n > 0 || (err == nil && n == 0) || (err != nil && !errors.Is(err, syscall.EAGAIN))
		return true // never wait for the descriptor to be readable
	})
	return gone || err != nil
}
