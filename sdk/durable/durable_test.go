package durable_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/backoff"
	"github.com/plughost/plughost/sdk/breaker"
	"github.com/plughost/plughost/sdk/durable"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestGroupCommit(t *testing.T) {
	g := newGate()
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1, MaxBatch: 64, Faults: g})
	first := f.mustSubmit(t)
	g.waitEntered(t)
	// While the first group is held, these queue up: 100 in groups of at
	// most 64.
	var chans []<-chan outcome
	for range 100 {
		chans = append(chans, f.mustSubmit(t))
	}
	g.Open()
	if o := wait(t, first); o.err != nil || o.res != 1 {
		t.Fatalf("first op = %+v, want seq 1", o)
	}
	for _, ch := range chans {
		if o := wait(t, ch); o.err != nil {
			t.Fatalf("queued op = %+v", o)
		}
	}
	if got, want := f.app.groupSizes(), []int{1, 64, 36}; !slices.Equal(got, want) {
		t.Errorf("group sizes = %v, want %v (max_batch 64)", got, want)
	}
	if got := f.metric(t, "fake_commit_batch_size"); got != 3 {
		t.Errorf("fake_commit_batch_size count = %v, want 3 groups", got)
	}
	if got := f.metric(t, "fake_commits_total", "kind", "op", "result", "committed"); got != 101 {
		t.Errorf("fake_commits_total{op,committed} = %v, want 101", got)
	}
}

// TestAnnounceInCommitOrder: with four committers taking turns and many
// concurrent submitters, the results are announced in the order the
// applier committed them, none twice and none left out.
func TestAnnounceInCommitOrder(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{Committers: 4, MaxBatch: 4})
	const n = 400
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			_, ch, err := f.submit(t)
			for errors.Is(err, durable.ErrBusy) {
				time.Sleep(time.Millisecond) // back off like a client told 429
				_, ch, err = f.submit(t)
			}
			if err != nil {
				t.Errorf("Submit = %v", err)
				return
			}
			if o := wait(t, ch); o.err != nil {
				t.Errorf("op = %v", o.err)
			}
		})
	}
	wg.Wait()
	got := f.announcedSeqs()
	if len(got) != n {
		t.Fatalf("announced %d results, want %d", len(got), n)
	}
	for i, seq := range got {
		if seq != uint64(i+1) {
			t.Fatalf("announced result %d has seq %d, want %d: announcements out of commit order", i, seq, i+1)
		}
	}
}

// TestAnnounceBeforePass pins the order of announce and pass: a committer
// announces its group's results while it still holds the commit turn, so
// no later group commits, let alone is announced, during an announcement.
// Seq 1's announcement is held until every other goroutine is blocked
// (synctest.Wait): had its committer passed the turn first, the other
// committer would by then have committed seq 2 and announced it.
func TestAnnounceBeforePass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		f := newFixture(t, durable.Options[int, uint64]{
			Committers: 2,
			MaxBatch:   1,
			Announce: func(rs []uint64) {
				if rs[0] == 1 {
					close(entered)
					<-release
				}
			},
		})
		first := f.mustSubmit(t)
		<-entered
		second := f.mustSubmit(t)
		synctest.Wait()
		if early := f.announcedSeqs(); len(early) > 0 {
			t.Errorf("results %v announced while seq 1's announcement was under way, want none: the turn was passed before announcing", early)
		}
		close(release)
		for _, ch := range []<-chan outcome{first, second} {
			if o := wait(t, ch); o.err != nil {
				t.Errorf("op = %+v, want committed", o)
			}
		}
		if got, want := f.announcedSeqs(), []uint64{1, 2}; !slices.Equal(got, want) {
			t.Errorf("announced seqs %v, want %v", got, want)
		}
	})
}

