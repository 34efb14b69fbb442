//go:build !unix

package wire

import (
	"errors"
	"net"
	"os"
)

// SocketPair fails where there are no Unix socket pairs; the host then
// uses Exchange streams.
func SocketPair() (net.Conn, *os.File, error) {
	return nil, nil, errors.New("socket pairs need a Unix system")
}
