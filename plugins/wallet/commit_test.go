package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/wallettest"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/backoff"
	"github.com/plughost/plughost/sdk/breaker"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/store"
)

type fixture struct {
	c   *committer
	l   *ledger.Ledger
	reg *prometheus.Registry

	mu        sync.Mutex
	announced []*ledger.Receipt
	settled   []string // keys of the operations Settled got
}

func (f *fixture) settledKeys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.settled)
}

func newFixture(t *testing.T, opts commitOptions) *fixture {
	t.Helper()
	return newFixtureWith(t, ledger.Options{}, opts)
}

func newFixtureWith(t *testing.T, lopts ledger.Options, opts commitOptions) *fixture {
	t.Helper()
	return newFixtureHolding(t, lopts, opts, nil)
}

// newFixtureHolding is newFixtureWith whose announcements go through hold
// first.
func newFixtureHolding(t *testing.T, lopts ledger.Options, opts commitOptions, hold func([]*ledger.Receipt)) *fixture {
	t.Helper()
	l, err := ledger.Open(filepath.Join(t.TempDir(), "wallet.db"), lopts)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{l: l, reg: prometheus.NewRegistry()}
	opts.Registerer = f.reg
	// A test's own Announce runs first, so that it can hold an
	// announcement: the receipts count as announced once it returns.
	announce := func(rs []*ledger.Receipt) {
		if hold != nil {
			hold(rs)
		}
		f.mu.Lock()
		f.announced = append(f.announced, rs...)
		f.mu.Unlock()
	}
	opts.Settled = func(ops []ledger.Op) {
		f.mu.Lock()
		for _, op := range ops {
			f.settled = append(f.settled, op.Idem.Key)
		}
		f.mu.Unlock()
	}
	f.c, err = newCommitter(l, announce, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.c.Close(ctx)
		_ = l.Close()
	})
	return f
}

// outcome is what a Submit's callback received.
type outcome struct {
	res ledger.Result
	err error
}

// submit queues op and returns the channel its outcome arrives on.
func (f *fixture) submit(t *testing.T, op ledger.Op) (<-chan outcome, error) {
	t.Helper()
	ch := make(chan outcome, 1)
	err := f.c.Submit(op, func(r ledger.Result, err error) { ch <- outcome{r, err} })
	return ch, err
}

func (f *fixture) mustSubmit(t *testing.T, op ledger.Op) <-chan outcome {
	t.Helper()
	ch, err := f.submit(t, op)
	if err != nil {
		t.Fatalf("Submit(%+v) = %v", op, err)
	}
	return ch
}

func wait(t *testing.T, ch <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(20 * time.Second):
		t.Fatal("no result within 20s")
		return outcome{}
	}
}

// metric returns the value of a counter or gauge, or the sample count of
// a histogram, with the given labels.
func (f *fixture) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	fams, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		if fam.GetName() != name {
			continue
		}
	next:
		for _, m := range fam.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

func issue(to string, amount uint64) ledger.Op {
	return ledger.Op{Kind: ledger.KindIssue, To: to, Amount: amount}
}

func transfer(from, to string, amount, nonce uint64) ledger.Op {
	return ledger.Op{Kind: ledger.KindTransfer, From: from, To: to, Amount: amount, Nonce: nonce}
}

