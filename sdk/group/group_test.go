package group_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/plughost/plughost/sdk/backoff"
	"github.com/plughost/plughost/sdk/group"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 10s waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // poll interval, not a stand-in for the condition
	}
}

// logBuffer collects a JSON hclog output that the test reads while workers write.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// records returns every log record with the given message.
func (b *logBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("json.Unmarshal(%q) = %v, want nil", sc.Text(), err)
		}
		if rec["@message"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

func newLogger(t *testing.T) (hclog.Logger, *logBuffer) {
	t.Helper()
	buf := &logBuffer{}
	return hclog.New(&hclog.LoggerOptions{Output: buf, JSONFormat: true, Level: hclog.Trace}), buf
}

// restarts records OnRestart calls.
type restarts struct {
	mu      sync.Mutex
	reasons []error
}

func (r *restarts) record(name string, reason error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reasons = append(r.reasons, fmt.Errorf("%s: %w", name, reason))
}

func (r *restarts) get() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reasons)
}

// fastBackoff restarts within milliseconds, so tests wait on conditions only.
var fastBackoff = backoff.Policy{Initial: time.Millisecond, Max: 10 * time.Millisecond, Jitter: -1}

var errBoom = errors.New("boom")

func TestRestartAfterFailure(t *testing.T) {
	tests := []struct {
		name       string
		fail       func() error
		wantIs     []error
		wantReason string
		wantPanic  bool
	}{
		{
			name:       "panic with string",
			fail:       func() error { panic("kaboom") },
			wantIs:     []error{group.ErrPanic},
			wantReason: "w: recovered kaboom: group: worker panicked",
			wantPanic:  true,
		},
		{
			name:       "panic with error",
			fail:       func() error { panic(errBoom) },
			wantIs:     []error{group.ErrPanic, errBoom},
			wantReason: "w: recovered boom: group: worker panicked",
			wantPanic:  true,
		},
		{
			name:       "returned error",
			fail:       func() error { return errBoom },
			wantIs:     []error{errBoom},
			wantReason: "w: boom",
		},
		{
			name:       "returned context error while group lives",
			fail:       func() error { return context.DeadlineExceeded },
			wantIs:     []error{context.DeadlineExceeded},
			wantReason: "w: context deadline exceeded",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger, logs := newLogger(t)
			var r restarts
			g := group.New(t.Context(), group.Options{Logger: logger, Backoff: fastBackoff, OnRestart: r.record})
			t.Cleanup(func() { _ = g.Stop(context.Background()) })

			var runs atomic.Int32
			g.Go("w", func(ctx context.Context) error {
				if runs.Add(1) <= 2 {
					return tt.fail()
				}
				<-ctx.Done()
				return ctx.Err()
			})
			waitFor(t, "2 restarts", func() bool { return len(r.get()) == 2 })
			stop(t, g)

			if got := runs.Load(); got != 3 {
				t.Errorf("worker ran %d times, want 3", got)
			}
			reasons := r.get()
			if len(reasons) != 2 {
				t.Fatalf("OnRestart called %d times, want 2: %v", len(reasons), reasons)
			}
			for _, reason := range reasons {
				for _, want := range tt.wantIs {
					if !errors.Is(reason, want) {
						t.Errorf("OnRestart reason %v: errors.Is(_, %v) = false, want true", reason, want)
					}
				}
				if got := reason.Error(); got != tt.wantReason {
					t.Errorf("OnRestart reason = %q, want %q", got, tt.wantReason)
				}
			}

			panics := logs.records(t, "worker panicked")
			failures := logs.records(t, "worker failed")
			if tt.wantPanic {
				if len(panics) != 2 || len(failures) != 0 {
					t.Fatalf("logged %d panics and %d failures, want 2 and 0", len(panics), len(failures))
				}
				rec := panics[0]
				if rec["@level"] != "error" || rec["worker"] != "w" {
					t.Errorf("panic record level, worker = %v, %v, want error, w", rec["@level"], rec["worker"])
				}
				// The stack must reach the worker that panicked, not stop in the group.
				if stack, _ := rec["stack"].(string); !strings.Contains(stack, "group_test.TestRestartAfterFailure") {
					t.Errorf("panic record stack = %q, want one through TestRestartAfterFailure", stack)
				}
			} else if len(panics) != 0 || len(failures) != 2 {
				t.Fatalf("logged %d panics and %d failures, want 0 and 2", len(panics), len(failures))
			}
		})
	}
}

func TestNilReturnNotRestarted(t *testing.T) {
	var r restarts
	// An hour-long backoff means a wrongful restart would leave the worker's
	// goroutine parked, for goleak to find.
	g := group.New(t.Context(), group.Options{Backoff: backoff.Policy{Initial: time.Hour}, OnRestart: r.record})
	t.Cleanup(func() { _ = g.Stop(context.Background()) })

	before := goleak.IgnoreCurrent()
	var runs atomic.Int32
	g.Go("once", func(context.Context) error {
		runs.Add(1)
		return nil
	})
	// The worker's goroutine exits on its own, before any Stop.
	if err := goleak.Find(before); err != nil {
		t.Fatalf("worker that returned nil is still supervised: %v", err)
	}
	if got := runs.Load(); got != 1 {
		t.Errorf("worker ran %d times, want 1", got)
	}
	if got := r.get(); len(got) != 0 {
		t.Errorf("OnRestart calls = %v, want none", got)
	}
}

