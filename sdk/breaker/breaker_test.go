package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plughost/plughost/sdk/breaker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// clock is a fake time source for Settings.Now that only moves when told.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock {
	return &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var (
	errBackend  = errors.New("backend down")
	errNotFound = errors.New("not found")
)

// step is one action in a scenario: a call that returns err (or, if wait
// is set, a move of the clock by advance; if trip is set, a Trip), followed by the wanted result of Do
// and the wanted State.
type step struct {
	wait      bool // move the clock by advance instead
	advance   time.Duration
	trip      bool // call Trip instead
	err       error
	wantErr   error
	wantState breaker.State
}

func call(err error, wantErr error, wantState breaker.State) step {
	return step{err: err, wantErr: wantErr, wantState: wantState}
}

func trip(wantState breaker.State) step {
	return step{trip: true, wantState: wantState}
}

func wait(d time.Duration, wantState breaker.State) step {
	return step{wait: true, advance: d, wantState: wantState}
}

func TestBreakerScenarios(t *testing.T) {
	const (
		closed   = breaker.StateClosed
		open     = breaker.StateOpen
		halfOpen = breaker.StateHalfOpen
	)
	tests := []struct {
		name     string
		settings breaker.Settings
		steps    []step
	}{
		{
			name:     "opens after threshold consecutive failures",
			settings: breaker.Settings{FailureThreshold: 3},
			steps: []step{
				call(errBackend, errBackend, closed),
				call(errBackend, errBackend, closed),
				call(errBackend, errBackend, open),
				call(nil, breaker.ErrOpen, open),
			},
		},
		{
			name:     "success resets the count of failures in a row",
			settings: breaker.Settings{FailureThreshold: 2, FailureRate: 2},
			steps: []step{
				call(errBackend, errBackend, closed),
				call(nil, nil, closed),
				call(errBackend, errBackend, closed),
				call(errBackend, errBackend, open),
			},
		},
		{
			name:     "a call not counted neither resets nor adds to the failures",
			settings: breaker.Settings{FailureThreshold: 2},
			steps: []step{
				call(errBackend, errBackend, closed),
				call(breaker.ErrNotCounted, breaker.ErrNotCounted, closed),
				call(errBackend, errBackend, open),
			},
		},
		{
			name:     "a probe not counted neither closes nor reopens, and frees its slot",
			settings: breaker.Settings{FailureThreshold: 1, Cooldown: time.Minute},
			steps: []step{
				call(errBackend, errBackend, open),
				wait(time.Minute, halfOpen),
				call(fmt.Errorf("answered from cache: %w", breaker.ErrNotCounted), breaker.ErrNotCounted, halfOpen),
				call(breaker.ErrNotCounted, breaker.ErrNotCounted, halfOpen),
				call(nil, nil, closed),
			},
		},
		{
			name:     "default threshold is 5",
			settings: breaker.Settings{},
			steps: []step{
				call(errBackend, errBackend, closed),
				call(errBackend, errBackend, closed),
				call(errBackend, errBackend, closed),
				call(errBackend, errBackend, closed),
				call(errBackend, errBackend, open),
			},
		},
		{
			name:     "half-open after cooldown then closed on success",
			settings: breaker.Settings{FailureThreshold: 1, Cooldown: time.Minute},
			steps: []step{
				call(errBackend, errBackend, open),
				wait(time.Minute-time.Nanosecond, open),
				call(nil, breaker.ErrOpen, open),
				wait(time.Nanosecond, halfOpen),
				call(nil, nil, closed),
				call(nil, nil, closed),
			},
		},
		{
			name:     "default cooldown is 5s",
			settings: breaker.Settings{FailureThreshold: 1},
			steps: []step{
				call(errBackend, errBackend, open),
				wait(4*time.Second, open),
				wait(time.Second, halfOpen),
			},
		},
		{
			name:     "failed probe opens again for a full cooldown",
			settings: breaker.Settings{FailureThreshold: 1, Cooldown: time.Minute},
			steps: []step{
				call(errBackend, errBackend, open),
				wait(time.Minute, halfOpen),
				call(errBackend, errBackend, open),
				wait(59*time.Second, open),
				call(nil, breaker.ErrOpen, open),
				wait(time.Second, halfOpen),
				call(nil, nil, closed),
			},
		},
		{
			name:     "success threshold needs that many probes",
			settings: breaker.Settings{FailureThreshold: 1, Cooldown: time.Second, SuccessThreshold: 3},
			steps: []step{
				call(errBackend, errBackend, open),
				wait(time.Second, halfOpen),
				call(nil, nil, halfOpen),
				call(nil, nil, halfOpen),
				call(nil, nil, closed),
			},
		},
		{
			name:     "failure among probes reopens and forgets successes",
			settings: breaker.Settings{FailureThreshold: 1, Cooldown: time.Second, SuccessThreshold: 2},
			steps: []step{
				call(errBackend, errBackend, open),
				wait(time.Second, halfOpen),
				call(nil, nil, halfOpen),
				call(errBackend, errBackend, open),
				wait(time.Second, halfOpen),
				call(nil, nil, halfOpen),
				call(nil, nil, closed),
			},
		},
		{
			name:     "context canceled is not a failure by default",
			settings: breaker.Settings{FailureThreshold: 1},
			steps: []step{
				call(context.Canceled, context.Canceled, closed),
				call(fmt.Errorf("fetch: %w", context.Canceled), context.Canceled, closed),
				call(context.DeadlineExceeded, context.DeadlineExceeded, open),
			},
		},
		{
			name: "custom IsFailure",
			settings: breaker.Settings{
				FailureThreshold: 1,
				IsFailure:        func(err error) bool { return errors.Is(err, errBackend) },
			},
			steps: []step{
				call(errNotFound, errNotFound, closed),
				call(errBackend, errBackend, open),
			},
		},
		{
			name:     "failing every other call opens at the failure rate",
			settings: breaker.Settings{FailureThreshold: 3},
			steps: []step{
				call(errBackend, errBackend, closed),
				call(nil, nil, closed),
				call(errBackend, errBackend, closed),
				call(nil, nil, closed),
				call(errBackend, errBackend, open), // 3 of 5: above the rate
			},
		},
		{
			// The in-a-row rule cannot open it here, nor can the
			// failures before the threshold: only the rate, reached
			// exactly, does.
			name:     "failing every other call opens exactly at the rate",
			settings: breaker.Settings{FailureThreshold: 2, FailureRate: 0.5},
			steps: []step{
				call(nil, nil, closed),
				call(errBackend, errBackend, closed), // 1 of 2: under the threshold
				call(nil, nil, closed),
				call(errBackend, errBackend, open), // 2 of 4: at the rate, 1 in a row
			},
		},
		{
			name:     "failures under the rate leave it closed, at the rate open it",
			settings: breaker.Settings{FailureThreshold: 2, FailureRate: 0.5},
			steps: []step{
				call(errBackend, errBackend, closed),
				call(nil, nil, closed),
				call(nil, nil, closed),
				call(nil, nil, closed),
				call(errBackend, errBackend, closed), // 2 of 5
				call(errBackend, errBackend, open),   // 3 of 6: at the rate, and 2 in a row
			},
		},
		{
			name:     "the rate counts only the window",
			settings: breaker.Settings{FailureThreshold: 2, Window: 10 * time.Second},
			steps: []step{
				call(errBackend, errBackend, closed),
				call(nil, nil, closed),
				wait(11*time.Second, closed),
				call(errBackend, errBackend, closed), // 1 of 1 in the window
				call(nil, nil, closed),
				call(errBackend, errBackend, open), // 2 of 3
			},
		},
		{
			name:     "closing forgets the window",
			settings: breaker.Settings{FailureThreshold: 2, Cooldown: time.Minute},
			steps: []step{
				call(errBackend, errBackend, closed),
				call(errBackend, errBackend, open),
				wait(time.Minute, halfOpen),
				call(nil, nil, closed),
				call(errBackend, errBackend, closed), // 1 of 1 since closing
			},
		},
		{
			name:     "Trip opens at once and restarts the cool-down",
			settings: breaker.Settings{FailureThreshold: 100, Cooldown: time.Minute},
			steps: []step{
				call(nil, nil, closed),
				trip(open),
				call(nil, breaker.ErrOpen, open),
				wait(50*time.Second, open),
				trip(open),
				wait(50*time.Second, open),
				wait(10*time.Second, halfOpen),
				trip(open),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			tt.settings.Now = c.Now
			b := breaker.New(tt.settings)
			for i, s := range tt.steps {
				switch {
				case s.trip:
					b.Trip()
				case s.wait:
					c.Advance(s.advance)
				default:
					called := false
					err := b.Do(t.Context(), func(context.Context) error {
						called = true
						return s.err
					})
					if s.wantErr == nil && err != nil || s.wantErr != nil && !errors.Is(err, s.wantErr) {
						t.Fatalf("step %d: Do(fn returning %v) = %v, want %v", i, s.err, err, s.wantErr)
					}
					if wantCalled := !errors.Is(s.wantErr, breaker.ErrOpen); called != wantCalled {
						t.Fatalf("step %d: Do(fn returning %v) called fn = %t, want %t", i, s.err, called, wantCalled)
					}
				}
				if got := b.State(); got != s.wantState {
					t.Fatalf("step %d: State() = %v, want %v", i, got, s.wantState)
				}
			}
		})
	}
}

