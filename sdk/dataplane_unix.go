//go:build unix

package sdk

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"

	"github.com/plughost/plughost/sdk/wire"
)

// maxDataPlaneFDs bounds what the variable may claim; the host passes at
// most 16.
const maxDataPlaneFDs = 1024

// takeDataPlane takes over the descriptors the host's variable names:
// each must be a stream socket, and becomes a connection with a descriptor
// of its own, close-on-exec; the inherited one is closed. The variable is
// removed. If any of them is not a stream socket or cannot be taken over,
// it returns none, and closes those that are stream sockets: they are the
// host's, and useless to anyone else. A descriptor that is not a stream
// socket is left alone.
func takeDataPlane() ([]*wire.Conn, error) {
	v, ok := os.LookupEnv(wire.DataPlaneEnv)
	if !ok {
		return nil, nil
	}
	_ = os.Unsetenv(wire.DataPlaneEnv)
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > maxDataPlaneFDs {
		return nil, fmt.Errorf("malformed %s=%q", wire.DataPlaneEnv, v)
	}
	var sockets []int
	var bad error
	for i := range n {
		fd := wire.DataPlaneFirstFD + i
		typ, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TYPE)
		if err != nil || typ != syscall.SOCK_STREAM {
			if bad == nil {
				bad = fmt.Errorf("descriptor %d of the %d in %s is not a stream socket", fd, n, wire.DataPlaneEnv)
			}
			continue
		}
		syscall.CloseOnExec(fd)
		sockets = append(sockets, fd)
	}
	if bad != nil {
		for _, fd := range sockets {
			_ = syscall.Close(fd)
		}
		return nil, bad
	}
	conns := make([]*wire.Conn, 0, n)
	for i, fd := range sockets {
		f := os.NewFile(uintptr(fd), "data-plane-"+strconv.Itoa(i))
		c, err := net.FileConn(f) // a duplicate, close-on-exec
		_ = f.Close()
		if err != nil {
			for _, c := range conns {
				_ = c.Close()
			}
			for _, fd := range sockets[i+1:] {
				_ = syscall.Close(fd)
			}
			return nil, fmt.Errorf("data-plane descriptor %d: %w", fd, err)
		}
		conns = append(conns, wire.NewConn(c))
	}
	return conns, nil
}
