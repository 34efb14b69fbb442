// Package wiretest holds test helpers for the data plane, shared by the
// tests of package sdk and package wire. It must not be imported outside
// tests.
package wiretest

import (
	"net"
	"testing"

	"github.com/plughost/plughost/sdk/wire"
)

// SocketPair returns the two ends of a data-plane socket pair
// (wire.SocketPair), closed at cleanup.
func SocketPair(tb testing.TB) (host, plugin *net.UnixConn) {
	tb.Helper()
	h, f, err := wire.SocketPair()
	if err != nil {
		tb.Fatal(err)
	}
	p, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		_ = h.Close()
		tb.Fatalf("net.FileConn: %v", err)
	}
	tb.Cleanup(func() {
		_ = h.Close()
		_ = p.Close()
	})
	return h.(*net.UnixConn), p.(*net.UnixConn)
}
