package catalog

import (
	"os"

	"github.com/plughost/plughost/sdk/wire"
)

// socketPairs returns n data-plane connections: the host's ends, and the
// plugin's as files to pass to the process. The caller closes the files
// once the process has started.
func socketPairs(n int) (host []*wire.Conn, plugin []*os.File, err error) {
	for range n {
		c, f, err := wire.SocketPair()
		if err != nil {
			closeAll(host, plugin)
			return nil, nil, err
		}
		host = append(host, wire.NewConn(c))
		plugin = append(plugin, f)
	}
	return host, plugin, nil
}