func TestGroupCommit(t *testing.T) {
	gate := wallettest.NewGate()
	f := newFixture(t, commitOptions{Committers: 1, MaxBatch: 64, Faults: gate})
	first := f.mustSubmit(t, issue("a", 1))
	gate.WaitEntered(t)
	// While the first group is held, these queue up; they all fit in the
	// next group, so they share one transaction.
	var chans []<-chan outcome
	for i := range 100 {
		chans = append(chans, f.mustSubmit(t, issue(fmt.Sprintf("acct-%d", i), 1)))
	}
	gate.Open()
	if o := wait(t, first); o.err != nil || o.res.Receipt == nil {
		t.Fatalf("first op = %+v", o)
	}
	groups := map[time.Time]int{}
	for _, ch := range chans {
		o := wait(t, ch)
		if o.err != nil || o.res.Receipt == nil {
			t.Fatalf("queued op = %+v", o)
		}
		groups[o.res.Receipt.CommittedAt]++
	}
	// 100 queued ops in groups of at most 64: two groups.
	if len(groups) != 2 {
		t.Errorf("100 queued ops committed in %d groups %v, want 2 (max_batch 64)", len(groups), groups)
	}
	if got := f.metric(t, "wallet_commit_batch_size"); got != 3 {
		t.Errorf("wallet_commit_batch_size count = %v, want 3 groups", got)
	}
	if got := f.metric(t, "wallet_commits_total", "kind", "issue", "result", "committed"); got != 101 {
		t.Errorf("wallet_commits_total{issue,committed} = %v, want 101", got)
	}
}

func TestNonceRaceOneWinner(t *testing.T) {
	f := newFixture(t, commitOptions{Committers: 4, MaxBatch: 8})
	if o := wait(t, f.mustSubmit(t, issue("a", 1000))); o.err != nil {
		t.Fatal(o.err)
	}
	for nonce := uint64(1); nonce <= 5; nonce++ {
		var chans []<-chan outcome
		for i := range 20 {
			chans = append(chans, f.mustSubmit(t, transfer("a", fmt.Sprintf("b%d", i), 1, nonce)))
		}
		wins := 0
		for _, ch := range chans {
			o := wait(t, ch)
			switch {
			case o.err != nil:
				t.Fatalf("op failed: %v", o.err)
			case o.res.Err == nil:
				wins++
			case !errors.Is(o.res.Err, ledger.ErrNonceMismatch):
				t.Errorf("loser's Err = %v, want a nonce mismatch", o.res.Err)
			}
		}
		if wins != 1 {
			t.Errorf("nonce %d: %d of 20 racing transfers won, want exactly 1", nonce, wins)
		}
	}
}

func TestAnnounceInSeqOrder(t *testing.T) {
	f := newFixture(t, commitOptions{Committers: 4, MaxBatch: 4})
	const n = 400
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ch, err := f.submit(t, issue(fmt.Sprintf("a%d", i%7), 1))
			for errors.Is(err, durable.ErrBusy) {
				time.Sleep(time.Millisecond) // back off like a client told 429
				ch, err = f.submit(t, issue(fmt.Sprintf("a%d", i%7), 1))
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
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.announced) != n {
		t.Fatalf("announced %d receipts, want %d", len(f.announced), n)
	}
	for i, r := range f.announced {
		if r.Seq != uint64(i+1) {
			t.Fatalf("announced receipt %d has seq %d, want %d: announcements out of order", i, r.Seq, i+1)
		}
	}
}

// TestAnnounceBeforePass pins the order of announce and pass: a committer
// announces its group's receipts while it still holds the commit turn, so
// no later group commits, let alone is announced, during an announcement.
// Seq 1's announcement is held until every other goroutine is blocked
// (synctest.Wait): had its committer passed the turn first, the other
// committer would by then have committed seq 2 and announced it.
// TestAnnounceInSeqOrder catches a swap only when a whole commit happens
// to fit between the two calls.
func TestAnnounceBeforePass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		f := newFixtureHolding(t, ledger.Options{}, commitOptions{
			Committers: 2,
			MaxBatch:   1,
		}, func(rs []*ledger.Receipt) {
			if rs[0].Seq == 1 {
				close(entered)
				<-release
			}
		})
		first := f.mustSubmit(t, issue("a", 1))
		<-entered
		second := f.mustSubmit(t, issue("b", 1))
		synctest.Wait()
		f.mu.Lock()
		early := seqs(f.announced)
		f.mu.Unlock()
		if len(early) > 0 {
			t.Errorf("receipts %v announced while seq 1's announcement was under way, want none: the turn was passed before announcing", early)
		}
		close(release)
		for _, ch := range []<-chan outcome{first, second} {
			if o := wait(t, ch); o.err != nil || o.res.Receipt == nil {
				t.Errorf("op = %+v, want committed", o)
			}
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if got, want := seqs(f.announced), []uint64{1, 2}; !slices.Equal(got, want) {
			t.Errorf("announced seqs %v, want %v", got, want)
		}
	})
}

