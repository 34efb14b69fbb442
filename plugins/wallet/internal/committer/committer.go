package committer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/sdk/backoff"
	"github.com/plughost/plughost/sdk/breaker"
	"github.com/plughost/plughost/sdk/group"
	"github.com/plughost/plughost/sdk/workq"
)

// FaultPoint is the fault point that runs right before each commit.
const FaultPoint = "ledger.commit"

// Errors Submit returns and results carry. Each is wrapped with detail.
var (
	// ErrBusy: the queue is full; nothing was queued. Retry later.
	ErrBusy = errors.New("commit queue full")
	// ErrUnavailable: the circuit breaker is open, or the operation's
	// commit failed or timed out. Nothing of the operation was applied,
	// unless the error also wraps ledger.ErrOutcomeUnknown.
	ErrUnavailable = errors.New("ledger unavailable")
	// ErrDraining: the committer is closing. From Submit nothing was
	// queued; as a result, the operation was accepted but aborted at the
	// drain deadline, and nothing of it was applied.
	ErrDraining = errors.New("committer draining")
	// ErrStalled: the operation's commit was still waiting on the disk
	// at the commit timeout (with ErrUnavailable and
	// ledger.ErrOutcomeUnknown: Options.Settled says when it is known),
	// or Close returned while a commit or checkpoint still was.
	ErrStalled = errors.New("stalled on the disk")
)

// errSlow marks a commit that succeeded after its deadline: its results
// stand, but the breaker counts it as a failure.
var errSlow = errors.New("commit outlasted its timeout")

// errAbandoned marks an attempt that stopped waiting for its ledger.Apply
// at the commit timeout: the Apply goes on, and may still commit.
var errAbandoned = errors.New("commit abandoned while the disk holds it")

// errAbandonedBefore marks an attempt that stopped waiting for its flight
// at the commit timeout before the transaction began: it will not begin,
// and nothing of it was applied.
var errAbandonedBefore = errors.New("commit abandoned before it began")

// errFlightPending marks an attempt refused because an earlier commit is still
// waiting on the disk: nothing of it was applied.
var errFlightPending = errors.New("a commit is stalled on the disk")

// Injector is a set of fault points; *sdk.Faults is one.
type Injector interface {
	Inject(ctx context.Context, point string) error
}

// Defaults of Options.
const (
	// DefaultQueueCapacity is the queue's capacity when
	// Options.QueueCapacity is zero.
	DefaultQueueCapacity = 512
	// DefaultMaxBatch is the largest group when Options.MaxBatch is zero.
	DefaultMaxBatch = 256
	// DefaultCommitTimeout bounds an attempt when Options.CommitTimeout
	// is zero.
	DefaultCommitTimeout = time.Second
	// DefaultTries is the attempts per group when Options.Tries is zero.
	DefaultTries = 3
)

// Options configure New. Ledger is required; zero values take defaults.
type Options struct {
	Ledger *ledger.Ledger
	// Faults holds the fault point FaultPoint; nil means none.
	Faults Injector
	Logger hclog.Logger
	// Registerer, if not nil, receives the committer's metrics.
	Registerer prometheus.Registerer

	// QueueCapacity bounds the operations waiting to commit; default
	// DefaultQueueCapacity.
	QueueCapacity int
	// Committers is how many goroutines commit; default 1.
	Committers int
	// MaxBatch is the most operations in one commit; default
	// DefaultMaxBatch.
	MaxBatch int
	// CommitTimeout bounds each commit attempt; default
	// DefaultCommitTimeout.
	CommitTimeout time.Duration
	// Retry spaces out the attempts of a failed commit; the zero Policy
	// means 50ms doubling to 1s with the default jitter.
	Retry backoff.Policy
	// Tries is the most attempts per group; default DefaultTries.
	Tries int
	// Breaker configures the circuit breaker (failure threshold, cool
	// down, probes in flight and probes to close); Name, IsFailure and
	// OnStateChange are set by New.
	Breaker breaker.Settings
	// Announce, if not nil, receives the receipts of each committed group,
	// groups in seq order, before the operations' callbacks run. It is
	// called while the next group waits, so it must not block.
	Announce func([]*ledger.Receipt)
	// Settled, if not nil, receives the operations of a group whose
	// callbacks got an error wrapping ErrStalled, once its outcome is
	// known: in the ledger (committed) or not (failed). It runs after
	// the group's receipts are announced, and must not block.
	Settled func([]ledger.Op)
}

