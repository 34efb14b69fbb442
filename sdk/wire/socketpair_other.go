//go:build !unix

package wire

import (
	"errors"
	"net"
	"os"
)

// SocketPair fails where there are no Unix socket pairs: the data plane,
// and so the host, runs only on Unix.
func SocketPair() (net.Conn, *os.File, error) {
	return nil, nil, errors.New("plughost runs plugins only on Unix: the data plane needs Unix socket pairs")
}
