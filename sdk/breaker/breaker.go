package breaker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrOpen is returned by Do, without calling fn, while the breaker is open or
// while it is half-open and already has HalfOpenMax probes in flight.
var ErrOpen = errors.New("breaker: open")

// ErrNotCounted, returned by fn (or wrapped in what it returns), says that
// the call did not exercise the dependency (it was answered from memory,
// say): Do returns the error, and the breaker counts neither a success nor
// a failure. A half-open probe slot it took is given back.
var ErrNotCounted = errors.New("breaker: call not counted")

// State is the state of a Breaker.
type State int

// The states of a Breaker; see the package documentation for the moves.
const (
	// StateClosed lets every call through.
	StateClosed State = iota
	// StateOpen rejects every call with ErrOpen.
	StateOpen
	// StateHalfOpen lets a limited number of probe calls through.
	StateHalfOpen
)

// String returns "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateOpen:
		return "open"
	case StateHalfOpen:
		return "half-open"
	default:
		return fmt.Sprintf("State(%d)", int(s))
	}
}

// Settings configures a Breaker. The zero Settings is usable.
type Settings struct {
	// Name identifies the breaker to OnStateChange.
	Name string
	// FailureThreshold is how many failures open a closed breaker:
	// that many in a row, or that many within Window when they are at
	// least FailureRate of the calls in it. Default 5 when <= 0.
	FailureThreshold int
	// Window is the rolling window over which FailureRate is measured,
	// kept as ten buckets of a tenth of it each; default 10s when <= 0.
	Window time.Duration
	// FailureRate is the share of a window's calls that must have failed,
	// with at least FailureThreshold failures, for the window to open the
	// breaker: so a dependency failing every other call opens it, which
	// counting failures in a row never would. Default 0.5 when <= 0; a
	// value above 1 leaves only the rule of failures in a row.
	FailureRate float64
	// Cooldown is how long the breaker stays open before it lets probes
	// through; default 5s when <= 0.
	Cooldown time.Duration
	// HalfOpenMax is how many probes may be in flight at once while
	// half-open; default 1 when <= 0.
	HalfOpenMax int
	// SuccessThreshold is how many successful probes close a half-open
	// breaker; default 1 when <= 0.
	SuccessThreshold int
	// IsFailure reports whether an error returned by fn counts as a failure;
	// any other outcome counts as a success. The default counts every
	// non-nil error except context.Canceled, since a caller giving up says
	// nothing about the dependency; context.DeadlineExceeded does count.
	IsFailure func(error) bool
	// Now returns the current time; tests set it to drive the cooldown.
	// It is called with the breaker's lock held, so it must not call back
	// into the breaker. Default time.Now.
	Now func() time.Time
	// OnStateChange, if not nil, is called after each change of state, on
	// the goroutine that caused it and with no lock held. Calls from
	// different goroutines may run concurrently, so it should be quick and
	// safe for concurrent use.
	OnStateChange func(name string, from, to State)
}

// Breaker is a circuit breaker. It is safe for concurrent use. Create one
// with New.
type Breaker struct {
	name             string
	failureThreshold int
	cooldown         time.Duration
	halfOpenMax      int
	successThreshold int
	failureRate      float64
	isFailure        func(error) bool
	now              func() time.Time
	onStateChange    func(name string, from, to State)

	mu       sync.Mutex
	state    State
	gen      uint64    // counts state changes, so late results of an older state are ignored
	failures int       // consecutive failures while closed
	openedAt time.Time // when the breaker last opened
	probes   int       // probes in flight while half-open
	passed   int       // successful probes while half-open
	window   window    // calls and failures of the last Window while closed
}

// windowBuckets is how many buckets a window is kept in.
const windowBuckets = 10

// window counts the calls and failures of a rolling window in buckets;
// a bucket older than the window counts for nothing.
type window struct {
	base    time.Time // bucket 0 starts here
	width   int64     // nanoseconds per bucket
	buckets [windowBuckets]struct {
		epoch           int64 // time in units of width
		calls, failures int
	}
}

// add counts one call at now and returns the window's totals.
func (w *window) add(now time.Time, failed bool) (calls, failures int) {
	// Time since base, with the monotonic clock where now has it; a
	// clock that went back counts as base.
	e := max(int64(now.Sub(w.base)), 0) / w.width
	b := &w.buckets[e%windowBuckets]
	if b.epoch != e {
		b.epoch, b.calls, b.failures = e, 0, 0
	}
	b.calls++
	if failed {
		b.failures++
	}
	for _, b := range w.buckets {
		if d := e - b.epoch; d >= 0 && d < windowBuckets {
			calls += b.calls
			failures += b.failures
		}
	}
	return calls, failures
}

// reset forgets every call.
func (w *window) reset() {
	base, width := w.base, w.width
	*w = window{base: base, width: width}
}

