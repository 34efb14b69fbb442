package durable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/backoff"
	"github.com/plughost/plughost/sdk/breaker"
	"github.com/plughost/plughost/sdk/group"
	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/workq"
)

// Errors Submit returns and results carry. Each is wrapped with detail.
var (
	// ErrBusy: the intake queue is full; nothing was queued. Retry later
	// (HTTP 429).
	ErrBusy = errors.New("commit queue full")
	// ErrUnavailable: the circuit breaker is open, or the operation's
	// commit failed or timed out. Nothing of the operation was applied,
	// unless the error also wraps ErrOutcomeUnknown.
	ErrUnavailable = errors.New("store unavailable")
	// ErrDraining: the committer is closing. From Submit nothing was
	// queued; as a result, the operation was accepted but aborted at the
	// drain deadline, and nothing of it was applied.
	ErrDraining = errors.New("committer draining")
	// ErrStalled: the operation's commit was still waiting on the disk at
	// the commit timeout (with ErrUnavailable and ErrOutcomeUnknown:
	// Options.Settled says when it is known), or Close returned while a
	// commit, checkpoint, probe or scrub still was.
	ErrStalled = errors.New("stalled on the disk")
)

// The store's errors the committer acts on. A Store other than sdk/store
// wraps these same values, so that the committer knows what it met.
var (
	// ErrFailed, wrapped by Store.Err, says a disk error failed the
	// store and Store.Reopen may recover it: the committer reopens it
	// before the next commit attempt, which the breaker lets through
	// only as a probe once it has opened.
	ErrFailed = store.ErrFailed
	// ErrClosed, wrapped by an Apply error, says the store is closed: the
	// commit is not retried.
	ErrClosed = store.ErrClosed
	// ErrCorrupt, wrapped by Store.Err or a scrub's error, says stored
	// data is damaged: writes are refused until an operator acts, and the
	// scrubber stops.
	ErrCorrupt = store.ErrCorrupt
	// ErrOutcomeUnknown is wrapped by the result error of an operation
	// whose commit may or may not have been applied: the store said so,
	// or the commit was still stalled on the disk at the commit timeout.
	ErrOutcomeUnknown = store.ErrOutcomeUnknown
)

// Store is the storage behind a committer: its health and its
// maintenance. *store.DB satisfies it, and so does a plugin's own type
// around one; a backend other than sdk/store implements it to stand
// behind the same committer. Its methods are called from the committer's
// goroutines, concurrently with Options.Apply, and must be safe for that.
type Store interface {
	// Err returns the error that makes the store refuse every write, or
	// nil. One wrapping ErrFailed is recovered by Reopen; one wrapping
	// ErrCorrupt is not.
	Err() error
	// Reopen recovers a store that ErrFailed failed, from what it has on
	// disk. It is called only while Err wraps ErrFailed.
	Reopen() error
	// Pending reports whether committed groups wait for a checkpoint.
	Pending() bool
	// CheckpointDue reports whether Checkpoint should run now.
	CheckpointDue() bool
	// CheckpointIn returns how long until CheckpointDue reports true by
	// age alone.
	CheckpointIn() time.Duration
	// Checkpoint folds the committed groups into the store's main file.
	// It runs on the checkpointer, concurrently with commits.
	Checkpoint() error
}

// CorruptionCounter is the optional part of a Store that counts the
// damaged data it met while running; *store.DB is one. The committer of
// a Store that has it, with a Registerer, exports the count as
// store_corruption_total (StoreCorruptionName).
type CorruptionCounter interface {
	// Corruptions returns how many times the store met corrupt data
	// while running: reads and scrubs that found a damaged value or page.
	Corruptions() uint64
}

// Injector is a set of fault points; *sdk.Faults is one. An Injector
// with a method Declare(...string), as *sdk.Faults has, is told the
// commit's fault point when the Committer is built.
type Injector interface {
	Inject(ctx context.Context, point string) error
}

// Defaults of Options.
const (
	// DefaultQueueCapacity is the intake queue's capacity when
	// Options.QueueCapacity is zero.
	DefaultQueueCapacity = 512
	// DefaultMaxBatch is the largest group when Options.MaxBatch is zero.
	DefaultMaxBatch = 256
	// DefaultCommitTimeout bounds an attempt when Options.CommitTimeout
	// is zero.
	DefaultCommitTimeout = time.Second
	// DefaultTries is the attempts per group when Options.Tries is zero.
	DefaultTries = 3
	// DefaultFaultPoint is the fault point when Options.FaultPoint is "".
	DefaultFaultPoint = "store.commit"
	// DefaultScrubEvery spaces the scrubs when Options.ScrubEvery is zero.
	DefaultScrubEvery = time.Second
)