func TestQueueFullIsBusy(t *testing.T) {
	g := newGate()
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1, MaxBatch: 1, QueueCapacity: 2, Faults: g})
	held := f.mustSubmit(t)
	g.waitEntered(t) // dequeued and held: the queue is empty again
	q1, q2 := f.mustSubmit(t), f.mustSubmit(t)
	if _, _, err := f.submit(t); !errors.Is(err, durable.ErrBusy) {
		t.Fatalf("Submit to a full queue = %v, want ErrBusy", err)
	}
	if got := f.c.QueueLen(); got != 2 {
		t.Errorf("QueueLen() = %d, want 2", got)
	}
	if got := f.metric(t, "queue_depth", "queue", "commit"); got != 2 {
		t.Errorf(`queue_depth{queue="commit"} = %v, want 2`, got)
	}
	if got := f.metric(t, "queue_dropped_total", "queue", "commit"); got != 1 {
		t.Errorf(`queue_dropped_total{queue="commit"} = %v, want 1`, got)
	}
	g.Open()
	for _, ch := range []<-chan outcome{held, q1, q2} {
		if o := wait(t, ch); o.err != nil {
			t.Errorf("op = %v", o.err)
		}
	}
}

// TestPanicAnswersGroup: a panic in Apply answers every operation of the
// group once, with ErrUnavailable, and the committer is restarted and
// commits the next group.
func TestPanicAnswersGroup(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1})
	var panics atomic.Int32
	f.app.setHook(func([]int) error {
		if panics.Add(1) == 1 {
			panic("rules broken")
		}
		return nil
	})
	if o := wait(t, f.mustSubmit(t)); !errors.Is(o.err, durable.ErrUnavailable) {
		t.Fatalf("op whose Apply panicked = %+v, want ErrUnavailable", o)
	}
	if o := wait(t, f.mustSubmit(t)); o.err != nil || o.res != 1 {
		t.Fatalf("op after the panic = %+v, want committed with seq 1", o)
	}
	if got := f.metric(t, "fake_commits_total", "kind", "op", "result", "failed"); got != 1 {
		t.Errorf("fake_commits_total{failed} = %v, want 1", got)
	}
}

func TestCommitTimeout(t *testing.T) {
	faults := &sdk.Faults{}
	faults.Declare(durable.DefaultFaultPoint) // New declares it too, after this Set
	if err := faults.Set([]sdk.Fault{{Point: durable.DefaultFaultPoint, Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1, CommitTimeout: 50 * time.Millisecond, Faults: faults})
	start := time.Now()
	o := wait(t, f.mustSubmit(t))
	if !errors.Is(o.err, durable.ErrUnavailable) || errors.Is(o.err, durable.ErrOutcomeUnknown) {
		t.Fatalf("commit timed out in the fault point = %+v, want ErrUnavailable without ErrOutcomeUnknown", o)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("timed-out commit answered after %v, want about the 50ms timeout", d)
	}
	if got := f.metric(t, "io_timeouts_total", "op", "store_commit"); got != 1 {
		t.Errorf(`io_timeouts_total{op="store_commit"} = %v, want 1`, got)
	}
	if got := f.metric(t, "backoff_retries_total", "svc", "store", "op", "store_commit"); got != 0 {
		t.Errorf("backoff_retries_total = %v, want 0: a timed-out commit is not retried", got)
	}
	if got := f.app.groupSizes(); len(got) != 0 {
		t.Errorf("groups applied = %v, want none", got)
	}
	faults.Set(nil)
	if o := wait(t, f.mustSubmit(t)); o.err != nil {
		t.Errorf("after clearing the fault: %v", o.err)
	}
}

// flakyFaults fails the next left commits and then lets them through.
type flakyFaults struct{ left atomic.Int32 }

func (f *flakyFaults) Inject(context.Context, string) error {
	if f.left.Add(-1) >= 0 {
		return errors.New("flaky disk")
	}
	return nil
}

func TestTransientErrorsRetried(t *testing.T) {
	flaky := &flakyFaults{}
	flaky.left.Store(2)
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1, Faults: flaky, Retry: backoff.Policy{Initial: time.Millisecond, Max: time.Millisecond}})
	if o := wait(t, f.mustSubmit(t)); o.err != nil || o.res != 1 {
		t.Fatalf("op with two transient failures = %+v, want committed on the third try", o)
	}
	if got := f.metric(t, "backoff_retries_total", "op", "store_commit"); got != 2 {
		t.Errorf("backoff_retries_total = %v, want 2", got)
	}
	flaky.left.Store(3)
	if o := wait(t, f.mustSubmit(t)); !errors.Is(o.err, durable.ErrUnavailable) {
		t.Errorf("op failing three times = %+v, want ErrUnavailable", o)
	}
}