// Committer commits submitted operations in groups. Create one with New
// and call Close.
type Committer struct {
	ledger   *ledger.Ledger
	faults   Injector
	logger   hclog.Logger
	maxBatch int
	timeout  time.Duration
	retry    backoff.Policy
	tries    int
	cooldown time.Duration

	q       *workq.Queue[*job]
	turn    chan struct{} // holds the token of the right to dequeue
	workers *group.Group
	n       int
	drained atomic.Int32  // workers that found the queue closed and empty
	idle    chan struct{} // closed when every worker has drained
	aborted atomic.Int64  // operations abandoned at the drain deadline

	breaker  *breaker.Breaker
	openedAt atomic.Int64 // unix nanos of the breaker's last opening
	// lastErr is the error of the last failed commit attempt, which
	// health shows as the reason the breaker is open.
	lastErr atomic.Pointer[error]

	// flight is the ledger.Apply under way, if any. One that outlasts
	// the commit timeout is abandoned by its committer and stays here
	// until it returns: no other group is applied meanwhile. last is the
	// latest flight, kept after it ends, for Close to wait on.
	flight atomic.Pointer[flight]
	last   atomic.Pointer[flight]

	announce func([]*ledger.Receipt)
	settled  func([]ledger.Op)
	m        *metrics
	once     sync.Once
	stopOnce sync.Once

	// The checkpointer goroutine runs checkpoints off the committers'
	// path: a kick after each group, a timer while the ledger is quiet.
	cpKick chan struct{}
	cpStop chan struct{} // closed by Close: the checkpointer and the prober end
	cpDone chan struct{}
	// probeDone is closed when the prober has ended; probing is set
	// while one of its probes waits or runs.
	probeDone chan struct{}
	probing   atomic.Bool

	// After a failed checkpoint, the next waits for checkpointAfter (unix
	// nanos). cpMu guards checkpointBackoff, for the moment of an update.
	checkpointAfter   atomic.Int64
	cpMu              sync.Mutex
	checkpointBackoff backoff.Backoff
}

// job is one submitted operation and the callback for its result, or
// a probe of the prober's (probe set, no callback).
type job struct {
	op    ledger.Op
	done  func(ledger.Result, error)
	probe bool
}

// New starts a committer. Its goroutines run until Close.
func New(opts Options) (*Committer, error) {
	if opts.Ledger == nil {
		return nil, errors.New("new committer: no ledger")
	}
	c := &Committer{
		ledger:    opts.Ledger,
		faults:    opts.Faults,
		logger:    opts.Logger,
		maxBatch:  opts.MaxBatch,
		timeout:   opts.CommitTimeout,
		retry:     opts.Retry,
		tries:     opts.Tries,
		n:         max(opts.Committers, 1),
		turn:      make(chan struct{}, 1),
		idle:      make(chan struct{}),
		cpKick:    make(chan struct{}, 1),
		cpStop:    make(chan struct{}),
		cpDone:    make(chan struct{}),
		probeDone: make(chan struct{}),
	}
	if c.faults == nil {
		c.faults = noFaults{}
	}
	if c.logger == nil {
		c.logger = hclog.NewNullLogger()
	}
	if c.maxBatch <= 0 {
		c.maxBatch = DefaultMaxBatch
	}
	if c.timeout <= 0 {
		c.timeout = DefaultCommitTimeout
	}
	if c.retry == (backoff.Policy{}) {
		c.retry = backoff.Policy{Initial: 50 * time.Millisecond, Max: time.Second}
	}
	if c.tries <= 0 {
		c.tries = DefaultTries
	}
	capacity := opts.QueueCapacity
	if capacity <= 0 {
		capacity = DefaultQueueCapacity
	}
	q, err := workq.New[*job](workq.Options{Name: "commit", Capacity: capacity})
	if err != nil {
		return nil, fmt.Errorf("new committer: %w", err)
	}
	c.q = q

	bs := opts.Breaker
	bs.Name = "ledger"
	bs.IsFailure = func(err error) bool {
		// Abandoning a commit at the drain deadline says nothing about
		// the disk.
		return err != nil && !errors.Is(err, context.Canceled)
	}
	bs.OnStateChange = c.breakerChanged
	c.cooldown = bs.Cooldown
	if c.cooldown <= 0 {
		c.cooldown = 5 * time.Second // breaker's default
	}
	c.breaker = breaker.New(bs)
	c.checkpointBackoff = backoff.Backoff{Policy: c.retry}

	if c.m, err = newMetrics(opts.Registerer, c); err != nil {
		return nil, fmt.Errorf("new committer: %w", err)
	}
	c.announce = opts.Announce
	c.settled = opts.Settled

	c.turn <- struct{}{}
	// The group outlives no request: only Close ends it.
	c.workers = group.New(context.Background(), group.Options{Logger: c.logger.Named("committer")})
	for i := range c.n {
		c.m.spawned.Inc()
		c.workers.Go(fmt.Sprintf("committer-%d", i), c.work)
	}
	// Not under the group: Close must be able to stop waiting for a
	// checkpoint or probe stalled on the disk.
	go c.checkpointer()
	go c.prober()
	return c, nil
}