// Names name a committer's metrics, by the plugin guide's rule: the
// families the design names (queue_depth, io_timeouts_total, …) keep
// their names and take these as label values; the committer's own
// families start with Prefix.
type Names struct {
	// Prefix starts the committer's own families: the plugin's kind, such
	// as "wallet" for wallet_commits_total. Required with a Registerer.
	Prefix string
	// Service is the store's name: the svc label of
	// backoff_retries_total and upstream_fail_total, the breaker's name
	// and the first word of log messages; op labels are Service+"_commit".
	// Default "store".
	Service string
	// Queue is the intake queue's queue label; default "commit".
	Queue string
}

// Options configure New. Store and Apply are required; zero values take
// defaults.
type Options[Op, Res any] struct {
	// Store is the storage behind the committer.
	Store Store
	// Apply commits ops as one group, durably, and returns one result per
	// op, in order; a refusal of one op is its result, not an error. A
	// non-nil error means nothing was committed (unless it wraps
	// ErrOutcomeUnknown), and the same ops may be applied again. It
	// checks ctx before it begins and cannot be interrupted after: it
	// runs on a goroutine of its own, which the committer abandons at the
	// commit timeout. Groups are applied one at a time.
	Apply func(ctx context.Context, ops []Op) ([]Res, error)
	// Probe, if not nil, writes something small durably that no reader
	// sees, to learn whether the disk takes writes again: while the
	// breaker is half-open and nothing is queued, the prober commits one
	// every 250ms, so that the breaker closes without a client's write.
	Probe func() error
	// Wrote, if not nil, reports whether a committed group wrote
	// anything. A group that wrote nothing (only replays, say) says
	// nothing of the disk, and the breaker does not count it. Nil counts
	// every group.
	Wrote func([]Res) bool
	// Announce, if not nil, receives the results of each committed group,
	// groups in commit order, before the operations' callbacks run. It is
	// called while the next group waits, so it must not block.
	Announce func([]Res)
	// Settled, if not nil, receives the operations of a group whose
	// callbacks got an error wrapping ErrStalled, once its outcome is
	// known: committed (announced first) or not. It must not block.
	Settled func([]Op)
	// Kind and Result, if not nil, label an operation and its committed
	// result in <prefix>_commits_total{kind,result}; Kinds and Results
	// are their closed sets, whose series start at zero. The committer
	// adds the results "failed" and "aborted". Defaults: kind "op",
	// result "committed".
	Kind    func(Op) string
	Result  func(Res) string
	Kinds   []string
	Results []string

	// Scrub, if not nil, verifies one more slice of the stored data; the
	// scrubber calls it every ScrubEvery and counts the passes it reports
	// complete (pass true). An error wrapping ErrCorrupt stops it.
	Scrub      func() (pass bool, err error)
	ScrubEvery time.Duration

	// Faults holds FaultPoint, which New declares to it when it can
	// (see Injector); nil means none.
	Faults Injector
	// FaultPoint runs right before each commit attempt, under its
	// deadline; default DefaultFaultPoint.
	FaultPoint string
	// Logger receives the committer's records; nil discards them.
	Logger hclog.Logger
	// Registerer, if not nil, receives the committer's metrics, named by
	// Metrics.
	Registerer prometheus.Registerer
	Metrics    Names

	// QueueCapacity bounds the operations waiting to commit; default
	// DefaultQueueCapacity.
	QueueCapacity int
	// Committers is how many goroutines take turns committing; default 1.
	Committers int
	// MaxBatch is the most operations in one group; default
	// DefaultMaxBatch.
	MaxBatch int
	// CommitTimeout bounds each commit attempt; default
	// DefaultCommitTimeout.
	CommitTimeout time.Duration
	// Retry spaces out the attempts of a failed commit and of failed
	// checkpoints; the zero Policy means 50ms doubling to 1s.
	Retry backoff.Policy
	// Tries is the most attempts per group; default DefaultTries.
	Tries int
	// Breaker configures the circuit breaker; Name, IsFailure and
	// OnStateChange are set by New.
	Breaker breaker.Settings
}

