// Package wallettest holds test doubles shared by the wallet's tests: a
// fault gate that holds commits until a test opens it, and a settable
// clock. Only tests import it.
package wallettest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Gate is a stand-in for sdk.Faults that holds every call at a fault point
// until Open, and tells the test when a call arrives. sdk.Faults can only
// delay for a fixed time; tests that must know a commit is held use this.
type Gate struct {
	entered chan struct{} // receives once per held call
	open    chan struct{}
	once    sync.Once
}

// NewGate returns a closed gate.
func NewGate() *Gate {
	return &Gate{entered: make(chan struct{}, 1024), open: make(chan struct{})}
}

// Inject holds the call until the gate opens or ctx ends.
func (g *Gate) Inject(ctx context.Context, _ string) error {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Open lets every held and future call through.
func (g *Gate) Open() { g.once.Do(func() { close(g.open) }) }

// WaitEntered waits until a call is held at the gate.
func (g *Gate) WaitEntered(t testing.TB) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no commit reached the fault point within 10s")
	}
}

// Clock is a settable time source for expiry tests.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock reading now.
func NewClock(now time.Time) *Clock { return &Clock{now: now} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Add moves the clock forward by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
