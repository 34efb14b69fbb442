package durable_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/durable"
)

// fakeCloser is a fake durable.Closer: it counts its closes.
type fakeCloser struct{ closes atomic.Int32 }

func (c *fakeCloser) Close() error { c.closes.Add(1); return nil }
func (c *fakeCloser) Closed() bool { return c.closes.Load() > 0 }

// started returns a Lifecycle started over f's committer and a fake
// store, with the plugin's parts from p.
func started(f *fixture, p durable.Parts[int, uint64]) (*durable.Lifecycle[int, uint64], *fakeCloser) {
	db := &fakeCloser{}
	p.Store, p.Committer = db, f.c
	l := &durable.Lifecycle[int, uint64]{}
	l.Start(p)
	return l, db
}

// TestLifecycleNotConfigured: before Start, Health is not ready with the
// reason "not configured", and Drain and Close do nothing.
func TestLifecycleNotConfigured(t *testing.T) {
	var l durable.Lifecycle[int, uint64]
	want := sdk.Health{Status: sdk.StatusNotReady, Reason: "not configured"}
	if h := l.Health(t.Context()); h != want {
		t.Errorf("Health() before Start = %+v, want %+v", h, want)
	}
	if err := l.Drain(t.Context()); err != nil {
		t.Errorf("Drain() before Start = %v, want nil", err)
	}
	if err := l.Close(t.Context()); err != nil {
		t.Errorf("Close() before Start = %v, want nil", err)
	}
}

// TestLifecycleDrainThenClose: Drain runs the plugin's part before the
// committer's Close (its operation still commits), leaves the store
// open, and Close closes it exactly once, however often it is called.
func TestLifecycleDrainThenClose(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1})
	var before outcome
	l, db := started(f, durable.Parts[int, uint64]{Drain: func(context.Context) error {
		before = wait(t, f.mustSubmit(t))
		return nil
	}})
	if err := l.Drain(t.Context()); err != nil {
		t.Fatalf("Drain() = %v, want nil", err)
	}
	if before.err != nil {
		t.Errorf("an operation submitted by Parts.Drain = %v, want committed before the committer closes", before.err)
	}
	if _, _, err := f.submit(t); !errors.Is(err, durable.ErrDraining) {
		t.Errorf("Submit after Drain = %v, want ErrDraining: the committer closed", err)
	}
	if db.Closed() {
		t.Error("the store is closed after Drain, want it open until Close")
	}
	for i := range 2 {
		if err := l.Close(t.Context()); err != nil {
			t.Errorf("Close() #%d = %v, want nil", i+1, err)
		}
	}
	if n := db.closes.Load(); n != 1 {
		t.Errorf("store closed %d times, want once", n)
	}
}

// TestLifecycleCloseDrainsFirst: Close without a Drain drains first, so
// that the store never closes under a running committer.
func TestLifecycleCloseDrainsFirst(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1})
	var drains atomic.Int32
	var db *fakeCloser
	var closedAtDrain bool
	l, db := started(f, durable.Parts[int, uint64]{Drain: func(context.Context) error {
		drains.Add(1)
		closedAtDrain = db.Closed()
		return nil
	}})
	if err := l.Close(t.Context()); err != nil {
		t.Fatalf("Close() = %v, want nil", err)
	}
	if n := drains.Load(); n != 1 || closedAtDrain {
		t.Errorf("Parts.Drain ran %d times in Close (store closed then: %t), want once, before the store closes", n, closedAtDrain)
	}
	if _, _, err := f.submit(t); !errors.Is(err, durable.ErrDraining) {
		t.Errorf("Submit after Close = %v, want ErrDraining: the committer closed", err)
	}
	if n := db.closes.Load(); n != 1 {
		t.Errorf("store closed %d times, want once", n)
	}
	if err := l.Drain(t.Context()); err != nil || drains.Load() != 1 {
		t.Errorf("Drain() after Close = %v with Parts.Drain run %d times, want nil and once", err, drains.Load())
	}
}

