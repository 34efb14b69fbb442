package durable

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/plughost/plughost/sdk/backoff"
	"github.com/plughost/plughost/sdk/breaker"
	"github.com/plughost/plughost/sdk/workq"
)

// errSlow marks a commit that succeeded after its deadline: its results
// stand, but the breaker counts it as a failure.
var errSlow = errors.New("commit outlasted its timeout")

// errAbandoned marks an attempt that stopped waiting for its Apply at the
// commit timeout: the Apply goes on, and may still commit.
var errAbandoned = errors.New("commit abandoned while the disk holds it")

// errAbandonedBefore marks an attempt that stopped waiting for its flight
// at the commit timeout before the Apply began: it will not begin, and
// nothing of it was applied.
var errAbandonedBefore = errors.New("commit abandoned before it began")

// errFlightPending marks an attempt refused because an earlier commit is
// still waiting on the disk: nothing of it was applied.
var errFlightPending = errors.New("a commit is stalled on the disk")

// work is one committer goroutine. It waits for the turn, takes a group,
// commits it, passes the turn on and only then answers the group's
// callers, while the next holder of the turn commits the next group.
//
// The turn is held across Apply on purpose: the store applies one group
// at a time and holds its writer lock across the fdatasync, so a second
// committer could only wait for that lock with a group formed too early.
// Waiting for the turn instead, it forms its group after the commit ends,
// from everything that arrived during it: that is what makes the groups
// large. Every wait for the turn selects on ctx, and the turn is held for
// at most the commit timeout of an Apply (see attempt).
func (c *Committer[Op, Res]) work(ctx context.Context) error {
	for {
		select {
		case <-c.turn:
		case <-ctx.Done():
			return nil // Close cancelled us; it aborts what is left
		}
		// The token goes back exactly once, never blocking: it was ours.
		held := true
		pass := func() {
			if held {
				held = false
				c.turn <- struct{}{}
			}
		}
		g, err := c.take(ctx)
		if err != nil {
			pass()
			if errors.Is(err, workq.ErrClosed) && c.drained.Add(1) == int32(c.n) {
				close(c.idle)
			}
			return nil
		}
		g, probe := withoutProbes(g)
		func() {
			defer pass() // also on panic, before the group restarts us
			switch {
			case len(g) > 0:
				c.commit(ctx, g, pass) // its operations probe, if need be
				if probe {
					c.probing.Store(false)
				}
			case probe:
				c.probe(ctx)
			}
		}()
		c.kickCheckpointer()
	}
}

// withoutProbes returns g without the prober's probes, and whether it
// held one.
func withoutProbes[Op, Res any](g []*job[Op, Res]) ([]*job[Op, Res], bool) {
	probe := false
	out := g[:0]
	for _, j := range g {
		if j.probe {
			probe = true
			continue
		}
		out = append(out, j)
	}
	return out, probe
}

// take waits for one operation, then takes up to maxBatch−1 more that are
// already queued. The caller holds the turn, so no other goroutine
// dequeues and Len() > 0 means Dequeue will not wait.
func (c *Committer[Op, Res]) take(ctx context.Context) ([]*job[Op, Res], error) {
	first, err := c.q.Dequeue(ctx)
	if err != nil {
		return nil, err
	}
	g := make([]*job[Op, Res], 1, min(c.q.Len()+1, c.maxBatch))
	g[0] = first
	for len(g) < c.maxBatch && c.q.Len() > 0 {
		j, err := c.q.Dequeue(ctx)
		if err != nil {
			break // commit what we hold; the next take sees the error
		}
		g = append(g, j)
	}
	return g, nil
}

// commit commits one group, calls pass once the transaction is over, and
// answers each of the group's operations.
func (c *Committer[Op, Res]) commit(ctx context.Context, g []*job[Op, Res], pass func()) {
	c.m.inflight.Inc()
	defer c.m.inflight.Dec()
	c.m.batchSize.Observe(float64(len(g)))
	var zero Res
	answered := false
	defer func() {
		// A panic below: answer every operation before the group logs
		// it and restarts this goroutine, so that no caller waits for
		// ever. The store drops the group's writes, if any.
		if !answered {
			for _, j := range g {
				c.m.commit(c.kind(j.op), ResultFailed)
				j.done(zero, fmt.Errorf("%w: internal error", ErrUnavailable))
			}
		}
	}()

	ops := make([]Op, len(g))
	for i, j := range g {
		ops[i] = j.op
	}
	results, err := c.apply(ctx, ops)
	if results != nil && c.announce != nil {
		// Still holding the turn: groups commit and are announced one
		// at a time, so announcements are in commit order.
		c.announce(results)
	}
	pass()
	if err != nil {
		label := ResultFailed
		if errors.Is(err, ErrDraining) {
			label = ResultAborted
			c.countAborted(len(g))
		}
		answered = true
		for _, j := range g {
			c.m.commit(c.kind(j.op), label)
			j.done(zero, err)
		}
		return
	}
	answered = true
	for i, j := range g {
		c.m.commit(c.kind(j.op), c.result(results[i]))
		j.done(results[i], nil)
	}
}