func TestHalfOpenMaxProbes(t *testing.T) {
	tests := []struct {
		name        string
		halfOpenMax int
	}{
		{"default one probe", 0},
		{"three probes", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			b := breaker.New(breaker.Settings{FailureThreshold: 1, Cooldown: time.Second, HalfOpenMax: tt.halfOpenMax, SuccessThreshold: 10, Now: c.Now})
			if err := b.Do(t.Context(), func(context.Context) error { return errBackend }); !errors.Is(err, errBackend) {
				t.Fatalf("Do(failing fn) = %v, want %v", err, errBackend)
			}
			c.Advance(time.Second)

			probes := max(tt.halfOpenMax, 1)
			started := make(chan struct{})
			release := make(chan struct{})
			var wg sync.WaitGroup
			for range probes {
				wg.Go(func() {
					err := b.Do(t.Context(), func(context.Context) error {
						started <- struct{}{}
						<-release
						return nil
					})
					if err != nil {
						t.Errorf("Do(probe) = %v, want nil", err)
					}
				})
			}
			for range probes {
				<-started
			}

			// Every probe slot is taken, so another call is refused untried.
			err := b.Do(t.Context(), func(context.Context) error {
				t.Error("Do called fn beyond HalfOpenMax probes")
				return nil
			})
			if !errors.Is(err, breaker.ErrOpen) {
				t.Errorf("Do() with %d probes in flight = %v, want %v", probes, err, breaker.ErrOpen)
			}

			close(release)
			wg.Wait()

			// The probes finished, so their slots are free again.
			if err := b.Do(t.Context(), func(context.Context) error { return nil }); err != nil {
				t.Errorf("Do() after probes finished = %v, want nil", err)
			}
			if got := b.State(); got != breaker.StateHalfOpen {
				t.Errorf("State() after %d of 10 successes = %v, want %v", probes+1, got, breaker.StateHalfOpen)
			}
		})
	}
}