// TestStalledApply stalls a group inside Apply past the commit timeout.
// Its callback runs once, at the timeout, with ErrStalled and
// ErrOutcomeUnknown; the breaker opens, Stalled says so, Health is
// degraded and Submit is refused. Once Apply returns, the group lands:
// announced, before any later group, and settled exactly once.
func TestStalledApply(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{
		Committers:    2,
		CommitTimeout: 50 * time.Millisecond,
		Breaker:       breaker.Settings{FailureThreshold: 100, Cooldown: 100 * time.Millisecond, HalfOpenMax: 1, SuccessThreshold: 1},
	})
	hook, entered, release := stall(t, 1)
	f.app.setHook(hook)
	ch := f.mustSubmit(t) // op 1
	<-entered
	o := wait(t, ch) // Apply is still blocked: only the timeout can answer
	for _, want := range []error{durable.ErrUnavailable, durable.ErrStalled, durable.ErrOutcomeUnknown} {
		if !errors.Is(o.err, want) {
			t.Errorf("stalled op's outcome = %v, want it to wrap %v", o.err, want)
		}
	}
	if s := f.c.BreakerState(); s != breaker.StateOpen {
		t.Errorf("BreakerState() during the stall = %v, want open", s)
	}
	if _, ok := f.c.Stalled(); !ok {
		t.Error("Stalled() during the stall = false, want true")
	}
	if h := f.c.Health(); h.Status != sdk.StatusDegraded {
		t.Errorf("Health() during the stall = %+v, want degraded", h)
	}
	if _, _, err := f.submit(t); !errors.Is(err, durable.ErrUnavailable) {
		t.Errorf("Submit during the stall = %v, want ErrUnavailable", err)
	}
	if got := f.settledGroups(); len(got) != 0 {
		t.Fatalf("Settled got %v while the group is stalled, want nothing", got)
	}

	release()
	waitUntil(t, "the stalled group to land", func() bool { _, ok := f.c.Stalled(); return !ok })
	waitUntil(t, "a commit after the stall", func() bool {
		_, ch, err := f.submit(t)
		if err != nil {
			return false
		}
		return wait(t, ch).err == nil
	})
	if got := f.settledGroups(); len(got) != 1 || !slices.Equal(got[0], []int{1}) {
		t.Errorf("Settled got %v, want [[1]] once", got)
	}
	if got := f.announcedSeqs(); len(got) < 2 || got[0] != 1 || !slices.IsSorted(got) {
		t.Errorf("announced %v, want the stalled group's seq 1 first, then later ones in order", got)
	}
}

// TestStalledApplyFails: a stalled group whose Apply then fails is settled
// once and announces nothing; LastError says why.
func TestStalledApplyFails(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1, CommitTimeout: 50 * time.Millisecond})
	errDisk := errors.New("disk on fire")
	hook, entered, release := stall(t, 1)
	f.app.setHook(func(ops []int) error {
		if err := hook(ops); err != nil {
			return err
		}
		if slices.Contains(ops, 1) {
			return errDisk
		}
		return nil
	})
	ch := f.mustSubmit(t)
	<-entered
	if o := wait(t, ch); !errors.Is(o.err, durable.ErrStalled) {
		t.Fatalf("stalled op's outcome = %+v, want ErrStalled", o)
	}
	release()
	waitUntil(t, "the failed group to be settled", func() bool { return len(f.settledGroups()) == 1 })
	if err := f.c.LastError(); !errors.Is(err, errDisk) {
		t.Errorf("LastError() = %v, want the failed Apply's error", err)
	}
	if got := f.announcedSeqs(); len(got) != 0 {
		t.Errorf("announced %v for a group that failed, want nothing", got)
	}
}