// apply commits ops, retrying transient failures.
func (c *Committer[Op, Res]) apply(ctx context.Context, ops []Op) ([]Res, error) {
	b := backoff.Backoff{Policy: c.retry}
	for attempt := 1; ; attempt++ {
		var results []Res
		err := c.breaker.Do(ctx, func(ctx context.Context) error {
			var err error
			results, err = c.attempt(ctx, ops)
			return err
		})
		if results != nil {
			return results, nil // committed, perhaps slowly
		}
		if err != nil && !errors.Is(err, breaker.ErrOpen) && ctx.Err() == nil {
			c.lastErr.Store(&err)
		}
		switch {
		case errors.Is(err, errAbandoned), errors.Is(err, errAbandonedBefore):
			// The disk has stopped answering: stop sending it work. An
			// abandoned transaction goes on, so its error cannot say
			// "nothing applied".
			c.breaker.Trip()
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		case ctx.Err() != nil:
			c.m.canceled.Inc()
			return nil, fmt.Errorf("%w: commit abandoned: %w", ErrDraining, ctx.Err())
		case errors.Is(err, breaker.ErrOpen):
			c.m.upstreamFail.Inc()
			return nil, fmt.Errorf("%w: circuit breaker open after repeated commit failures", ErrUnavailable)
		case errors.Is(err, errFlightPending):
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		case errors.Is(err, context.DeadlineExceeded):
			// Retrying would keep every queued caller waiting another
			// timeout; fail now and let the breaker count it.
			return nil, fmt.Errorf("%w: commit timed out after %v", ErrUnavailable, c.timeout)
		case errors.Is(err, ErrClosed), errors.Is(err, ErrFailed), attempt >= c.tries:
			return nil, fmt.Errorf("%w: commit failed after %d attempts: %w", ErrUnavailable, attempt, err)
		}
		c.m.retries.Inc()
		d := b.Next()
		c.logger.Warn(c.svc+" commit failed; retrying", "attempt", attempt, "delay", d, "error", err)
		if err := backoff.Sleep(ctx, d); err != nil {
			c.m.canceled.Inc()
			return nil, fmt.Errorf("%w: commit abandoned: %w", ErrDraining, err)
		}
	}
}

// attempt runs the fault point and one Apply under the commit timeout.
// The Apply cannot be interrupted once it has begun, so it runs on a
// goroutine of its own (a flight), with the recovery of a failed store
// before it. A flight that returns late but within the wait keeps its
// results and counts as a timeout. One still running when the timeout
// ends is abandoned and trips the breaker: if its Apply had begun, its
// operations are answered ErrStalled and ErrOutcomeUnknown and it lands
// by itself later (see land); if not (a stalled recovery), it will not
// begin, and they are answered that nothing was applied. Only the timeout
// abandons a flight: Close cancelling ctx at the drain deadline waits for
// it, as for a healthy commit, up to the same timeout. A nil ops is a
// probe (Options.Probe).
func (c *Committer[Op, Res]) attempt(ctx context.Context, ops []Op) ([]Res, error) {
	start := time.Now()
	deadline := start.Add(c.timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	defer func() { c.m.seconds.Observe(time.Since(start).Seconds()) }()
	if f := c.flight.Load(); f != nil {
		// Only an abandoned flight outlives its attempt.
		return nil, fmt.Errorf("%w: %d operations have waited for it for %v", errFlightPending, f.n, time.Since(f.start).Round(time.Millisecond))
	}
	if err := c.faults.Inject(ctx, c.point); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			c.m.timeouts.Inc()
		}
		return nil, fmt.Errorf("fault point %s: %w", c.point, err)
	}
	if err := ctx.Err(); err != nil {
		c.m.timeouts.Inc()
		return nil, err // the fault point used the whole timeout
	}
	f := c.fly(ctx, ops)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-f.done:
	case <-timer.C:
		if abandoned, begun := f.abandon(); abandoned {
			c.m.timeouts.Inc()
			if !begun {
				return nil, fmt.Errorf("%w: recovering the %s did not finish within %v; the commit will not begin", errAbandonedBefore, c.svc, c.timeout)
			}
			return nil, fmt.Errorf("%w: %w: %w: the commit of %d operations did not finish within %v, and may still complete once the disk answers", errAbandoned, ErrStalled, ErrOutcomeUnknown, len(ops), c.timeout)
		}
		<-f.done // it returned as the wait ended
	}
	if f.panicked != nil {
		panic(f.panicked)
	}
	results, err := f.results, f.err
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			c.m.timeouts.Inc()
		}
		return nil, err
	}
	if d := time.Since(start); d > c.timeout {
		c.m.timeouts.Inc()
		return results, fmt.Errorf("%w: took %v", errSlow, d)
	}
	if ops != nil && c.wrote != nil && !c.wrote(results) {
		// The group wrote nothing, so its success says nothing of the
		// disk, and must not close a half-open breaker.
		return results, breaker.ErrNotCounted
	}
	return results, nil
}

