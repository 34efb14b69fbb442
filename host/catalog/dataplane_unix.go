//go:build unix

package catalog

import (
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/plughost/plughost/sdk/wire"
)

// socketPairs returns n connected pairs of Unix stream sockets: the host's
// ends as connections, the plugin's as files to pass to the process. The
// caller closes the files once the process has started.
func socketPairs(n int) (host []*wire.Conn, plugin []*os.File, err error) {
	defer func() {
		if err != nil {
			closeAll(host, plugin)
			host, plugin = nil, nil
		}
	}()
	for i := range n {
		syscall.ForkLock.RLock()
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
		if err == nil {
			syscall.CloseOnExec(fds[0])
			syscall.CloseOnExec(fds[1])
		}
		syscall.ForkLock.RUnlock()
		if err != nil {
			return host, plugin, fmt.Errorf("data plane socket pair: %w", err)
		}
		hf := os.NewFile(uintptr(fds[0]), fmt.Sprintf("data-plane-%d", i))
		plugin = append(plugin, os.NewFile(uintptr(fds[1]), fmt.Sprintf("data-plane-%d-plugin", i)))
		c, err := net.FileConn(hf) // a duplicate, set non-blocking
		_ = hf.Close()
		if err != nil {
			return host, plugin, fmt.Errorf("data plane connection: %w", err)
		}
		host = append(host, wire.NewConn(c))
	}
	return host, plugin, nil
}