// TestCloseAbortsAtDeadline: Close ends at its deadline; what was queued
// is answered once with ErrDraining, and nothing of it was applied.
func TestCloseAbortsAtDeadline(t *testing.T) {
	g := newGate() // never opened
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1, MaxBatch: 2, Faults: g})
	var chans []<-chan outcome
	for range 5 {
		chans = append(chans, f.mustSubmit(t))
	}
	g.waitEntered(t)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := f.c.Close(ctx); err == nil {
		t.Errorf("Close() = nil with queued ops left at the deadline, want an error counting them")
	}
	for _, ch := range chans {
		if o := wait(t, ch); !errors.Is(o.err, durable.ErrDraining) {
			t.Errorf("op = %+v, want ErrDraining", o)
		}
	}
	if got := f.metric(t, "tasks_aborted_total", "kind", "commit"); got != 5 {
		t.Errorf("tasks_aborted_total = %v, want 5", got)
	}
	if got := f.app.groupSizes(); len(got) != 0 {
		t.Errorf("groups applied = %v, want none: aborted ops must not apply", got)
	}
	if _, _, err := f.submit(t); !errors.Is(err, durable.ErrDraining) {
		t.Errorf("Submit after Close = %v, want ErrDraining", err)
	}
}

func TestCloseFinishesQueued(t *testing.T) {
	g := newGate()
	f := newFixture(t, durable.Options[int, uint64]{Committers: 2, MaxBatch: 2, Faults: g})
	var chans []<-chan outcome
	for range 10 {
		chans = append(chans, f.mustSubmit(t))
	}
	g.waitEntered(t)
	done := make(chan error, 1)
	go func() { done <- f.c.Close(context.Background()) }()
	waitUntil(t, "Submit to answer ErrDraining", func() bool {
		_, _, err := f.submit(t)
		return errors.Is(err, durable.ErrDraining)
	})
	g.Open()
	for _, ch := range chans {
		if o := wait(t, ch); o.err != nil {
			t.Errorf("queued op = %v, want committed during Close", o.err)
		}
	}
	if err := <-done; err != nil {
		t.Errorf("Close() = %v", err)
	}
}

// TestCloseBounded: Close returns at its deadline with ErrStalled while a
// group is stalled in Apply, and again while a checkpoint is; each later
// Close, once the disk answers, returns nil.
func TestCloseBounded(t *testing.T) {
	t.Run("commit", func(t *testing.T) {
		f := newFixture(t, durable.Options[int, uint64]{Committers: 1, CommitTimeout: 50 * time.Millisecond})
		hook, entered, release := stall(t, 1)
		f.app.setHook(hook)
		ch := f.mustSubmit(t)
		<-entered
		wait(t, ch)
		closeWithin(t, f, 100*time.Millisecond, durable.ErrStalled)
		release()
		closeWithin(t, f, 10*time.Second, nil)
		if got := f.settledGroups(); len(got) != 1 {
			t.Errorf("Settled got %v, want the stalled group once", got)
		}
	})
	t.Run("callback", func(t *testing.T) {
		// A callback that blocks breaks Submit's contract; Close still
		// returns, a commit timeout and a second after its deadline.
		f := newFixture(t, durable.Options[int, uint64]{Committers: 1, CommitTimeout: 50 * time.Millisecond})
		entered, release := make(chan struct{}), make(chan struct{})
		t.Cleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})
		if err := f.c.Submit(-1, func(uint64, error) { close(entered); <-release }); err != nil {
			t.Fatalf("Submit() = %v", err)
		}
		<-entered
		closeWithin(t, f, 100*time.Millisecond, durable.ErrStalled)
		close(release)
		closeWithin(t, f, 10*time.Second, nil)
	})
	t.Run("checkpoint", func(t *testing.T) {
		f := newFixture(t, durable.Options[int, uint64]{Committers: 1})
		hold := make(chan struct{})
		t.Cleanup(func() {
			select {
			case <-hold:
			default:
				close(hold)
			}
		})
		held := make(chan struct{})
		f.store.set(func(s *fakeStore) { s.hold, s.held, s.pending, s.due = hold, held, true, true })
		f.c.CheckpointSoon()
		// Close must find the checkpoint under way: it is asked for
		// asynchronously, and a Close that came first would have nothing
		// to wait for.
		<-held
		closeWithin(t, f, 100*time.Millisecond, durable.ErrStalled)
		close(hold)
		closeWithin(t, f, 10*time.Second, nil)
	})
}

