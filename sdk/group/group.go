package group

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/sdk/backoff"
)

// ErrPanic is wrapped, together with the panic value, in the reason passed
// to Options.OnRestart when a worker panicked.
var ErrPanic = errors.New("group: worker panicked")

// Options configures a Group. The zero Options is usable.
type Options struct {
	// Logger receives a record of each failure and restart; nil discards them.
	Logger hclog.Logger
	// Backoff spaces out restarts of a failing worker; the zero Policy means
	// backoff's defaults. A worker's attempt count starts again once one of
	// its runs has lasted longer than Backoff.Max (30s when zero).
	Backoff backoff.Policy
	// OnRestart, if not nil, is called on the worker's goroutine just before
	// a worker restarts, after the backoff delay, with the reason it stopped:
	// the error it returned or an error wrapping ErrPanic. It must not block
	// for long, since it delays the restart and Stop.
	OnRestart func(name string, reason error)
}

// Group runs and restarts named workers until Stop. It is safe for
// concurrent use. Create one with New and call Stop to release it.
type Group struct {
	// ctx is the lifetime of every worker, not of a request: the group owns
	// it so that it can hand it to workers it restarts long after New.
	ctx    context.Context
	cancel context.CancelFunc

	logger    hclog.Logger
	policy    backoff.Policy
	onRestart func(name string, reason error)

	mu      sync.Mutex // guards stopped and done, and orders wg.Add before wg.Wait
	stopped bool
	wg      sync.WaitGroup
	// done is closed once every worker has returned after Stop; the
	// goroutine that closes it ends with the last worker.
	done chan struct{}
}

// New returns a Group whose workers get a context derived from ctx. Workers
// stop when ctx is done or Stop is called, whichever comes first; Stop must
// still be called to wait for them.
func New(ctx context.Context, opts Options) *Group {
	ctx, cancel := context.WithCancel(ctx)
	logger := opts.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Group{
		ctx:       ctx,
		cancel:    cancel,
		logger:    logger,
		policy:    opts.Backoff,
		onRestart: opts.OnRestart,
	}
}

// Go starts a worker named name that runs fn on its own goroutine. If fn
// panics or returns an error while the group's context is live, fn is run
// again after a backoff delay; if fn returns nil, or the context is done,
// the worker is finished. Calling Go after Stop does nothing.
func (g *Group) Go(name string, fn func(ctx context.Context) error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	g.wg.Go(func() { g.supervise(name, fn) })
}

// Stop cancels the context of every worker and waits until all of them have
// returned, including those waiting out a backoff delay, or until ctx ends.
// It returns nil as soon as the slowest worker returns from its fn. If ctx
// ends first, it returns an error wrapping ctx.Err(): the workers are
// cancelled all the same and are still owned by the group, and a later Stop
// waits for them again. Calling Stop more than once, or concurrently, is
// safe.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	g.stopped = true
	if g.done == nil {
		g.done = make(chan struct{})
		// Go adds no worker after stopped is set, so Wait cannot race an
		// Add; this goroutine ends with the last worker.
		go func() {
			g.wg.Wait()
			close(g.done)
		}()
	}
	done := g.done
	g.mu.Unlock()
	g.cancel()
	select {
	case <-done:
		return nil
	default:
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop group: workers still running: %w", ctx.Err())
	}
}

// supervise runs fn until it is finished, restarting it after failures.
func (g *Group) supervise(name string, fn func(ctx context.Context) error) {
	logger := g.logger.With("worker", name)
	b := backoff.Backoff{Policy: g.policy}
	resetAfter := g.policy.Max
	if resetAfter <= 0 {
		resetAfter = backoff.DefaultMax
	}
	for {
		start := time.Now()
		panicked, err := g.run(logger, fn)
		if err == nil || g.ctx.Err() != nil {
			return
		}
		if time.Since(start) > resetAfter {
			b.Reset()
		}
		attempt, delay := b.Attempt(), b.Next()
		if !panicked { // a panic was logged with its stack already
			logger.Warn("worker failed", "error", err)
		}
		logger.Info("restarting worker", "attempt", attempt, "delay", delay)
		if backoff.Sleep(g.ctx, delay) != nil {
			return
		}
		if g.onRestart != nil {
			g.onRestart(name, err)
		}
	}
}

// run calls fn once. It turns a panic into an error that wraps ErrPanic and
// logs it with the stack, which is only at hand here.
func (g *Group) run(logger hclog.Logger, fn func(ctx context.Context) error) (panicked bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			panicked = true
			logger.Error("worker panicked", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			if e, ok := r.(error); ok {
				err = fmt.Errorf("recovered %w: %w", e, ErrPanic)
			} else {
				err = fmt.Errorf("recovered %v: %w", r, ErrPanic)
			}
		}
	}()
	return false, fn(g.ctx)
}