// Committer commits submitted operations in groups. Create one with New
// and call Close.
type Committer[Op, Res any] struct {
	store      Store
	applyFn    func(context.Context, []Op) ([]Res, error)
	probeFn    func() error
	wrote      func([]Res) bool
	announce   func([]Res)
	settled    func([]Op)
	kind       func(Op) string
	result     func(Res) string
	scrubFn    func() (bool, error)
	scrubEvery time.Duration
	faults     Injector
	point      string
	svc        string
	logger     hclog.Logger
	maxBatch   int
	timeout    time.Duration
	retry      backoff.Policy
	tries      int
	cooldown   time.Duration

	q       *workq.Queue[*job[Op, Res]]
	turn    chan struct{} // holds the token of the right to dequeue
	workers *group.Group  // the committers
	maint   *group.Group  // the checkpointer, the prober and the scrubber
	n       int
	drained atomic.Int32  // workers that found the queue closed and empty
	idle    chan struct{} // closed when every worker has drained
	aborted atomic.Int64  // operations abandoned at the drain deadline

	breaker  *breaker.Breaker
	openedAt atomic.Int64 // unix nanos of the breaker's last opening
	// lastErr is the error of the last failed commit attempt, which
	// Health shows as the reason the breaker is open.
	lastErr atomic.Pointer[error]

	// flight is the Apply under way, if any. One that outlasts the commit
	// timeout is abandoned by its committer and stays here until it
	// returns: no other group is applied meanwhile. last is the latest
	// flight, kept after it ends, for Close to wait on.
	flight atomic.Pointer[flight[Op, Res]]
	last   atomic.Pointer[flight[Op, Res]]

	m    *metrics
	once sync.Once

	cpKick  chan struct{} // a committer has the checkpointer look
	probing atomic.Bool   // a probe of the prober's waits or runs

	// After a failed checkpoint, the next waits for checkpointAfter (unix
	// nanos). cpMu guards checkpointBackoff, for the moment of an update.
	checkpointAfter   atomic.Int64
	cpMu              sync.Mutex
	checkpointBackoff backoff.Backoff
}

// job is one submitted operation and the callback for its result, or a
// probe of the prober's (probe set, no callback).
type job[Op, Res any] struct {
	op    Op
	done  func(Res, error)
	probe bool
}