// closeWithin closes f's committer with a deadline of d and checks that
// it returns in time, with an error wrapping want (nil: no error).
func closeWithin(t *testing.T, f *fixture, d time.Duration, want error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := f.c.Close(ctx)
	if took := time.Since(start); took > d+5*time.Second {
		t.Errorf("Close() with a %v deadline took %v", d, took)
	}
	switch {
	case want == nil && err != nil:
		t.Errorf("Close() = %v, want nil", err)
	case want != nil && !errors.Is(err, want):
		t.Errorf("Close() = %v, want %v", err, want)
	}
}

// TestProberClosesBreaker: once the fault is gone, a half-open breaker
// closes by a probe of the committer's own, with no operation submitted.
func TestProberClosesBreaker(t *testing.T) {
	faults := &sdk.Faults{}
	faults.Declare(durable.DefaultFaultPoint) // New declares it too, after this Set
	if err := faults.Set([]sdk.Fault{{Point: durable.DefaultFaultPoint, Error: "disk on fire"}}); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, durable.Options[int, uint64]{
		Committers: 1,
		Faults:     faults,
		Tries:      1,
		Breaker:    breaker.Settings{FailureThreshold: 1, Cooldown: 100 * time.Millisecond},
	})
	if o := wait(t, f.mustSubmit(t)); !errors.Is(o.err, durable.ErrUnavailable) {
		t.Fatalf("commit with the fault = %+v, want ErrUnavailable", o)
	}
	if s := f.c.BreakerState(); s != breaker.StateOpen {
		t.Fatalf("BreakerState() after the failure = %v, want open", s)
	}
	if d := f.c.RetryAfter(); d < time.Second {
		t.Errorf("RetryAfter() while open = %v, want at least 1s", d)
	}
	// While the fault lasts, the probes fail at the fault point, before
	// Probe, and the breaker does not close.
	waitUntil(t, "two probes", func() bool { return f.metric(t, "fake_commit_seconds") >= 3 })
	if s := f.c.BreakerState(); s == breaker.StateClosed {
		t.Fatalf("BreakerState() while the fault lasts = %v, want not closed", s)
	}
	faults.Set(nil)
	waitUntil(t, "the breaker to close with no operation submitted", func() bool { return f.c.BreakerState() == breaker.StateClosed })
	if f.app.probes.Load() < 1 {
		t.Error("Probe never ran, yet the breaker closed")
	}
	if h := f.c.Health(); h.Status != sdk.StatusReady {
		t.Errorf("Health() after the breaker closed = %+v, want ready", h)
	}
}

// TestReopenAfterFailed: a store that a disk error failed is reopened by
// the next commit attempt, which then commits.
func TestReopenAfterFailed(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1})
	f.store.set(func(s *fakeStore) { s.err = fmt.Errorf("write log: %w", durable.ErrFailed) })
	if h := f.c.Health(); h.Status != sdk.StatusDegraded {
		t.Errorf("Health() of a failed store = %+v, want degraded", h)
	}
	if o := wait(t, f.mustSubmit(t)); o.err != nil || o.res != 1 {
		t.Fatalf("op on a failed store = %+v, want committed after Reopen", o)
	}
	f.store.mu.Lock()
	reopens := f.store.reopens
	f.store.mu.Unlock()
	if reopens != 1 {
		t.Errorf("Reopen ran %d times, want 1", reopens)
	}
}