func TestStopJoins(t *testing.T) {
	var r restarts
	g := group.New(t.Context(), group.Options{Backoff: fastBackoff, OnRestart: r.record})

	const workers = 5
	var started, finished atomic.Int32
	for i := range workers {
		g.Go(fmt.Sprintf("w%d", i), func(ctx context.Context) error {
			started.Add(1)
			<-ctx.Done()
			finished.Add(1)
			return ctx.Err()
		})
	}
	waitFor(t, "all workers to start", func() bool { return started.Load() == workers })
	stop(t, g)

	if got := finished.Load(); got != workers {
		t.Errorf("after Stop, %d workers returned, want %d", got, workers)
	}
	if got := r.get(); len(got) != 0 {
		t.Errorf("OnRestart calls = %v, want none for workers returning ctx.Err()", got)
	}
	stop(t, g) // a second Stop returns at once
}

func TestStopDuringBackoff(t *testing.T) {
	var r restarts
	g := group.New(t.Context(), group.Options{Backoff: backoff.Policy{Initial: time.Hour, Max: time.Hour}, OnRestart: r.record})
	failed := make(chan struct{})
	var runs atomic.Int32
	g.Go("flaky", func(context.Context) error {
		if runs.Add(1) == 1 {
			close(failed)
		}
		return errBoom
	})
	<-failed

	stopped := make(chan struct{})
	go func() {
		stop(t, g)
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop() still waiting 10s into a 1h backoff")
	}
	if got := runs.Load(); got != 1 {
		t.Errorf("worker ran %d times, want 1", got)
	}
	if got := r.get(); len(got) != 0 {
		t.Errorf("OnRestart calls = %v, want none", got)
	}
}

func TestParentContextCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var r restarts
	g := group.New(ctx, group.Options{Backoff: fastBackoff, OnRestart: r.record})
	t.Cleanup(func() { _ = g.Stop(context.Background()) })

	returned := make(chan error, 1)
	g.Go("w", func(ctx context.Context) error {
		<-ctx.Done()
		returned <- ctx.Err()
		return errBoom // not restarted: the group's context is done
	})
	cancel()
	select {
	case err := <-returned:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("worker ctx.Err() = %v, want %v", err, context.Canceled)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("worker still running 10s after the parent context was canceled")
	}
	stop(t, g)
	if got := r.get(); len(got) != 0 {
		t.Errorf("OnRestart calls = %v, want none", got)
	}
}

func TestGoAfterStop(t *testing.T) {
	g := group.New(t.Context(), group.Options{})
	stop(t, g)

	before := goleak.IgnoreCurrent()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var ran atomic.Bool
	g.Go("late", func(context.Context) error {
		ran.Store(true)
		<-release
		return nil
	})
	// A worker started after Stop would be blocked on release, for goleak to find.
	if err := goleak.Find(before); err != nil {
		t.Fatalf("Go after Stop started a goroutine: %v", err)
	}
	if ran.Load() {
		t.Error("Go after Stop ran the worker")
	}
}

func TestBackoffResetsAfterLongRun(t *testing.T) {
	logger, logs := newLogger(t)
	var r restarts
	policy := backoff.Policy{Initial: time.Millisecond, Max: 100 * time.Millisecond, Jitter: -1}
	g := group.New(t.Context(), group.Options{Logger: logger, Backoff: policy, OnRestart: r.record})
	t.Cleanup(func() { _ = g.Stop(context.Background()) })

	var runs atomic.Int32
	g.Go("w", func(ctx context.Context) error {
		switch runs.Add(1) {
		case 1, 2, 3:
			return errBoom
		case 4:
			// Outlive the policy's Max, which is the point of this test
			// rather than a stand-in for some other condition.
			select {
			case <-time.After(3 * policy.Max):
			case <-ctx.Done():
			}
			return errBoom
		default:
			<-ctx.Done()
			return ctx.Err()
		}
	})
	waitFor(t, "4 restarts", func() bool { return len(r.get()) == 4 })
	stop(t, g)

	var attempts []float64
	for _, rec := range logs.records(t, "restarting worker") {
		a, _ := rec["attempt"].(float64)
		attempts = append(attempts, a)
	}
	if want := []float64{0, 1, 2, 0}; !slices.Equal(attempts, want) {
		t.Errorf("restart attempts = %v, want %v", attempts, want)
	}
}

// stop stops g and fails the test if its workers outlast 10s.
func stop(t *testing.T, g *group.Group) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Stop(ctx); err != nil {
		t.Fatalf("Stop() = %v, want nil", err)
	}
}

// TestStopDeadline: a worker that ignores its context holds Stop only
// until Stop's own deadline, which it reports; once the worker returns, a
// later Stop waits for it and returns nil.
func TestStopDeadline(t *testing.T) {
	g := group.New(t.Context(), group.Options{})
	release := make(chan struct{})
	entered := make(chan struct{})
	g.Go("stuck", func(context.Context) error {
		close(entered)
		<-release // ignores its context, as a call stalled on a disk would
		return nil
	})
	<-entered
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := g.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop() with a stuck worker = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Stop() returned after %v, want about its 50ms deadline", d)
	}
	close(release)
	stop(t, g)
}