func TestLateResultOfOldStateIgnored(t *testing.T) {
	c := newClock()
	b := breaker.New(breaker.Settings{FailureThreshold: 1, Cooldown: time.Second, SuccessThreshold: 1, Now: c.Now})

	// A slow call admitted while closed finishes after another call opened
	// the breaker and the cooldown passed. Its success says nothing about
	// the dependency now, so it must not count as a probe and close it.
	started := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- b.Do(t.Context(), func(context.Context) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	if err := b.Do(t.Context(), func(context.Context) error { return errBackend }); !errors.Is(err, errBackend) {
		t.Fatalf("Do(failing fn) = %v, want %v", err, errBackend)
	}
	c.Advance(time.Second)
	if got := b.State(); got != breaker.StateHalfOpen {
		t.Fatalf("State() after cooldown = %v, want %v", got, breaker.StateHalfOpen)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Do(slow fn) = %v, want nil", err)
	}
	if got := b.State(); got != breaker.StateHalfOpen {
		t.Errorf("State() after late success = %v, want %v", got, breaker.StateHalfOpen)
	}
}

func TestPanicCountsAsFailure(t *testing.T) {
	c := newClock()
	b := breaker.New(breaker.Settings{FailureThreshold: 1, Cooldown: time.Second, Now: c.Now})

	doPanic := func() (recovered any) {
		defer func() { recovered = recover() }()
		_ = b.Do(t.Context(), func(context.Context) error { panic("boom") })
		return nil
	}
	if got := doPanic(); got != "boom" {
		t.Fatalf("Do(panicking fn) panicked with %v, want boom", got)
	}
	if got := b.State(); got != breaker.StateOpen {
		t.Fatalf("State() after panic = %v, want %v", got, breaker.StateOpen)
	}

	// A panicking probe must give its slot back and reopen the breaker.
	c.Advance(time.Second)
	if got := doPanic(); got != "boom" {
		t.Fatalf("Do(panicking probe) panicked with %v, want boom", got)
	}
	if got := b.State(); got != breaker.StateOpen {
		t.Fatalf("State() after panicking probe = %v, want %v", got, breaker.StateOpen)
	}
	c.Advance(time.Second)
	if err := b.Do(t.Context(), func(context.Context) error { return nil }); err != nil {
		t.Errorf("Do() after cooldown = %v, want nil", err)
	}
}

func TestDoWithDoneContext(t *testing.T) {
	b := breaker.New(breaker.Settings{FailureThreshold: 1})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := b.Do(ctx, func(context.Context) error {
		t.Error("Do called fn with a done context")
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Do(canceled ctx) = %v, want %v", err, context.Canceled)
	}
	if got := b.State(); got != breaker.StateClosed {
		t.Errorf("State() = %v, want %v", got, breaker.StateClosed)
	}
}

func TestOnStateChange(t *testing.T) {
	c := newClock()
	type change struct {
		name     string
		from, to breaker.State
	}
	var got []change
	var b *breaker.Breaker
	b = breaker.New(breaker.Settings{
		Name:             "db",
		FailureThreshold: 1,
		Cooldown:         time.Second,
		Now:              c.Now,
		OnStateChange: func(name string, from, to breaker.State) {
			// Calling back into the breaker proves no lock is held here.
			_ = b.State()
			got = append(got, change{name, from, to})
		},
	})
	fail := func(context.Context) error { return errBackend }
	ok := func(context.Context) error { return nil }

	_ = b.Do(t.Context(), fail)
	c.Advance(time.Second)
	_ = b.Do(t.Context(), fail)
	c.Advance(time.Second)
	_ = b.Do(t.Context(), ok)

	want := []change{
		{"db", breaker.StateClosed, breaker.StateOpen},
		{"db", breaker.StateOpen, breaker.StateHalfOpen},
		{"db", breaker.StateHalfOpen, breaker.StateOpen},
		{"db", breaker.StateOpen, breaker.StateHalfOpen},
		{"db", breaker.StateHalfOpen, breaker.StateClosed},
	}
	if len(got) != len(want) {
		t.Fatalf("OnStateChange calls = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("OnStateChange call %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestStateString(t *testing.T) {
	tests := []struct {
		s    breaker.State
		want string
	}{
		{breaker.StateClosed, "closed"},
		{breaker.StateOpen, "open"},
		{breaker.StateHalfOpen, "half-open"},
		{breaker.State(42), "State(42)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.s.String(); got != tt.want {
				t.Errorf("State(%d).String() = %q, want %q", int(tt.s), got, tt.want)
			}
		})
	}
}

// TestWindowWithZeroTimeClock: a clock that starts at the zero time, or
// goes back, neither panics nor counts old failures again.
func TestWindowWithZeroTimeClock(t *testing.T) {
	now := time.Time{}
	b := breaker.New(breaker.Settings{FailureThreshold: 2, Window: 10 * time.Second, Now: func() time.Time { return now }})
	fail := func(context.Context) error { return errBackend }
	ok := func(context.Context) error { return nil }
	_ = b.Do(t.Context(), fail)
	_ = b.Do(t.Context(), ok)
	_ = b.Do(t.Context(), ok)
	now = now.Add(-time.Hour) // back: counts as the window's start
	_ = b.Do(t.Context(), ok)
	if s := b.State(); s != breaker.StateClosed {
		t.Fatalf("State() = %v after 1 failure in 4 calls, want closed", s)
	}
	now = time.Time{}.Add(20 * time.Second) // the first failure has left the window
	_ = b.Do(t.Context(), fail)
	if s := b.State(); s != breaker.StateClosed {
		t.Errorf("State() = %v after 1 failure in the window, want closed", s)
	}
	_ = b.Do(t.Context(), fail)
	if s := b.State(); s != breaker.StateOpen {
		t.Errorf("State() = %v after 2 failures in a row, want open", s)
	}
}