// Submit queues op. On nil, done is called exactly once, from a committer
// goroutine, with the op's result or with an error wrapping ErrUnavailable
// or ErrDraining; it must not block. Otherwise done is never called, and
// the error wraps ErrUnavailable (breaker open), ErrBusy or ErrDraining.
func (c *Committer) Submit(op ledger.Op, done func(ledger.Result, error)) error {
	if c.breaker.State() == breaker.StateOpen {
		c.m.upstreamFail.Inc()
		return fmt.Errorf("%w: circuit breaker open after repeated commit failures", ErrUnavailable)
	}
	err := c.q.TryEnqueue(&job{op: op, done: done})
	switch {
	case errors.Is(err, workq.ErrBusy):
		c.m.dropped.Inc()
		return fmt.Errorf("%w: %d operations waiting: %w", ErrBusy, c.q.Cap(), err)
	case errors.Is(err, workq.ErrClosed):
		return fmt.Errorf("%w: %w", ErrDraining, err)
	}
	return err
}

// QueueLen returns how many operations wait to commit.
func (c *Committer) QueueLen() int { return c.q.Len() }

// LastError returns the error of the last commit attempt that failed,
// or nil if none has: what the disk said (no space left on device, say)
// while the breaker is open.
func (c *Committer) LastError() error {
	if p := c.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// BreakerState returns the circuit breaker's state.
func (c *Committer) BreakerState() breaker.State { return c.breaker.State() }

// RetryAfter says when a refused caller should try again: the rest of the
// breaker's cool-down while it is open, else one second.
func (c *Committer) RetryAfter() time.Duration {
	if c.breaker.State() != breaker.StateOpen {
		return time.Second
	}
	left := c.cooldown - time.Since(time.Unix(0, c.openedAt.Load()))
	return max(left, time.Second)
}

// Close stops intake: Submit returns ErrDraining from now on. Operations
// already queued keep committing until ctx ends; those still queued or
// being retried then are aborted (their callbacks get ErrDraining). Close
// returns when every committer goroutine has returned, and then waits,
// until ctx ends, for a flight, checkpoint or probe still under way (they
// cannot be interrupted): if one is still stalled on the disk then, the
// error wraps ErrStalled, and the ledger must not be closed under it. The
// error otherwise counts the aborted operations. Calling Close more than
// once is safe.
func (c *Committer) Close(ctx context.Context) error {
	c.once.Do(func() {
		c.q.Close()
		select {
		case <-c.idle:
		case <-ctx.Done():
		}
		_ = c.workers.Stop(context.Background())
		c.abortQueued()
	})
	if f := c.last.Load(); f != nil && !ended(ctx, f.done) {
		return fmt.Errorf("close committer: a commit %w: %d operations have waited for %v", ErrStalled, f.n, time.Since(f.start).Round(time.Millisecond))
	}
	c.stopOnce.Do(func() { close(c.cpStop) })
	if !ended(ctx, c.cpDone) {
		return fmt.Errorf("close committer: a checkpoint %w", ErrStalled)
	}
	if !ended(ctx, c.probeDone) {
		return fmt.Errorf("close committer: a probe %w", ErrStalled)
	}
	if n := c.aborted.Load(); n > 0 {
		return fmt.Errorf("close committer: %d accepted operations aborted at the deadline: %w", n, context.DeadlineExceeded)
	}
	return nil
}

// ended waits for done to be closed until ctx ends, and reports whether it
// was. A done already closed wins over a ctx already ended.
func ended(ctx context.Context, done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// Stalled returns how long the ledger.Apply under way has run, if it has
// outlasted the commit timeout and its operations were answered
// ErrOutcomeUnknown; ok is false when no commit is stalled.
func (c *Committer) Stalled() (d time.Duration, ok bool) {
	f := c.flight.Load()
	if f == nil || !f.isAbandoned() {
		return 0, false
	}
	return time.Since(f.start), true
}

// abortQueued fails what is left in the closed queue.
func (c *Committer) abortQueued() {
	for {
		// The queue is closed, so Dequeue returns at once: an item or
		// ErrClosed.
		j, err := c.q.Dequeue(context.Background())
		if err != nil {
			return
		}
		if j.probe {
			continue
		}
		c.countAborted(1)
		c.m.commit(j.op.Kind, resultAborted)
		j.done(ledger.Result{}, fmt.Errorf("%w: aborted at the drain deadline before it was committed", ErrDraining))
	}
}

func (c *Committer) countAborted(n int) {
	c.aborted.Add(int64(n))
	c.m.aborted.Add(float64(n))
}

// work is one committer goroutine. It waits for the turn, takes a group,
// commits it, passes the turn on and only then answers the group's
// callers, while the next holder of the turn commits the next group.
//
// The turn is held across ledger.Apply on purpose: the ledger applies one
// group at a time and holds its writer lock across the log's fdatasync,
// so a second committer could only wait for that lock with a group formed
// too early. Waiting for the turn instead, it forms its group after the
// commit ends, from everything that arrived during it: that is what makes
// the groups large. Every wait for the turn selects on ctx, and the turn
// is held for at most the commit timeout of an Apply (see attempt).
func (c *Committer) work(ctx context.Context) error {
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

// CheckpointSoon has the checkpointer look whether a checkpoint is due,
// for groups committed around the committer (the wallet's sweeper).
func (c *Committer) CheckpointSoon() { c.kickCheckpointer() }

// withoutProbes returns g without the prober's probes, and whether it
// held one.
func withoutProbes(g []*job) ([]*job, bool) {
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

// kickCheckpointer has the checkpointer look whether a checkpoint is due.
func (c *Committer) kickCheckpointer() {
	select {
	case c.cpKick <- struct{}{}:
	default: // a kick is pending already
	}
}

// checkpointer runs checkpoints when they are due, until Close: after a
// group (a kick), and on a timer while groups wait in the log of a quiet
// ledger, so that it does not keep them there. It runs apart from the
// committers so that a checkpoint stalled on the disk holds none of them:
// it holds the ledger's writer lock only to start the log's next
// generation, and a commit waiting for that lock is a stalled flight.
func (c *Committer) checkpointer() {
	defer close(c.cpDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Stop()
		wake := timer.C
		if c.ledger.Pending() && c.ledger.Err() == nil {
			in := c.ledger.CheckpointIn()
			if after := time.Until(time.Unix(0, c.checkpointAfter.Load())); after > in {
				in = after
			}
			timer.Reset(in)
		} else {
			wake = nil // only a kick can make one due
		}
		select {
		case <-c.cpStop:
			return
		case <-c.cpKick:
		case <-wake:
		}
		if c.checkpointDue() {
			c.checkpoint()
		}
	}
}

// probeEvery is how often the prober looks whether the breaker waits for
// a probe.
const probeEvery = 250 * time.Millisecond

// prober probes the disk while the breaker is half-open and no operation
// waits to commit, until Close. Without it, a breaker would stay half-open
// (and the wallet degraded) until a client's write came to probe: and a
// load balancer that routes writes by /readyz/wallet sends none.
func (c *Committer) prober() {
	defer close(c.probeDone)
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-c.cpStop:
			return
		case <-t.C:
		}
		if c.breaker.State() != breaker.StateHalfOpen || c.q.Len() > 0 || !c.probing.CompareAndSwap(false, true) {
			continue
		}
		// Queued like an operation, so that it commits in its turn.
		if c.q.TryEnqueue(&job{probe: true}) != nil {
			c.probing.Store(false) // full or closed: operations will probe
		}
	}
}

// probe commits a probe (ledger.Probe) through the breaker, as a half-open
// breaker's probe, under the commit timeout like a group.
func (c *Committer) probe(ctx context.Context) {
	defer c.probing.Store(false)
	err := c.breaker.Do(ctx, func(ctx context.Context) error {
		_, err := c.attempt(ctx, nil)
		return err
	})
	switch {
	case err == nil:
		c.logger.Info("ledger probe committed: the disk takes writes again")
	case errors.Is(err, breaker.ErrOpen), ctx.Err() != nil:
		// Another probe is in flight, the breaker reopened, or Close.
	default:
		c.lastErr.Store(&err)
		if errors.Is(err, errAbandoned) || errors.Is(err, errAbandonedBefore) {
			c.breaker.Trip()
		}
		c.logger.Warn("ledger probe failed; the breaker stays open", "error", err)
	}
}

// checkpointDue reports whether the ledger wants a checkpoint and the
// backoff after a failed one has passed.
func (c *Committer) checkpointDue() bool {
	return c.ledger.CheckpointDue() && time.Now().UnixNano() >= c.checkpointAfter.Load()
}

// checkpoint folds the ledger's write-ahead log into its bbolt file. A
// failure is logged and counted, and the next try waits for a backoff:
// the groups stay in the log, and the ledger refuses new ones only once
// the log is far past its size. A failure that fails the ledger
// (ledger.ErrFailed) stops checkpoints (CheckpointDue is false) until a
// commit attempt has reopened the ledger.
func (c *Committer) checkpoint() {
	start := time.Now()
	err := c.ledger.Checkpoint()
	c.m.checkpointSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		c.m.checkpoints.WithLabelValues(resultFailed).Inc()
		c.cpMu.Lock()
		d := c.checkpointBackoff.Next()
		c.cpMu.Unlock()
		c.checkpointAfter.Store(time.Now().Add(d).UnixNano())
		if !errors.Is(err, ledger.ErrClosed) {
			c.logger.Warn("ledger checkpoint failed; its groups stay in the write-ahead log", "retry_in", d, "error", err)
		}
		return
	}
	c.cpMu.Lock()
	c.checkpointBackoff.Reset()
	c.cpMu.Unlock()
	c.checkpointAfter.Store(0)
	c.m.checkpoints.WithLabelValues(resultCommitted).Inc()
}

// take waits for one operation, then takes up to maxBatch−1 more that are
// already queued. The caller holds the turn, so no other goroutine
// dequeues and Len() > 0 means Dequeue will not wait.
func (c *Committer) take(ctx context.Context) ([]*job, error) {
	first, err := c.q.Dequeue(ctx)
	if err != nil {
		return nil, err
	}
	g := make([]*job, 1, min(c.q.Len()+1, c.maxBatch))
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
func (c *Committer) commit(ctx context.Context, g []*job, pass func()) {
	c.m.inflight.Inc()
	defer c.m.inflight.Dec()
	c.m.batchSize.Observe(float64(len(g)))
	answered := false
	defer func() {
		// A panic below: answer every operation before the group logs
		// it and restarts this goroutine, so that no caller waits for
		// ever. The ledger drops the group's writes, if any.
		if !answered {
			for _, j := range g {
				c.m.commit(j.op.Kind, resultFailed)
				j.done(ledger.Result{}, fmt.Errorf("%w: internal error", ErrUnavailable))
			}
		}
	}()

	ops := make([]ledger.Op, len(g))
	for i, j := range g {
		ops[i] = j.op
	}
	results, err := c.apply(ctx, ops)
	if rs := receiptsOf(results); len(rs) > 0 && c.announce != nil {
		// Still holding the turn: groups commit and are announced one
		// at a time, so announcements are in seq order.
		c.announce(rs)
	}
	pass()
	if err != nil {
		label := resultFailed
		if errors.Is(err, ErrDraining) {
			label = resultAborted
			c.countAborted(len(g))
		}
		answered = true
		for _, j := range g {
			c.m.commit(j.op.Kind, label)
			j.done(ledger.Result{}, err)
		}
		return
	}
	answered = true
	for i, j := range g {
		c.m.commit(j.op.Kind, resultLabel(results[i]))
		j.done(results[i], nil)
	}
}

func receiptsOf(results []ledger.Result) []*ledger.Receipt {
	var rs []*ledger.Receipt
	for _, r := range results {
		if r.Receipt != nil {
			rs = append(rs, r.Receipt)
		}
	}
	return rs
}

// apply commits ops, retrying transient failures.
func (c *Committer) apply(ctx context.Context, ops []ledger.Op) ([]ledger.Result, error) {
	b := backoff.Backoff{Policy: c.retry}
	for attempt := 1; ; attempt++ {
		var results []ledger.Result
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
		case errors.Is(err, ledger.ErrClosed), errors.Is(err, ledger.ErrFailed), attempt >= c.tries:
			return nil, fmt.Errorf("%w: commit failed after %d attempts: %w", ErrUnavailable, attempt, err)
		}
		c.m.retries.Inc()
		d := b.Next()
		c.logger.Warn("ledger commit failed; retrying", "attempt", attempt, "delay", d, "error", err)
		if err := backoff.Sleep(ctx, d); err != nil {
			c.m.canceled.Inc()
			return nil, fmt.Errorf("%w: commit abandoned: %w", ErrDraining, err)
		}
	}
}

// attempt runs the fault point and one ledger transaction under the
// commit timeout. The transaction cannot be interrupted once it has begun,
// so it runs on a goroutine of its own (a flight), with the recovery of a
// failed ledger before it. A flight that returns late but within the wait
// keeps its results and counts as a timeout. One still running when the
// timeout ends is abandoned and trips the breaker: if its transaction had
// begun, its operations are answered ErrStalled and ErrOutcomeUnknown and
// it lands by itself later (see land); if not (a stalled recovery), it
// will not begin, and they are answered that nothing was applied. Only the
// timeout abandons a flight: Close cancelling ctx at the drain deadline
// waits for it, as for a healthy commit, up to the same timeout.
func (c *Committer) attempt(ctx context.Context, ops []ledger.Op) ([]ledger.Result, error) {
	start := time.Now()
	deadline := start.Add(c.timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	defer func() { c.m.seconds.Observe(time.Since(start).Seconds()) }()
	if f := c.flight.Load(); f != nil {
		// Only an abandoned flight outlives its attempt.
		return nil, fmt.Errorf("%w: %d operations have waited for it for %v", errFlightPending, f.n, time.Since(f.start).Round(time.Millisecond))
	}
	if err := c.faults.Inject(ctx, FaultPoint); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			c.m.timeouts.Inc()
		}
		return nil, fmt.Errorf("fault point %s: %w", FaultPoint, err)
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
				return nil, fmt.Errorf("%w: recovering the ledger did not finish within %v; the commit will not begin", errAbandonedBefore, c.timeout)
			}
			return nil, fmt.Errorf("%w: %w: %w: the commit of %d operations did not finish within %v, and may still complete once the disk answers", errAbandoned, ErrStalled, ledger.ErrOutcomeUnknown, len(ops), c.timeout)
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
	if ops != nil && !wrote(results) {
		// Replays and unrecorded refusals only: the group wrote nothing,
		// so its success says nothing of the disk, and must not close a
		// half-open breaker.
		return results, breaker.ErrNotCounted
	}
	return results, nil
}