func seqs(rs []*ledger.Receipt) []uint64 {
	var out []uint64
	for _, r := range rs {
		out = append(out, r.Seq)
	}
	return out
}

func TestQueueFullIsBusy(t *testing.T) {
	gate := wallettest.NewGate()
	f := newFixture(t, commitOptions{Committers: 1, MaxBatch: 1, QueueCapacity: 2, Faults: gate})
	held := f.mustSubmit(t, issue("a", 1))
	gate.WaitEntered(t) // dequeued and held: the queue is empty again
	q1, q2 := f.mustSubmit(t, issue("a", 1)), f.mustSubmit(t, issue("a", 1))
	if _, err := f.submit(t, issue("a", 1)); !errors.Is(err, durable.ErrBusy) {
		t.Fatalf("Submit to a full queue = %v, want ErrBusy", err)
	}
	if got := f.c.QueueLen(); got != 2 {
		t.Errorf("QueueLen() = %d, want 2", got)
	}
	gate.Open()
	for _, ch := range []<-chan outcome{held, q1, q2} {
		if o := wait(t, ch); o.err != nil {
			t.Errorf("op = %v", o.err)
		}
	}
}

func TestCommitTimeout(t *testing.T) {
	faults := walletFaults()
	if err := faults.Set([]sdk.Fault{{Point: commitFaultPoint, Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, commitOptions{Committers: 1, CommitTimeout: 50 * time.Millisecond, Faults: faults})
	start := time.Now()
	o := wait(t, f.mustSubmit(t, issue("a", 1)))
	if !errors.Is(o.err, durable.ErrUnavailable) {
		t.Fatalf("stalled commit = %+v, want ErrUnavailable", o)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stalled commit answered after %v, want about the 50ms timeout", d)
	}
	if got := f.metric(t, "io_timeouts_total", "op", "ledger_commit"); got != 1 {
		t.Errorf("io_timeouts_total = %v, want 1", got)
	}
	if got := f.metric(t, "backoff_retries_total", "op", "ledger_commit"); got != 0 {
		t.Errorf("backoff_retries_total = %v, want 0: a timed-out commit is not retried", got)
	}
	if got, _, _ := f.l.Supply(); got.Issued != 0 {
		t.Errorf("Supply().Issued = %d after a failed commit, want 0", got.Issued)
	}
	faults.Set(nil)
	if o := wait(t, f.mustSubmit(t, issue("a", 1))); o.err != nil {
		t.Errorf("after clearing the fault: %v", o.err)
	}
}

// flakyFaults is a fake fault set that fails the first n commits and then
// lets them through; sdk.Faults cannot count.
// TestProbeThatWritesNothing checks that a half-open breaker is not closed
// by a group that wrote nothing (a replay): it tested nothing of the disk.
func TestProbeThatWritesNothing(t *testing.T) {
	faults := walletFaults()
	f := newFixture(t, commitOptions{
		Committers: 1,
		Faults:     faults,
		Retry:      backoff.Policy{Initial: time.Millisecond, Max: time.Millisecond},
		Breaker:    breaker.Settings{FailureThreshold: 1, Cooldown: 200 * time.Millisecond, HalfOpenMax: 1, SuccessThreshold: 1},
	})
	paid := issue("a", 1)
	paid.Idem = &ledger.Idem{Key: "paid"}
	if o := wait(t, f.mustSubmit(t, paid)); o.err != nil || o.res.Err != nil {
		t.Fatalf("first commit = %+v", o)
	}
	if err := faults.Set([]sdk.Fault{{Point: commitFaultPoint, Error: "disk on fire"}}); err != nil {
		t.Fatal(err)
	}
	if o := wait(t, f.mustSubmit(t, issue("a", 1))); !errors.Is(o.err, durable.ErrUnavailable) {
		t.Fatalf("failing commit = %+v, want ErrUnavailable", o)
	}
	faults.Set(nil)
	deadline := time.Now().Add(10 * time.Second)
	for f.c.BreakerState() != breaker.StateHalfOpen {
		if time.Now().After(deadline) {
			t.Fatalf("BreakerState() = %v 10s after it opened, want half-open", f.c.BreakerState())
		}
		time.Sleep(10 * time.Millisecond) // poll for the cool-down to pass
	}
	o := wait(t, f.mustSubmit(t, paid))
	if o.err != nil || !o.res.Replayed {
		t.Fatalf("replay as a probe = %+v, want it replayed", o)
	}
	if s := f.c.BreakerState(); s != breaker.StateHalfOpen {
		t.Errorf("BreakerState() after a probe that wrote nothing = %v, want still half-open", s)
	}
	if o := wait(t, f.mustSubmit(t, issue("b", 1))); o.err != nil || o.res.Err != nil {
		t.Fatalf("probe that writes = %+v", o)
	}
	if s := f.c.BreakerState(); s != breaker.StateClosed {
		t.Errorf("BreakerState() after a probe that wrote = %v, want closed", s)
	}
}

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
	f := newFixture(t, commitOptions{Committers: 1, Faults: flaky})
	if o := wait(t, f.mustSubmit(t, issue("a", 1))); o.err != nil || o.res.Receipt == nil {
		t.Fatalf("op with two transient failures = %+v, want committed on the third try", o)
	}
	if got := f.metric(t, "backoff_retries_total", "op", "ledger_commit"); got != 2 {
		t.Errorf("backoff_retries_total = %v, want 2", got)
	}
	flaky.left.Store(3)
	if o := wait(t, f.mustSubmit(t, issue("a", 1))); !errors.Is(o.err, durable.ErrUnavailable) {
		t.Errorf("op failing three times = %+v, want ErrUnavailable", o)
	}
}

func TestCommitBreaker(t *testing.T) {
	faults := walletFaults()
	if err := faults.Set([]sdk.Fault{{Point: commitFaultPoint, Error: "disk on fire"}}); err != nil {
		t.Fatal(err)
	}
	// open. At 100ms the failing op's own retry delay after the breaker
	// opened (80-100ms) used most of it, and the checks below sometimes
	// found the breaker half-open.
	f := newFixture(t, commitOptions{
		Committers: 1,
		Faults:     faults,
		Breaker:    breaker.Settings{FailureThreshold: 2, Cooldown: 2 * time.Second, HalfOpenMax: 1, SuccessThreshold: 1},
	})
	o := wait(t, f.mustSubmit(t, issue("a", 1)))
	if !errors.Is(o.err, durable.ErrUnavailable) {
		t.Fatalf("failing commit = %+v, want ErrUnavailable", o)
	}
	if s := f.c.BreakerState(); s != breaker.StateOpen {
		t.Fatalf("BreakerState() = %v after 2 failures, want open", s)
	}
	if _, err := f.submit(t, issue("a", 1)); !errors.Is(err, durable.ErrUnavailable) {
		t.Errorf("Submit while open = %v, want ErrUnavailable", err)
	}
	if ra := f.c.RetryAfter(); ra < time.Second {
		t.Errorf("RetryAfter() = %v, want at least 1s", ra)
	}
	if got := f.metric(t, "wallet_breaker_state"); got != 1 {
		t.Errorf("wallet_breaker_state = %v, want 1 (open)", got)
	}
	faults.Set(nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ch, err := f.submit(t, issue("a", 1))
		if err == nil {
			if o := wait(t, ch); o.err != nil {
				t.Fatalf("probe after clearing the fault = %v", o.err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Submit still refused 10s after clearing the fault: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // poll for the cool-down to pass
	}
	if s := f.c.BreakerState(); s != breaker.StateClosed {
		t.Errorf("BreakerState() = %v after a successful probe, want closed", s)
	}
}

func TestCloseFinishesQueued(t *testing.T) {
	gate := wallettest.NewGate()
	f := newFixture(t, commitOptions{Committers: 2, MaxBatch: 2, Faults: gate})
	var chans []<-chan outcome
	for range 10 {
		chans = append(chans, f.mustSubmit(t, issue("a", 1)))
	}
	gate.WaitEntered(t)
	done := make(chan error, 1)
	go func() { done <- f.c.Close(context.Background()) }()
	// Intake is closed at once…
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := f.submit(t, issue("a", 1))
		if errors.Is(err, durable.ErrDraining) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Submit during Close = %v, want ErrDraining", err)
		}
		time.Sleep(time.Millisecond) // poll: Close runs on another goroutine
	}
	// …and what was queued commits.
	gate.Open()
	for _, ch := range chans {
		if o := wait(t, ch); o.err != nil {
			t.Errorf("queued op = %v, want committed during Close", o.err)
		}
	}
	if err := <-done; err != nil {
		t.Errorf("Close() = %v", err)
	}
	if got := f.metric(t, "tasks_aborted_total", "kind", "commit"); got != 0 {
		t.Errorf("tasks_aborted_total = %v, want 0", got)
	}
}

func TestCloseAbortsAtDeadline(t *testing.T) {
	gate := wallettest.NewGate() // never opened
	f := newFixture(t, commitOptions{Committers: 1, MaxBatch: 2, Faults: gate})
	var chans []<-chan outcome
	for range 5 {
		chans = append(chans, f.mustSubmit(t, issue("a", 1)))
	}
	gate.WaitEntered(t)
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
	if got, _, _ := f.l.Supply(); got.Issued != 0 {
		t.Errorf("Supply().Issued = %d, want 0: aborted ops must not apply", got.Issued)
	}
}

// TestIdleCheckpoint checks that groups do not stay in the ledger's
// write-ahead log when no more operations come: the committer checkpoints
// once the interval has passed, without a group to follow.
func TestIdleCheckpoint(t *testing.T) {
	f := newFixtureWith(t, ledger.Options{CheckpointInterval: 20 * time.Millisecond}, commitOptions{Committers: 2})
	if o := wait(t, f.mustSubmit(t, issue("a", 1))); o.err != nil || o.res.Err != nil {
		t.Fatalf("issue = %+v", o)
	}
	// The checkpointer counts its checkpoint after the store has
	// committed it (Pending false): wait for both.
	deadline := time.Now().Add(10 * time.Second)
	for f.l.Pending() || f.metric(t, "wallet_checkpoints_total", "result", "committed") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("10s after the group committed: pending %t, wallet_checkpoints_total{result=committed} = %v; want a committed checkpoint",
				f.l.Pending(), f.metric(t, "wallet_checkpoints_total", "result", "committed"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The committer still takes operations after its timed wait.
	if o := wait(t, f.mustSubmit(t, transfer("a", "b", 1, 1))); o.err != nil || o.res.Err != nil {
		t.Fatalf("transfer after the checkpoint = %+v", o)
	}
}

// stallingSync returns ledger options whose log fdatasync blocks, while
// stall is set, until release is called; entered receives a value when a
// sync blocks. release is called at the end of the test at the latest.
func stallingSync() (lopts ledger.Options, stall *atomic.Bool, entered <-chan struct{}, release func()) {
	return stallingSyncAfter(0)
}

// stallingSyncAfter is stallingSync, but it lets pass syncs through after
// stall is set before it blocks one.
func stallingSyncAfter(pass int32) (lopts ledger.Options, stall *atomic.Bool, entered <-chan struct{}, release func()) {
	lopts, stall, entered, release, _ = stallingSyncFailing(pass)
	return lopts, stall, entered, release
}

// stallingSyncFailing is stallingSyncAfter, and a blocked sync fails with
// errDiskOnFire once released if fail is set.
func stallingSyncFailing(pass int32) (lopts ledger.Options, stall *atomic.Bool, entered <-chan struct{}, release func(), fail *atomic.Bool) {
	fail = &atomic.Bool{}
	hooks := &store.Hooks{}
	stall = &atomic.Bool{}
	var passing atomic.Int32
	passing.Store(pass)
	in := make(chan struct{}, 1)
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	hooks.SetSync(func(f *os.File) error {
		if stall.Load() && passing.Add(-1) < 0 {
			select {
			case in <- struct{}{}:
			default:
			}
			<-gate
			if fail.Load() {
				return errDiskOnFire
			}
		}
		return store.Fdatasync(f)
	})
	return ledger.Options{Hooks: hooks}, stall, in, release, fail
}

var errDiskOnFire = errors.New("disk on fire")

// TestStalledSyncFails: a stalled commit whose fdatasync then fails
// applied nothing. Its keys are settled, and a retry commits afresh.
func TestStalledSyncFails(t *testing.T) {
	lopts, stall, entered, release, fail := stallingSyncFailing(0)
	f := newFixtureWith(t, lopts, commitOptions{
		Committers:    1,
		CommitTimeout: 100 * time.Millisecond,
		Breaker:       breaker.Settings{Cooldown: 100 * time.Millisecond},
	})
	t.Cleanup(release)
	stall.Store(true)
	fail.Store(true)
	ch := f.mustSubmit(t, keyed(issue("a", 5), "k1"))
	waitEntered(t, entered)
	if o := wait(t, ch); !errors.Is(o.err, durable.ErrStalled) {
		t.Fatalf("stalled commit's outcome = %+v, want ErrStalled", o)
	}
	stall.Store(false)
	release()
	waitUntil(t, "the failed commit to be settled", func() bool { return len(f.settledKeys()) == 1 })
	if _, ok, err := f.l.Idempotency("k1"); err != nil || ok {
		t.Fatalf("Idempotency(k1) after the failed stalled commit = %v, %v; want no record", ok, err)
	}
	if err := f.c.LastError(); !errors.Is(err, errDiskOnFire) {
		t.Errorf("LastError() = %v, want the failed sync's error", err)
	}
	waitUntil(t, "the retry to commit", func() bool {
		ch, err := f.submit(t, keyed(issue("a", 5), "k1"))
		if err != nil {
			return false
		}
		o := wait(t, ch)
		if o.err == nil && o.res.Replayed {
			t.Fatalf("retry of k1 = a replay, want a fresh commit: the failed commit applied nothing")
		}
		return o.err == nil
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.announced) != 1 || f.announced[0].Seq != 1 {
		t.Errorf("announced %v, want only the retry's receipt, seq 1", f.announced)
	}
}

func keyed(op ledger.Op, key string) ledger.Op {
	op.Idem = &ledger.Idem{Key: key, Fingerprint: [32]byte{1}}
	return op
}

// TestStalledSync stalls the log's fdatasync inside a group's commit. The
// group's caller is answered ErrOutcomeUnknown while the sync is still
// blocked, the breaker opens, Submit is refused at once and Stalled says
// so. Once the sync returns the group lands: announced, its idempotency
// record in the ledger. A later commit goes through when the breaker
// probes, announced after it.
func TestStalledSync(t *testing.T) {
	lopts, stall, entered, release := stallingSync()
	f := newFixtureWith(t, lopts, commitOptions{
		Committers:    1,
		CommitTimeout: 100 * time.Millisecond,
		Breaker:       breaker.Settings{FailureThreshold: 100, Cooldown: 300 * time.Millisecond, HalfOpenMax: 1, SuccessThreshold: 1},
	})
	t.Cleanup(release) // before the fixture's Close, which waits for the stalled commit

	stall.Store(true)
	ch := f.mustSubmit(t, keyed(issue("a", 5), "k1"))
	waitEntered(t, entered)
	o := wait(t, ch) // the sync is still blocked: only the timeout can answer
	if !errors.Is(o.err, ledger.ErrOutcomeUnknown) || !errors.Is(o.err, durable.ErrUnavailable) || !errors.Is(o.err, durable.ErrStalled) {
		t.Fatalf("stalled commit's outcome = %+v, want ErrUnavailable, ErrStalled and ErrOutcomeUnknown", o)
	}
	if s := f.c.BreakerState(); s != breaker.StateOpen {
		t.Errorf("BreakerState() during the stall = %v, want open", s)
	}
	if _, ok := f.c.Stalled(); !ok {
		t.Error("Stalled() during the stall = false, want true")
	}
	if _, err := f.submit(t, keyed(issue("a", 1), "k2")); !errors.Is(err, durable.ErrUnavailable) {
		t.Errorf("Submit during the stall = %v, want ErrUnavailable", err)
	}
	if got := f.metric(t, "io_timeouts_total"); got < 1 {
		t.Errorf("io_timeouts_total = %v after the stall, want >= 1", got)
	}
	f.mu.Lock()
	n := len(f.announced)
	f.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d receipts announced while the commit is stalled, want 0", n)
	}

	stall.Store(false)
	release()
	waitUntil(t, "the stalled commit to land", func() bool { _, ok := f.c.Stalled(); return !ok })
	rec, ok, err := f.l.Idempotency("k1")
	if err != nil || !ok {
		t.Fatalf("Idempotency(k1) after the stall = %v, %v; want the record of the commit that landed", ok, err)
	}
	if rec.Status != 200 {
		t.Errorf("k1's record after the stall has status %d, want 200 (the issue committed)", rec.Status)
	}
	if got := f.settledKeys(); len(got) != 1 || got[0] != "k1" {
		t.Errorf("Settled got keys %v, want [k1]", got)
	}

	// The breaker probes once its cool-down has passed.
	waitUntil(t, "a commit after the stall", func() bool {
		ch, err := f.submit(t, keyed(issue("a", 1), "k3"))
		if err != nil {
			return false
		}
		o := wait(t, ch)
		if o.err != nil && !errors.Is(o.err, durable.ErrUnavailable) {
			t.Fatalf("commit after the stall = %v", o.err)
		}
		return o.err == nil
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.announced) != 2 || f.announced[0].Seq != 1 || f.announced[1].Seq != 2 {
		t.Errorf("announced %d receipts %v, want seqs 1 (the stalled group) then 2", len(f.announced), f.announced)
	}
}

// TestCloseWhileStalled: Close returns ErrStalled at its deadline while a
// commit is stalled on the disk, and the commit still lands afterwards.
func TestCloseWhileStalled(t *testing.T) {
	lopts, stall, entered, release := stallingSync()
	f := newFixtureWith(t, lopts, commitOptions{Committers: 1, CommitTimeout: 50 * time.Millisecond})
	t.Cleanup(release)
	stall.Store(true)
	ch := f.mustSubmit(t, keyed(issue("a", 5), "k1"))
	waitEntered(t, entered)
	if o := wait(t, ch); !errors.Is(o.err, ledger.ErrOutcomeUnknown) {
		t.Fatalf("stalled commit's outcome = %+v, want ErrOutcomeUnknown", o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := f.c.Close(ctx); !errors.Is(err, durable.ErrStalled) {
		t.Fatalf("Close during the stall = %v, want ErrStalled", err)
	}
	release()
	if err := f.c.Close(context.Background()); err != nil {
		t.Errorf("Close after the stall ended = %v, want nil", err)
	}
	if _, ok, err := f.l.Idempotency("k1"); err != nil || !ok {
		t.Errorf("Idempotency(k1) after the stall = %v, %v; want the record", ok, err)
	}
}

// waitEntered waits for a sync to block in stallingSync's hook.
func waitEntered(t *testing.T, entered <-chan struct{}) {
	t.Helper()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("no fdatasync blocked within 20s")
	}
}

// TestStalledCheckpoint stalls the fdatasync of a checkpoint's switch to
// the log's next generation, which holds the ledger's writer lock. It
// runs on the checkpointer, so the committer is not held: the next group
// waits for the lock, is abandoned at the timeout (ErrStalled), and
// later ones are refused at once. Close stops waiting at its deadline.
// Once the sync returns, the group lands and Close returns nil.
func TestStalledCheckpoint(t *testing.T) {
	// The first sync after stall is set is the first commit's; the next
	// is the checkpoint's switch to the log's next generation (the group
	// waits in the log, and the checkpoint is due within a millisecond).
	lopts, stall, entered, release := stallingSyncAfter(1)
	lopts.CheckpointInterval = time.Millisecond
	f := newFixtureWith(t, lopts, commitOptions{
		Committers:    1,
		CommitTimeout: 100 * time.Millisecond,
		Breaker:       breaker.Settings{Cooldown: time.Minute},
	})
	t.Cleanup(release)
	stall.Store(true)
	if o := wait(t, f.mustSubmit(t, keyed(issue("a", 5), "k1"))); o.err != nil {
		t.Fatalf("first commit = %v", o.err)
	}
	waitEntered(t, entered)
	o := wait(t, f.mustSubmit(t, keyed(issue("a", 1), "k2")))
	if !errors.Is(o.err, durable.ErrStalled) || !errors.Is(o.err, ledger.ErrOutcomeUnknown) {
		t.Fatalf("commit during a stalled checkpoint = %+v, want ErrStalled and ErrOutcomeUnknown", o)
	}
	if _, ok := f.c.Stalled(); !ok {
		t.Error("Stalled() during the stalled checkpoint = false, want true")
	}
	if _, err := f.submit(t, keyed(issue("a", 1), "k3")); !errors.Is(err, durable.ErrUnavailable) {
		t.Errorf("Submit during the stalled checkpoint = %v, want ErrUnavailable at once", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := f.c.Close(ctx); !errors.Is(err, durable.ErrStalled) {
		t.Fatalf("Close during the stalled checkpoint = %v, want ErrStalled", err)
	}
	stall.Store(false)
	release()
	if err := f.c.Close(context.Background()); err != nil {
		t.Errorf("Close after the stall ended = %v, want nil", err)
	}
	if rec, ok, err := f.l.Idempotency("k2"); err != nil || !ok || rec.Status != 200 {
		t.Errorf("Idempotency(k2) after the stall = %+v, %v, %v; want its 200 record", rec, ok, err)
	}
}

// waitUntil polls cond every 10ms for up to 20s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 20s waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // poll
	}
}

// TestProberClosesBreaker: once the fault is gone, a half-open breaker
// closes by a probe of the committer's own, with no operation submitted.
func TestProberClosesBreaker(t *testing.T) {
	faults := walletFaults()
	if err := faults.Set([]sdk.Fault{{Point: commitFaultPoint, Error: "disk on fire"}}); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, commitOptions{
		Committers: 1,
		Faults:     faults,
		Tries:      1,
		Breaker:    breaker.Settings{FailureThreshold: 1, Cooldown: 200 * time.Millisecond},
	})
	if o := wait(t, f.mustSubmit(t, issue("a", 1))); !errors.Is(o.err, durable.ErrUnavailable) {
		t.Fatalf("commit with the fault = %+v, want ErrUnavailable", o)
	}
	if s := f.c.BreakerState(); s != breaker.StateOpen {
		t.Fatalf("BreakerState() after the failure = %v, want open", s)
	}
	// While the fault lasts, the probes fail (each is a commit attempt)
	// and it does not close.
	waitUntil(t, "two probes", func() bool { return f.metric(t, "wallet_commit_seconds") >= 3 })
	if s := f.c.BreakerState(); s == breaker.StateClosed {
		t.Fatalf("BreakerState() while the fault lasts = %v, want not closed", s)
	}
	faults.Set(nil)
	waitUntil(t, "the breaker to close with no operation submitted", func() bool { return f.c.BreakerState() == breaker.StateClosed })
}