// TestLifecycleDrainStalled: a commit stalled on the disk past the
// drain's deadline makes Drain return ErrStalled, and Close leave the
// store open and return it too; the Close of the plugin's own parts
// still runs.
func TestLifecycleDrainStalled(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1, CommitTimeout: 50 * time.Millisecond})
	hook, entered, release := stall(t, 1)
	f.app.setHook(hook)
	var closes atomic.Int32
	l, db := started(f, durable.Parts[int, uint64]{Close: func(context.Context) error { closes.Add(1); return nil }})
	ch := f.mustSubmit(t)
	<-entered
	wait(t, ch) // answered at the commit timeout; the disk still holds it

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := l.Drain(ctx); !errors.Is(err, durable.ErrStalled) {
		t.Errorf("Drain() with a stalled commit = %v, want ErrStalled", err)
	}
	if err := l.Close(ctx); !errors.Is(err, durable.ErrStalled) {
		t.Errorf("Close() with a stalled commit = %v, want ErrStalled", err)
	}
	if db.Closed() {
		t.Error("the store was closed under a stalled commit, want it left open")
	}
	if n := closes.Load(); n != 1 {
		t.Errorf("Parts.Close ran %d times, want once", n)
	}
	if h := l.Health(t.Context()); h.Status != sdk.StatusDegraded {
		t.Errorf("Health() with the store left open under a stalled commit = %+v, want the committer's degraded", h)
	}
	release()
}

// TestLifecycleDrainMargin: the committer's Close ends before the
// drain's deadline, so that an operation it aborts is answered while
// the host still waits.
func TestLifecycleDrainMargin(t *testing.T) {
	g := newGate() // never opened: the first group waits at its fault point
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1, MaxBatch: 1, Faults: g})
	l, _ := started(f, durable.Parts[int, uint64]{})
	f.mustSubmit(t)
	g.waitEntered(t)
	queued := f.mustSubmit(t)
	d := 2 * time.Second // a margin of 200ms
	deadline := time.Now().Add(d)
	ctx, cancel := context.WithDeadline(t.Context(), deadline)
	defer cancel()
	answered := make(chan time.Time, 1)
	go func() { wait(t, queued); answered <- time.Now() }()
	_ = l.Drain(ctx)
	if at := <-answered; at.After(deadline.Add(-d / 20)) {
		t.Errorf("the aborted operation was answered %v before the drain's deadline, want at least %v", deadline.Sub(at), d/20)
	}
}

// TestLifecycleHealth: the plugin's own answer wins over the committer's
// while it gives one; once the store is closed, Health is not ready.
func TestLifecycleHealth(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1})
	var mismatch atomic.Bool
	degraded := sdk.Health{Status: sdk.StatusDegraded, Reason: "writes refused: a mismatch"}
	l, _ := started(f, durable.Parts[int, uint64]{Health: func() (sdk.Health, bool) { return degraded, mismatch.Load() }})
	steps := []struct {
		name string
		do   func()
		want sdk.Health
	}{
		{"started", func() {}, sdk.Health{Status: sdk.StatusReady}},
		{"the plugin's condition", func() { mismatch.Store(true) }, degraded},
		{"the condition gone", func() { mismatch.Store(false) }, sdk.Health{Status: sdk.StatusReady}},
		{"closed", func() { _ = l.Close(t.Context()) }, sdk.Health{Status: sdk.StatusNotReady, Reason: "store closed"}},
		{"closed, with the condition", func() { mismatch.Store(true) }, sdk.Health{Status: sdk.StatusNotReady, Reason: "store closed"}},
	}
	for _, s := range steps {
		s.do()
		if h := l.Health(t.Context()); h != s.want {
			t.Errorf("Health() %s = %+v, want %+v", s.name, h, s.want)
		}
	}
}

// TestLifecycleStartTwice: a second Start is a bug, and panics.
func TestLifecycleStartTwice(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1})
	l, _ := started(f, durable.Parts[int, uint64]{})
	defer func() {
		if recover() == nil {
			t.Error("a second Start did not panic")
		}
	}()
	l.Start(durable.Parts[int, uint64]{Store: &fakeCloser{}, Committer: f.c})
}
