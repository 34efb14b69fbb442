//go:build unix

package wire

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

// SocketPair returns the two ends of a connected pair of Unix stream
// sockets, both close-on-exec: the host's as a connection, the plugin's as
// a file to pass to the process (exec.Cmd.ExtraFiles), which the caller
// closes once the process has started.
func SocketPair() (net.Conn, *os.File, error) {
	// Under ForkLock, so that no process started meanwhile inherits them.
	syscall.ForkLock.RLock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, fmt.Errorf("socket pair: %w", err)
	}
	hf := os.NewFile(uintptr(fds[0]), "data-plane-host")
	c, err := net.FileConn(hf) // a duplicate, set non-blocking
	_ = hf.Close()
	if err != nil {
		_ = syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("socket pair: %w", err)
	}
	return c, os.NewFile(uintptr(fds[1]), "data-plane-plugin"), nil
}