// flight is one group commit on a goroutine of its own.
type flight[Op, Res any] struct {
	start time.Time
	ops   []Op
	n     int           // operations
	done  chan struct{} // closed once it has returned and, if abandoned, landed

	mu        sync.Mutex
	begun     bool // Apply was called
	returned  bool // results, err and panicked are set
	abandoned bool // the attempt stopped waiting; the flight lands itself
	results   []Res
	err       error
	panicked  any
}

// fly starts the flight of ops: the recovery of a failed store, then
// Apply(ctx, ops), which checks ctx only before it begins. The caller has
// checked that no other flight is under way.
func (c *Committer[Op, Res]) fly(ctx context.Context, ops []Op) *flight[Op, Res] {
	f := &flight[Op, Res]{start: time.Now(), ops: ops, n: len(ops), done: make(chan struct{})}
	c.flight.Store(f)
	c.last.Store(f)
	// Not under a group: the flight must outlive an attempt that
	// abandons it. Its owner is the committer: no other group is applied
	// until it ends, and Close waits for it (f.done).
	go func() {
		defer close(f.done)
		defer c.flight.Store(nil)
		var (
			results  []Res
			err      error
			panicked any
		)
		func() {
			// A panic is the attempt's to raise, on the committer's
			// goroutine, as if the commit had run there.
			defer func() { panicked = recover() }()
			results, err = c.run(ctx, f)
		}()
		f.mu.Lock()
		f.results, f.err, f.panicked, f.returned = results, err, panicked, true
		landing := f.abandoned && f.begun
		f.mu.Unlock()
		if landing {
			c.land(f)
		}
	}()
	return f
}

// run is the work of flight f. A flight without operations is a probe.
func (c *Committer[Op, Res]) run(ctx context.Context, f *flight[Op, Res]) ([]Res, error) {
	if err := c.store.Err(); errors.Is(err, ErrFailed) {
		// A disk error failed the store (a full disk, say): this
		// attempt, which the breaker lets through only as a probe once
		// it has opened, tries to recover it from its files.
		if err := c.store.Reopen(); err != nil {
			return nil, err
		}
		c.logger.Info(c.svc + " recovered after a disk error")
	}
	if !f.begin() {
		return nil, errAbandonedBefore
	}
	if f.ops == nil {
		return nil, c.probeFn()
	}
	return c.applyFn(ctx, f.ops)
}

// begin marks f's Apply begun unless f was abandoned first, and reports
// whether it was.
func (f *flight[Op, Res]) begin() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.abandoned {
		return false
	}
	f.begun = true
	return true
}

// abandon marks f abandoned unless it has returned already. It reports
// whether it did, and whether f's Apply had begun.
func (f *flight[Op, Res]) abandon() (abandoned, begun bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.returned {
		f.abandoned = true
	}
	return f.abandoned, f.begun
}

func (f *flight[Op, Res]) isAbandoned() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.abandoned
}

// land finishes an abandoned flight once its Apply has returned: its
// results are announced (before any later group's, which waits for the
// flight to end), Settled gets its operations, and its outcome is logged.
// Its callers were answered ErrStalled already.
func (c *Committer[Op, Res]) land(f *flight[Op, Res]) {
	defer func() {
		// Nobody waits on this goroutine to recover a panic for it.
		if r := recover(); r != nil {
			c.logger.Error("landing a stalled "+c.svc+" commit panicked", "panic", r, "stack", string(debug.Stack()))
		}
		c.kickCheckpointer()
	}()
	took := time.Since(f.start).Round(time.Millisecond)
	switch {
	case f.panicked != nil:
		c.logger.Error("a stalled "+c.svc+" commit panicked", "operations", f.n, "after", took, "panic", f.panicked)
	case f.err != nil:
		err := f.err
		c.lastErr.Store(&err)
		c.logger.Warn("a stalled "+c.svc+" commit failed; nothing of it was applied", "operations", f.n, "after", took, "error", f.err)
	default:
		if f.ops != nil && c.announce != nil {
			c.announce(f.results)
		}
		c.logger.Warn("a stalled "+c.svc+" commit completed after its callers were answered 503 outcome_unknown; retries with their keys replay the outcome",
			"operations", f.n, "after", took)
	}
	if c.settled != nil && len(f.ops) > 0 {
		c.settled(f.ops)
	}
}
