package durable

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/sdk"
)

// DrainMargin is the most of the drain's time that Lifecycle.Drain keeps
// back from the committer's Close, to answer the requests whose
// operations it aborts: the committer gets the drain's deadline less a
// tenth of the time left, and less at most DrainMargin.
const DrainMargin = 250 * time.Millisecond

// Closer is the store a Lifecycle closes: *store.DB, or a plugin's type
// around one.
type Closer interface {
	// Close closes the store. It waits for a write under way.
	Close() error
	// Closed reports whether Close has been called.
	Closed() bool
}

// Parts are what a plugin's Configure hook hands Lifecycle.Start once
// everything it started runs: the store, the committer over it, and the
// plugin's own part of each hook. Store and Committer are required.
type Parts[Op, Res any] struct {
	// Store is closed by Lifecycle.Close, after Committer.
	Store Closer
	// Committer is closed by Lifecycle.Drain; its Health is the plugin's.
	Committer *Committer[Op, Res]
	// Drain, if set, runs first in Lifecycle.Drain: it stops the plugin's
	// own goroutines that submit operations, so that the committer's
	// Close finds no more coming. Its error does not stop the drain.
	Drain func(ctx context.Context) error
	// Close, if set, runs first in Lifecycle.Close, after the requests
	// in flight have finished: it closes what they used besides the
	// store. Its error does not keep the store open.
	Close func(ctx context.Context) error
	// Health, if set, is asked after the not-configured and closed-store
	// answers and before the committer's: the plugin's own conditions,
	// from memory. When ok is true, h is the answer.
	Health func() (h sdk.Health, ok bool)
	// Logger receives the warning of a store left open; nil means the
	// committer's logger.
	Logger hclog.Logger
}

// Lifecycle supplies a stateful plugin's Drain, Close and Health hooks:
// its methods are the sdk.Plugin fields of the same names. The zero value
// is a plugin not yet configured, whose Drain and Close do nothing and
// whose Health answers not ready; the Configure hook calls Start once the
// store and the committer run. A Lifecycle must not be copied after
// first use.
//
// Drain closes the committer with the drain's deadline, less a margin
// (DrainMargin); Close closes the store, unless a commit is still
// stalled on the disk, since closing it would wait for that write. Each
// runs once; later calls return the first call's error.
type Lifecycle[Op, Res any] struct {
	parts   atomic.Pointer[Parts[Op, Res]]
	drained once
	closed  once
	stalled error // the committer's Close error, when it wraps ErrStalled
}

// once runs a hook's steps once; every call gets their error.
type once struct {
	once sync.Once
	err  error
}

func (o *once) do(fn func() error) error {
	o.once.Do(func() { o.err = fn() })
	return o.err
}

// Start hands l the running store and committer. Call it once, at the
// end of a Configure hook that succeeded: until then the hooks answer as
// for a plugin not yet configured. It panics if Store or Committer is
// nil, or if l was started before.
func (l *Lifecycle[Op, Res]) Start(p Parts[Op, Res]) {
	if p.Store == nil || p.Committer == nil {
		panic("durable: Lifecycle.Start without a Store or a Committer")
	}
	if p.Logger == nil {
		p.Logger = p.Committer.logger
	}
	if !l.parts.CompareAndSwap(nil, &p) {
		panic("durable: Lifecycle started twice")
	}
}

// Drain is the plugin's Drain hook. Its steps: Parts.Drain, then the
// committer's Close with ctx's deadline less the margin, which lets the
// queued operations commit and aborts the rest. The error joins theirs;
// one wrapping ErrStalled means a commit still waits for the disk, and
// Close will leave the store open. Before Start it does nothing.
func (l *Lifecycle[Op, Res]) Drain(ctx context.Context) error {
	if p := l.parts.Load(); p != nil {
		return l.drained.do(func() error { return l.drain(ctx, p) })
	}
	return nil
}

func (l *Lifecycle[Op, Res]) drain(ctx context.Context, p *Parts[Op, Res]) error {
	var errs []error
	if p.Drain != nil {
		if err := p.Drain(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	cctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		cctx, cancel = context.WithDeadline(ctx, dl.Add(-min(time.Until(dl)/10, DrainMargin)))
		defer cancel()
	}
	if err := p.Committer.Close(cctx); err != nil {
		errs = append(errs, err)
		if errors.Is(err, ErrStalled) {
			l.stalled = err
		}
	}
	return errors.Join(errs...)
}

// Close is the plugin's Close hook, which the SDK calls once the
// requests in flight have finished. Its steps: Drain, if it has not run;
// Parts.Close; then the store's Close, unless a commit is still stalled
// on the disk: then the store stays open (the next start replays its
// log), a warning is logged, and the error wraps ErrStalled. Before
// Start it does nothing.
func (l *Lifecycle[Op, Res]) Close(ctx context.Context) error {
	if p := l.parts.Load(); p != nil {
		return l.closed.do(func() error { return l.close(ctx, p) })
	}
	return nil
}

func (l *Lifecycle[Op, Res]) close(ctx context.Context, p *Parts[Op, Res]) error {
	_ = l.Drain(ctx) // its error was the Drain hook's to report
	var errs []error
	if p.Close != nil {
		if err := p.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if l.stalled != nil {
		p.Logger.Warn("leaving the store open: a commit is still stalled on the disk")
		return errors.Join(append(errs, l.stalled)...)
	}
	if err := p.Store.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Health is the plugin's Health hook, from memory: not ready before
// Start ("not configured") and once the store is closed; else
// Parts.Health's answer, if it gives one; else the committer's Health.
func (l *Lifecycle[Op, Res]) Health(context.Context) sdk.Health {
	p := l.parts.Load()
	switch {
	case p == nil:
		return sdk.Health{Status: sdk.StatusNotReady, Reason: "not configured"}
	case p.Store.Closed():
		return sdk.Health{Status: sdk.StatusNotReady, Reason: p.Committer.svc + " closed"}
	}
	if p.Health != nil {
		if h, ok := p.Health(); ok {
			return h
		}
	}
	return p.Committer.Health()
}