// TestWroteNothingNotCounted: a half-open breaker is not closed by a group
// that wrote nothing (Options.Wrote): it tested nothing of the disk.
func TestWroteNothingNotCounted(t *testing.T) {
	faults := &sdk.Faults{}
	var wroteNothing atomic.Bool
	// No prober: only the test's groups probe.
	f := newFixtureProbing(t, durable.Options[int, uint64]{
		Committers: 1,
		Faults:     faults,
		Tries:      1,
		Wrote:      func([]uint64) bool { return !wroteNothing.Load() },
		Breaker:    breaker.Settings{FailureThreshold: 1, Cooldown: 100 * time.Millisecond, HalfOpenMax: 1, SuccessThreshold: 1},
	}, false)
	// New declared its fault point, so that the operator may set it.
	if got := faults.Points(); !slices.Equal(got, []string{durable.DefaultFaultPoint}) {
		t.Fatalf("fault points after New = %q, want %q", got, durable.DefaultFaultPoint)
	}
	if err := faults.Set([]sdk.Fault{{Point: durable.DefaultFaultPoint, Error: "disk on fire"}}); err != nil {
		t.Fatal(err)
	}
	if o := wait(t, f.mustSubmit(t)); !errors.Is(o.err, durable.ErrUnavailable) {
		t.Fatalf("failing commit = %+v, want ErrUnavailable", o)
	}
	faults.Set(nil)
	waitUntil(t, "the breaker to half-open", func() bool { return f.c.BreakerState() == breaker.StateHalfOpen })
	wroteNothing.Store(true)
	if o := wait(t, f.mustSubmit(t)); o.err != nil {
		t.Fatalf("group that wrote nothing = %+v", o)
	}
	if s := f.c.BreakerState(); s != breaker.StateHalfOpen {
		t.Errorf("BreakerState() after a group that wrote nothing = %v, want still half-open", s)
	}
	wroteNothing.Store(false)
	if o := wait(t, f.mustSubmit(t)); o.err != nil {
		t.Fatalf("group that wrote = %+v", o)
	}
	if s := f.c.BreakerState(); s != breaker.StateClosed {
		t.Errorf("BreakerState() after a group that wrote = %v, want closed", s)
	}
}

// TestIdleCheckpoint: a checkpoint due while nothing is submitted runs by
// the checkpointer's timer.
func TestIdleCheckpoint(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{Committers: 1})
	f.store.set(func(s *fakeStore) { s.pending, s.due = true, true })
	f.c.CheckpointSoon()
	waitUntil(t, "a checkpoint", func() bool {
		return f.metric(t, "fake_checkpoints_total", "result", "committed") >= 1
	})
}

// TestScrubber: the scrubber counts the passes Scrub reports and stops at
// the first damage.
func TestScrubber(t *testing.T) {
	var calls atomic.Int32
	f := newFixture(t, durable.Options[int, uint64]{
		ScrubEvery: time.Millisecond,
		Scrub: func() (bool, error) {
			switch n := calls.Add(1); {
			case n < 3:
				return true, nil
			case n == 3:
				return false, fmt.Errorf("page 7: %w", durable.ErrCorrupt)
			default:
				return false, errors.New("scrubbed after damage")
			}
		},
	})
	waitUntil(t, "the scrubber to meet the damage", func() bool { return calls.Load() >= 3 })
	time.Sleep(50 * time.Millisecond) // fifty more ticks: none may scrub
	if n := calls.Load(); n != 3 {
		t.Errorf("Scrub ran %d times, want 3: the scrubber stops at damage", n)
	}
	if got := f.metric(t, "fake_scrub_passes_total"); got != 2 {
		t.Errorf("fake_scrub_passes_total = %v, want 2", got)
	}
}

// TestStoreCorruptionExported: the committer of a Store that counts its
// corruptions exports the count as store_corruption_total, from 0, for
// every plugin's store under the one name the alerts select.
func TestStoreCorruptionExported(t *testing.T) {
	f := newFixture(t, durable.Options[int, uint64]{})
	if got := f.metric(t, durable.StoreCorruptionName); got != 0 {
		t.Errorf("%s = %v before any damage, want 0", durable.StoreCorruptionName, got)
	}
	f.store.corruptions.Add(2)
	if got := f.metric(t, durable.StoreCorruptionName); got != 2 {
		t.Errorf("%s = %v after the store met damage twice, want 2", durable.StoreCorruptionName, got)
	}
}

func TestNewRefuses(t *testing.T) {
	tests := []struct {
		name string
		opts durable.Options[int, uint64]
	}{
		{"no store", durable.Options[int, uint64]{Apply: (&fakeApplier{}).apply}},
		{"no apply", durable.Options[int, uint64]{Store: &fakeStore{}}},
		{"registerer without prefix", durable.Options[int, uint64]{Store: &fakeStore{}, Apply: (&fakeApplier{}).apply, Registerer: prometheus.NewRegistry()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c, err := durable.New(tt.opts); err == nil {
				_ = c.Close(context.Background())
				t.Errorf("New(%s) = nil error, want one", tt.name)
			}
		})
	}
}
