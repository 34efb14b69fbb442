package durable

import (
	"context"
	"errors"
	"time"

	"github.com/plughost/plughost/sdk/breaker"
)

// kickCheckpointer has the checkpointer look whether a checkpoint is due.
func (c *Committer[Op, Res]) kickCheckpointer() {
	select {
	case c.cpKick <- struct{}{}:
	default: // a kick is pending already
	}
}

// checkpointer runs checkpoints when they are due, until ctx ends: after
// a group (a kick), and on a timer while groups wait in the log of a
// quiet store, so that it does not keep them there. It runs apart from
// the committers so that a checkpoint stalled on the disk holds none of
// them: a commit waiting for the store behind it is a stalled flight.
func (c *Committer[Op, Res]) checkpointer(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Stop()
		wake := timer.C
		if c.store.Pending() && c.store.Err() == nil {
			in := c.store.CheckpointIn()
			if after := time.Until(time.Unix(0, c.checkpointAfter.Load())); after > in {
				in = after
			}
			timer.Reset(in)
		} else {
			wake = nil // only a kick can make one due
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.cpKick:
		case <-wake:
		}
		if c.checkpointDue() {
			c.checkpoint()
		}
	}
}

// checkpointDue reports whether the store wants a checkpoint and the
// backoff after a failed one has passed.
func (c *Committer[Op, Res]) checkpointDue() bool {
	return c.store.CheckpointDue() && time.Now().UnixNano() >= c.checkpointAfter.Load()
}

// checkpoint folds the store's log into its main file. A failure is
// logged and counted, and the next try waits for a backoff: the groups
// stay in the log. A failure that fails the store (ErrFailed) stops
// checkpoints (CheckpointDue is false) until a commit attempt has
// reopened it.
func (c *Committer[Op, Res]) checkpoint() {
	start := time.Now()
	err := c.store.Checkpoint()
	c.m.checkpointSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		c.m.checkpoints.WithLabelValues(ResultFailed).Inc()
		c.cpMu.Lock()
		d := c.checkpointBackoff.Next()
		c.cpMu.Unlock()
		c.checkpointAfter.Store(time.Now().Add(d).UnixNano())
		if !errors.Is(err, ErrClosed) {
			c.logger.Warn(c.svc+" checkpoint failed; its groups stay in the write-ahead log", "retry_in", d, "error", err)
		}
		return
	}
	c.cpMu.Lock()
	c.checkpointBackoff.Reset()
	c.cpMu.Unlock()
	c.checkpointAfter.Store(0)
	c.m.checkpoints.WithLabelValues(ResultCommitted).Inc()
}

// probeEvery is how often the prober looks whether the breaker waits for
// a probe.
const probeEvery = 250 * time.Millisecond

// prober probes the disk while the breaker is half-open and no operation
// waits to commit, until ctx ends. Without it, a breaker would stay
// half-open (and the plugin degraded) until a client's write came to
// probe: and a load balancer that routes writes by readiness sends none.
func (c *Committer[Op, Res]) prober(ctx context.Context) error {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if c.breaker.State() != breaker.StateHalfOpen || c.q.Len() > 0 || !c.probing.CompareAndSwap(false, true) {
			continue
		}
		// Queued like an operation, so that it commits in its turn.
		if c.q.TryEnqueue(&job[Op, Res]{probe: true}) != nil {
			c.probing.Store(false) // full or closed: operations will probe
		}
	}
}

// probe commits a probe (Options.Probe) through the breaker, as a
// half-open breaker's probe, under the commit timeout like a group.
func (c *Committer[Op, Res]) probe(ctx context.Context) {
	defer c.probing.Store(false)
	err := c.breaker.Do(ctx, func(ctx context.Context) error {
		_, err := c.attempt(ctx, nil)
		return err
	})
	switch {
	case err == nil:
		c.logger.Info(c.svc + " probe committed: the disk takes writes again")
	case errors.Is(err, breaker.ErrOpen), ctx.Err() != nil:
		// Another probe is in flight, the breaker reopened, or Close.
	default:
		c.lastErr.Store(&err)
		if errors.Is(err, errAbandoned) || errors.Is(err, errAbandonedBefore) {
			c.breaker.Trip()
		}
		c.logger.Warn(c.svc+" probe failed; the breaker stays open", "error", err)
	}
}

// scrubber calls Options.Scrub every scrubEvery until ctx ends, and
// counts the passes it completes. Damage (ErrCorrupt) makes the store
// refuse writes, is logged once and ends the scrubber: there is nothing
// more for it to find that matters before an operator acts.
func (c *Committer[Op, Res]) scrubber(ctx context.Context) error {
	t := time.NewTicker(c.scrubEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pass, err := c.scrubFn()
		if pass {
			c.m.scrubPasses.Inc()
		}
		if err != nil {
			if errors.Is(err, ErrCorrupt) {
				c.logger.Error("scrubber found damaged storage; writes are refused", "error", err)
				return nil
			}
			if ctx.Err() == nil && !errors.Is(err, ErrClosed) {
				c.logger.Warn("scrubbing the "+c.svc+" failed", "error", err)
			}
		}
	}
}