// New returns a closed Breaker configured by s.
func New(s Settings) *Breaker {
	b := &Breaker{
		name:             s.Name,
		failureThreshold: s.FailureThreshold,
		cooldown:         s.Cooldown,
		halfOpenMax:      s.HalfOpenMax,
		successThreshold: s.SuccessThreshold,
		failureRate:      s.FailureRate,
		isFailure:        s.IsFailure,
		now:              s.Now,
		onStateChange:    s.OnStateChange,
	}
	if b.failureThreshold <= 0 {
		b.failureThreshold = 5
	}
	if b.cooldown <= 0 {
		b.cooldown = 5 * time.Second
	}
	if s.Window <= 0 {
		s.Window = 10 * time.Second
	}
	b.window.width = max(int64(s.Window/windowBuckets), 1)
	if b.failureRate <= 0 {
		b.failureRate = 0.5
	}
	if b.halfOpenMax <= 0 {
		b.halfOpenMax = 1
	}
	if b.successThreshold <= 0 {
		b.successThreshold = 1
	}
	if b.isFailure == nil {
		b.isFailure = defaultIsFailure
	}
	if b.now == nil {
		b.now = time.Now
	}
	b.window.base = b.now()
	return b
}

func defaultIsFailure(err error) bool {
	return err != nil && !errors.Is(err, context.Canceled)
}

// transition is a change of state to report once the lock is released.
type transition struct {
	from, to State
}

// Do calls fn(ctx) if the breaker admits the call and records the outcome.
// It returns ErrOpen without calling fn while the breaker rejects calls, and
// ctx.Err() without calling fn if ctx is already done; otherwise it returns
// what fn returns. A panic in fn counts as a failure and is not recovered.
func (b *Breaker) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	gen, err := b.admit()
	if err != nil {
		return err
	}
	// Record a failure if fn panics or calls runtime.Goexit, so that a
	// half-open probe slot is never lost; the panic itself carries on.
	finished := false
	defer func() {
		if !finished {
			b.record(gen, outcomeFailure)
		}
	}()
	err = fn(ctx)
	finished = true
	switch {
	case errors.Is(err, ErrNotCounted):
		b.record(gen, outcomeNone)
	case b.isFailure(err):
		b.record(gen, outcomeFailure)
	default:
		b.record(gen, outcomeSuccess)
	}
	return err
}

// outcome is what a call counts as.
type outcome int

const (
	outcomeSuccess outcome = iota
	outcomeFailure
	outcomeNone
)

// State returns the current state, moving an open breaker whose cooldown
// has passed to half-open.
func (b *Breaker) State() State {
	b.mu.Lock()
	var changes []transition
	b.refresh(&changes)
	s := b.state
	b.mu.Unlock()
	b.notify(changes)
	return s
}

// admit decides whether a call may run and returns the generation it runs in.
func (b *Breaker) admit() (uint64, error) {
	b.mu.Lock()
	var changes []transition
	b.refresh(&changes)
	var err error
	switch b.state {
	case StateOpen:
		err = ErrOpen
	case StateHalfOpen:
		if b.probes >= b.halfOpenMax {
			err = ErrOpen
		} else {
			b.probes++
		}
	}
	gen := b.gen
	b.mu.Unlock()
	b.notify(changes)
	return gen, err
}

// record counts the outcome of a call admitted in generation gen.
func (b *Breaker) record(gen uint64, o outcome) {
	b.mu.Lock()
	var changes []transition
	failed := o == outcomeFailure
	if gen == b.gen {
		switch b.state {
		case StateClosed:
			if o == outcomeNone {
				break
			}
			calls, failures := b.window.add(b.now(), failed)
			if !failed {
				b.failures = 0
				break
			}
			b.failures++
			if b.failures >= b.failureThreshold ||
				(failures >= b.failureThreshold && float64(failures) >= b.failureRate*float64(calls)) {
				b.setState(StateOpen, &changes)
			}
		case StateHalfOpen:
			b.probes--
			if o == outcomeNone {
				break
			}
			if failed {
				b.setState(StateOpen, &changes)
				break
			}
			b.passed++
			if b.passed >= b.successThreshold {
				b.setState(StateClosed, &changes)
			}
		}
	}
	b.mu.Unlock()
	b.notify(changes)
}

// Trip opens the breaker now, whatever it has counted, for a failure its
// caller knows to be decisive without more calls: a dependency that has
// stopped answering, say, whose calls would each take their whole timeout
// to fail. An open breaker starts its Cooldown again.
func (b *Breaker) Trip() {
	b.mu.Lock()
	var changes []transition
	if b.state == StateOpen {
		b.openedAt = b.now()
	} else {
		b.setState(StateOpen, &changes)
	}
	b.mu.Unlock()
	b.notify(changes)
}

// refresh moves an open breaker to half-open once its cooldown has passed.
// The caller holds b.mu.
func (b *Breaker) refresh(changes *[]transition) {
	if b.state == StateOpen && !b.now().Before(b.openedAt.Add(b.cooldown)) {
		b.setState(StateHalfOpen, changes)
	}
}

// setState enters state to, resetting the counters of the new state, and
// notes the change for notify. The caller holds b.mu.
func (b *Breaker) setState(to State, changes *[]transition) {
	from := b.state
	b.state = to
	b.gen++
	b.failures, b.probes, b.passed = 0, 0, 0
	if to == StateClosed {
		b.window.reset()
	}
	if to == StateOpen {
		b.openedAt = b.now()
	}
	*changes = append(*changes, transition{from, to})
}

// notify reports changes to OnStateChange. The caller must not hold b.mu.
func (b *Breaker) notify(changes []transition) {
	if b.onStateChange == nil {
		return
	}
	for _, c := range changes {
		b.onStateChange(b.name, c.from, c.to)
	}
}
