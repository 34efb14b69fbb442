// Package wiretest holds test helpers for the data plane, shared by the
// tests of the SDK's packages. It must not be imported outside
// tests.
package wiretest

import (
	"bytes"
	"net"
	"net/http"
	"sync"
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

// Gate holds handlers until it is opened. It opens itself at cleanup.
type Gate struct {
	ch   chan struct{}
	once sync.Once
}

// NewGate returns a closed gate, opened at the latest at tb's cleanup.
func NewGate(tb testing.TB) *Gate {
	tb.Helper()
	g := &Gate{ch: make(chan struct{})}
	tb.Cleanup(g.Open)
	return g
}

// Open lets every waiter through, now and later.
func (g *Gate) Open() { g.once.Do(func() { close(g.ch) }) }

// Wait blocks until g opens or r's context ends.
func (g *Gate) Wait(r *http.Request) {
	select {
	case <-g.ch:
	case <-r.Context().Done():
	}
}

// SyncBuffer is a bytes.Buffer a logger may write while the test reads it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