// flight is one group commit on a goroutine of its own.
type flight struct {
	start time.Time
	ops   []ledger.Op
	n     int           // operations
	done  chan struct{} // closed once it has returned and, if abandoned, landed

	mu        sync.Mutex
	begun     bool // ledger.Apply was called
	returned  bool // results, err and panicked are set
	abandoned bool // the attempt stopped waiting; the flight lands itself
	results   []ledger.Result
	err       error
	panicked  any
}

// fly starts the flight of ops: the recovery of a failed ledger, then
// ledger.Apply(ctx, ops), which checks ctx only before it begins. The
// caller has checked that no other flight is under way.
func (c *Committer) fly(ctx context.Context, ops []ledger.Op) *flight {
	f := &flight{start: time.Now(), ops: ops, n: len(ops), done: make(chan struct{})}
	c.flight.Store(f)
	c.last.Store(f)
	go func() {
		defer close(f.done)
		defer c.flight.Store(nil)
		var (
			results  []ledger.Result
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

// run is the work of flight f.
// A flight without operations is a probe (see prober): ledger.Probe.
func (c *Committer) run(ctx context.Context, f *flight) ([]ledger.Result, error) {
	if err := c.ledger.Err(); errors.Is(err, ledger.ErrFailed) {
		// A disk error failed the ledger (a full disk, say): this
		// attempt, which the breaker lets through only as a probe once
		// it has opened, tries to recover it from its files.
		if err := c.ledger.Reopen(); err != nil {
			return nil, err
		}
		c.logger.Info("ledger recovered from its write-ahead log after a disk error", "seq", c.ledger.Seq())
	}
	if !f.begin() {
		return nil, errAbandonedBefore
	}
	if f.ops == nil {
		return nil, c.ledger.Probe()
	}
	return c.ledger.Apply(ctx, f.ops)
}

// begin marks f's transaction begun unless f was abandoned first, and
// reports whether it was.
func (f *flight) begin() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.abandoned {
		return false
	}
	f.begun = true
	return true
}

// abandon marks f abandoned unless it has returned already. It reports
// whether it did, and whether f's transaction had begun.
func (f *flight) abandon() (abandoned, begun bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.returned {
		f.abandoned = true
	}
	return f.abandoned, f.begun
}

func (f *flight) isAbandoned() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.abandoned
}

// land finishes an abandoned flight once its transaction has returned:
// its receipts are announced (before any later group's, which waits for
// the flight to end), Settled gets its operations, and its outcome is
// logged. Its callers were answered ErrStalled already; a retry with the
// same key learns the outcome from the ledger.
func (c *Committer) land(f *flight) {
	defer func() {
		// Nobody waits on this goroutine to recover a panic for it.
		if r := recover(); r != nil {
			c.logger.Error("landing a stalled ledger commit panicked", "panic", r, "stack", string(debug.Stack()))
		}
		c.kickCheckpointer()
	}()
	took := time.Since(f.start).Round(time.Millisecond)
	switch {
	case f.panicked != nil:
		c.logger.Error("a stalled ledger commit panicked", "operations", f.n, "after", took, "panic", f.panicked)
	case f.err != nil:
		err := f.err
		c.lastErr.Store(&err)
		c.logger.Warn("a stalled ledger commit failed; nothing of it was applied", "operations", f.n, "after", took, "error", f.err)
	default:
		if rs := receiptsOf(f.results); len(rs) > 0 && c.announce != nil {
			c.announce(rs)
		}
		c.logger.Warn("a stalled ledger commit completed after its callers were answered 503 outcome_unknown; retries with their keys replay the outcome",
			"operations", f.n, "after", took, "seq", c.ledger.Seq())
	}
	if c.settled != nil && len(f.ops) > 0 {
		c.settled(f.ops)
	}
}

// wrote reports whether a committed group wrote anything: a receipt or a
// new idempotency record.
func wrote(results []ledger.Result) bool {
	for _, r := range results {
		if r.Receipt != nil || (r.Record != nil && !r.Replayed) {
			return true
		}
	}
	return false
}

func (c *Committer) breakerChanged(_ string, from, to breaker.State) {
	if to == breaker.StateOpen {
		c.openedAt.Store(time.Now().UnixNano())
		c.logger.Warn("ledger circuit breaker opened: POSTs answer 503 until it closes", "from", from.String(), "cool_down", c.cooldown)
		return
	}
	c.logger.Info("ledger circuit breaker changed", "from", from.String(), "to", to.String())
}

// noFaults is the fault set of a committer given none.
type noFaults struct{}

func (noFaults) Inject(context.Context, string) error { return nil }