// New starts a committer: its committers, and its checkpointer, prober
// (with Options.Probe) and scrubber (with Options.Scrub) under a group
// of their own. They run until Close.
func New[Op, Res any](opts Options[Op, Res]) (*Committer[Op, Res], error) {
	if opts.Store == nil || opts.Apply == nil {
		return nil, errors.New("new committer: Store and Apply are required")
	}
	c := &Committer[Op, Res]{
		store:      opts.Store,
		applyFn:    opts.Apply,
		probeFn:    opts.Probe,
		wrote:      opts.Wrote,
		announce:   opts.Announce,
		settled:    opts.Settled,
		kind:       opts.Kind,
		result:     opts.Result,
		scrubFn:    opts.Scrub,
		scrubEvery: opts.ScrubEvery,
		faults:     opts.Faults,
		point:      opts.FaultPoint,
		svc:        opts.Metrics.Service,
		logger:     opts.Logger,
		maxBatch:   opts.MaxBatch,
		timeout:    opts.CommitTimeout,
		retry:      opts.Retry,
		tries:      opts.Tries,
		n:          max(opts.Committers, 1),
		turn:       make(chan struct{}, 1),
		idle:       make(chan struct{}),
		cpKick:     make(chan struct{}, 1),
	}
	if c.faults == nil {
		c.faults = noFaults{}
	}
	if c.point == "" {
		c.point = DefaultFaultPoint
	}
	if d, ok := c.faults.(interface{ Declare(...string) }); ok {
		d.Declare(c.point) // so that an operator may set a fault there
	}
	if c.svc == "" {
		c.svc = "store"
	}
	if c.logger == nil {
		c.logger = hclog.NewNullLogger()
	}
	if c.kind == nil {
		c.kind = func(Op) string { return "op" }
	}
	if c.result == nil {
		c.result = func(Res) string { return ResultCommitted }
	}
	if c.scrubEvery <= 0 {
		c.scrubEvery = DefaultScrubEvery
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
	queueName := opts.Metrics.Queue
	if queueName == "" {
		queueName = "commit"
	}
	if opts.Registerer != nil && opts.Metrics.Prefix == "" {
		return nil, errors.New("new committer: a Registerer needs Metrics.Prefix, the plugin's kind")
	}
	bs := opts.Breaker
	bs.Name = c.svc
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

	var err error
	if c.m, err = newMetrics(opts, c); err != nil {
		return nil, fmt.Errorf("new committer: %w", err)
	}
	q, err := workq.New[*job[Op, Res]](workq.Options{Name: queueName, Capacity: capacity, Registerer: opts.Registerer})
	if err != nil {
		c.m.unregister()
		return nil, fmt.Errorf("new committer: %w", err)
	}
	c.q = q

	c.turn <- struct{}{}
	// The groups outlive every request: only Close ends them.
	c.workers = group.New(context.Background(), group.Options{Logger: c.logger.Named("committer")})
	for i := range c.n {
		c.m.spawned.Inc()
		c.workers.Go(fmt.Sprintf("committer-%d", i), c.work)
	}
	c.maint = group.New(context.Background(), group.Options{Logger: c.logger.Named("maintenance"), Backoff: c.retry})
	c.maint.Go("checkpointer", c.checkpointer)
	if c.probeFn != nil {
		c.maint.Go("prober", c.prober)
	}
	if c.scrubFn != nil {
		c.maint.Go("scrubber", c.scrubber)
	}
	return c, nil
}

// Submit queues op. On nil, done is called exactly once, from a committer
// goroutine, with the op's result or with an error wrapping
// ErrUnavailable or ErrDraining; it must not block. Otherwise done is
// never called, and the error wraps ErrUnavailable (breaker open),
// ErrBusy or ErrDraining. Submit never waits.
func (c *Committer[Op, Res]) Submit(op Op, done func(Res, error)) error {
	if c.breaker.State() == breaker.StateOpen {
		c.m.upstreamFail.Inc()
		return fmt.Errorf("%w: circuit breaker open after repeated commit failures", ErrUnavailable)
	}
	err := c.q.TryEnqueue(&job[Op, Res]{op: op, done: done})
	switch {
	case errors.Is(err, workq.ErrBusy):
		return fmt.Errorf("%w: %d operations waiting: %w", ErrBusy, c.q.Cap(), err)
	case errors.Is(err, workq.ErrClosed):
		return fmt.Errorf("%w: %w", ErrDraining, err)
	}
	return err
}

// QueueLen returns how many operations wait to commit.
func (c *Committer[Op, Res]) QueueLen() int { return c.q.Len() }

// LastError returns the error of the last commit attempt that failed, or
// nil if none has: what the disk said (no space left on device, say)
// while the breaker is open.
func (c *Committer[Op, Res]) LastError() error {
	if p := c.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// BreakerState returns the circuit breaker's state.
func (c *Committer[Op, Res]) BreakerState() breaker.State { return c.breaker.State() }

// RetryAfter says when a refused caller should try again: the rest of the
// breaker's cool-down while it is open, else one second.
func (c *Committer[Op, Res]) RetryAfter() time.Duration {
	if c.breaker.State() != breaker.StateOpen {
		return time.Second
	}
	left := c.cooldown - time.Since(time.Unix(0, c.openedAt.Load()))
	return max(left, time.Second)
}

// Stalled returns how long the Apply under way has run, if it has
// outlasted the commit timeout and its operations were answered
// ErrOutcomeUnknown; ok is false when no commit is stalled.
func (c *Committer[Op, Res]) Stalled() (d time.Duration, ok bool) {
	f := c.flight.Load()
	if f == nil || !f.isAbandoned() {
		return 0, false
	}
	return time.Since(f.start), true
}

// CheckpointSoon has the checkpointer look whether a checkpoint is due,
// for groups committed around the committer.
func (c *Committer[Op, Res]) CheckpointSoon() { c.kickCheckpointer() }

// Health says whether the committer takes writes, from memory: degraded,
// with the reason, while the store refuses writes (Store.Err), while a
// commit is stalled and while the breaker is open or half-open; not ready
// while Store.Err wraps ErrClosed; else ready. *store.DB's Err does not
// report its closing, so a plugin's Health hook answers not ready for a
// closed store (DB.Closed) itself, and otherwise can return Health as it
// is.
func (c *Committer[Op, Res]) Health() sdk.Health {
	if err := c.store.Err(); err != nil {
		// Reads are still served from what was committed: degraded, so
		// that a load balancer can take writes away.
		switch {
		case errors.Is(err, ErrClosed):
			return sdk.Health{Status: sdk.StatusNotReady, Reason: c.svc + " closed"}
		case errors.Is(err, ErrCorrupt):
			return sdk.Health{Status: sdk.StatusDegraded, Reason: "writes refused: " + err.Error()}
		}
		return sdk.Health{Status: sdk.StatusDegraded, Reason: "writes refused after a disk error, recovering as the circuit breaker probes: " + err.Error()}
	}
	if d, ok := c.Stalled(); ok {
		return sdk.Health{Status: sdk.StatusDegraded, Reason: fmt.Sprintf("%s commit stalled: the disk has not finished a write for %v; writes answer 503, reads are served", c.svc, d.Round(time.Millisecond))}
	}
	switch c.breaker.State() {
	case breaker.StateOpen:
		return sdk.Health{Status: sdk.StatusDegraded, Reason: c.svc + " commits are failing: circuit breaker open, writes answer 503, reads are served" + c.lastErrorSuffix()}
	case breaker.StateHalfOpen:
		return sdk.Health{Status: sdk.StatusDegraded, Reason: c.svc + " circuit breaker half-open: probing commits after failures" + c.lastErrorSuffix()}
	}
	return sdk.Health{Status: sdk.StatusReady}
}

// lastErrorSuffix is ": " and the last failed commit's error, or "": the
// operator reads in the health reason what the disk said.
func (c *Committer[Op, Res]) lastErrorSuffix() string {
	if err := c.LastError(); err != nil {
		return ": " + err.Error()
	}
	return ""
}

// Close stops intake: Submit returns ErrDraining from now on. Its steps,
// each bounded by ctx:
//
//  1. Operations already queued keep committing until the queue is empty
//     or ctx ends.
//  2. The committers are cancelled: a backoff or fault-point wait ends.
//     A commit attempt already running is waited for up to the commit
//     timeout, like any attempt. Operations still queued or being
//     retried are aborted (their callbacks get ErrDraining).
//  3. Close waits until ctx ends for a commit abandoned on a stalled disk
//     to land, and for the checkpointer, prober and scrubber to return.
//
// If one is still stalled on the disk when ctx ends, the error wraps
// ErrStalled, and the store must not be closed under it. The error
// otherwise counts the aborted operations. Calling Close more than once
// is safe; a later call waits again for what is still stalled.
func (c *Committer[Op, Res]) Close(ctx context.Context) error {
	c.once.Do(func() {
		c.q.Close()
		select {
		case <-c.idle:
		case <-ctx.Done():
		}
		// A committer waits for its attempt at most the commit timeout
		// once cancelled; the margin covers its callbacks.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout+time.Second)
		defer cancel()
		_ = c.workers.Stop(wctx) // checked below, on every call
		c.abortQueued()
	})
	if err := c.workers.Stop(ctx); err != nil {
		return fmt.Errorf("close committer: a committer %w: %w", ErrStalled, err)
	}
	if f := c.last.Load(); f != nil && !ended(ctx, f.done) {
		return fmt.Errorf("close committer: a commit %w: %d operations have waited for %v", ErrStalled, f.n, time.Since(f.start).Round(time.Millisecond))
	}
	if err := c.maint.Stop(ctx); err != nil {
		return fmt.Errorf("close committer: a checkpoint, probe or scrub %w: %w", ErrStalled, err)
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

// abortQueued fails what is left in the closed queue.
func (c *Committer[Op, Res]) abortQueued() {
	var zero Res
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
		c.m.commit(c.kind(j.op), ResultAborted)
		j.done(zero, fmt.Errorf("%w: aborted at the drain deadline before it was committed", ErrDraining))
	}
}

func (c *Committer[Op, Res]) countAborted(n int) {
	c.aborted.Add(int64(n))
	c.m.aborted.Add(float64(n))
}

func (c *Committer[Op, Res]) breakerChanged(_ string, from, to breaker.State) {
	if to == breaker.StateOpen {
		c.openedAt.Store(time.Now().UnixNano())
		c.logger.Warn(c.svc+" circuit breaker opened: writes answer 503 until it closes", "from", from.String(), "cool_down", c.cooldown)
		return
	}
	c.logger.Info(c.svc+" circuit breaker changed", "from", from.String(), "to", to.String())
}

// noFaults is the fault set of a committer given none.
type noFaults struct{}

func (noFaults) Inject(context.Context, string) error { return nil }
