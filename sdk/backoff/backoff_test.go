package backoff_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plughost/plughost/sdk/backoff"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestPolicyDelayBounds(t *testing.T) {
	tests := []struct {
		name    string
		policy  backoff.Policy
		attempt int
		lo, hi  time.Duration
	}{
		{"zero policy attempt 0", backoff.Policy{}, 0, 80 * time.Millisecond, 100 * time.Millisecond},
		{"zero policy attempt 3", backoff.Policy{}, 3, 640 * time.Millisecond, 800 * time.Millisecond},
		{"zero policy capped", backoff.Policy{}, 20, 24 * time.Second, 30 * time.Second},
		{"no jitter", backoff.Policy{Initial: time.Second, Jitter: -1}, 2, 4 * time.Second, 4 * time.Second},
		{"multiplier 3", backoff.Policy{Initial: time.Second, Multiplier: 3, Jitter: -1}, 2, 9 * time.Second, 9 * time.Second},
		{"multiplier <= 1 means default", backoff.Policy{Initial: time.Second, Multiplier: 0.5, Jitter: -1}, 2, 4 * time.Second, 4 * time.Second},
		{"half jitter", backoff.Policy{Initial: time.Second, Jitter: 0.5}, 1, time.Second, 2 * time.Second},
		{"full jitter", backoff.Policy{Initial: time.Second, Jitter: 1}, 0, 0, time.Second},
		{"jitter above 1 clamps to 1", backoff.Policy{Initial: time.Second, Jitter: 7}, 0, 0, time.Second},
		{"initial above max", backoff.Policy{Initial: time.Hour, Max: time.Minute, Jitter: -1}, 0, time.Minute, time.Minute},
		{"negative attempt", backoff.Policy{Initial: time.Second, Jitter: -1}, -5, time.Second, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 1000 {
				if got := tt.policy.Delay(tt.attempt); got < tt.lo || got > tt.hi {
					t.Fatalf("%+v.Delay(%d) = %v, want in [%v, %v]", tt.policy, tt.attempt, got, tt.lo, tt.hi)
				}
			}
		})
	}
}

func TestPolicyDelayJitterVaries(t *testing.T) {
	p := backoff.Policy{Initial: time.Second}
	seen := make(map[time.Duration]bool)
	for range 100 {
		seen[p.Delay(0)] = true
	}
	// 100 uniform draws over 200ms of nanoseconds all landing on a handful of
	// values would mean the jitter is not random at all.
	if len(seen) < 50 {
		t.Errorf("%+v.Delay(0) took %d distinct values in 100 calls, want at least 50", p, len(seen))
	}
}

func TestPolicyDelayMonotoneCap(t *testing.T) {
	tests := []struct {
		name   string
		policy backoff.Policy
	}{
		{"defaults without jitter", backoff.Policy{Jitter: -1}},
		{"small cap", backoff.Policy{Initial: time.Millisecond, Max: 50 * time.Millisecond, Multiplier: 1.5, Jitter: -1}},
		{"max duration cap", backoff.Policy{Initial: time.Nanosecond, Max: math.MaxInt64, Jitter: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limit := tt.policy.Max
			if limit == 0 {
				limit = backoff.DefaultMax
			}
			prev := time.Duration(0)
			for attempt := range 200 {
				got := tt.policy.Delay(attempt)
				if got < prev {
					t.Fatalf("%+v.Delay(%d) = %v, want >= Delay(%d) = %v", tt.policy, attempt, got, attempt-1, prev)
				}
				if got > limit {
					t.Fatalf("%+v.Delay(%d) = %v, want <= %v", tt.policy, attempt, got, limit)
				}
				prev = got
			}
			if prev != limit {
				t.Errorf("%+v.Delay(199) = %v, want the cap %v", tt.policy, prev, limit)
			}
		})
	}
}

func TestPolicyDelayHugeAttempt(t *testing.T) {
	tests := []struct {
		name    string
		policy  backoff.Policy
		attempt int
		lo, hi  time.Duration
	}{
		{"attempt 1000", backoff.Policy{Jitter: -1}, 1000, backoff.DefaultMax, backoff.DefaultMax},
		{"attempt 1000 with jitter", backoff.Policy{}, 1000, 24 * time.Second, 30 * time.Second},
		{"attempt MaxInt", backoff.Policy{Jitter: -1}, math.MaxInt, backoff.DefaultMax, backoff.DefaultMax},
		{"attempt 1000 max duration", backoff.Policy{Max: math.MaxInt64, Jitter: -1}, 1000, math.MaxInt64, math.MaxInt64},
		{"attempt 1000 max duration with jitter", backoff.Policy{Max: math.MaxInt64, Jitter: 1}, 1000, 0, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 100 {
				if got := tt.policy.Delay(tt.attempt); got < tt.lo || got > tt.hi {
					t.Fatalf("%+v.Delay(%d) = %v, want in [%v, %v]", tt.policy, tt.attempt, got, tt.lo, tt.hi)
				}
			}
		})
	}
}

func TestBackoffNextReset(t *testing.T) {
	b := backoff.Backoff{Policy: backoff.Policy{Initial: time.Second, Max: 5 * time.Second, Jitter: -1}}
	steps := []struct {
		reset       bool
		wantDelay   time.Duration
		wantAttempt int
	}{
		{wantDelay: 1 * time.Second, wantAttempt: 1},
		{wantDelay: 2 * time.Second, wantAttempt: 2},
		{wantDelay: 4 * time.Second, wantAttempt: 3},
		{wantDelay: 5 * time.Second, wantAttempt: 4},
		{reset: true, wantDelay: 1 * time.Second, wantAttempt: 1},
		{wantDelay: 2 * time.Second, wantAttempt: 2},
	}
	for i, s := range steps {
		if s.reset {
			b.Reset()
			if got := b.Attempt(); got != 0 {
				t.Fatalf("step %d: Attempt() after Reset() = %d, want 0", i, got)
			}
		}
		if got := b.Next(); got != s.wantDelay {
			t.Fatalf("step %d: Next() = %v, want %v", i, got, s.wantDelay)
		}
		if got := b.Attempt(); got != s.wantAttempt {
			t.Fatalf("step %d: Attempt() = %d, want %d", i, got, s.wantAttempt)
		}
	}
}

func TestSleep(t *testing.T) {
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	expired, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()

	tests := []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want error
	}{
		{"full wait", t.Context(), time.Millisecond, nil},
		{"zero wait", t.Context(), 0, nil},
		{"negative wait", t.Context(), -time.Second, nil},
		{"already canceled", canceled, time.Hour, context.Canceled},
		{"canceled with zero wait", canceled, 0, context.Canceled},
		{"deadline before wait ends", expired, time.Hour, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			if err := backoff.Sleep(tt.ctx, tt.d); !errors.Is(err, tt.want) {
				t.Errorf("Sleep(ctx, %v) = %v, want %v", tt.d, err, tt.want)
			}
			// An hour-long wait that returned at all was cut short; this bounds
			// how late, generously enough for a loaded race-enabled run.
			if elapsed := time.Since(start); elapsed > 10*time.Second {
				t.Errorf("Sleep(ctx, %v) took %v, want prompt return", tt.d, elapsed)
			}
		})
	}
}

func TestSleepCanceledWhileWaiting(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- backoff.Sleep(ctx, time.Hour) }()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Sleep(ctx, 1h) after cancel = %v, want %v", err, context.Canceled)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Sleep(ctx, 1h) did not return within 10s of cancel")
	}
}
