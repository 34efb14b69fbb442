package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/wallettest"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/breaker"
	"github.com/plughost/plughost/sdk/durable"
)

// sweepFixture is a committer over a ledger whose records expire a minute
// after their commit, on a clock the test moves, with a fault set on the
// commit fault point and a breaker that one failure opens for coolDown.
type sweepFixture struct {
	*fixture
	clk    *wallettest.Clock
	faults *sdk.Faults
	n      int // keys recorded so far
}

func newSweepFixture(t *testing.T, coolDown time.Duration) *sweepFixture {
	t.Helper()
	clk := wallettest.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	faults := walletFaults()
	f := newFixtureWith(t, ledger.Options{IdempotencyTTL: time.Minute, Now: clk.Now}, commitOptions{
		Committers: 1,
		Faults:     faults,
		Breaker:    breaker.Settings{FailureThreshold: 1, Cooldown: coolDown, HalfOpenMax: 1, SuccessThreshold: 1},
	})
	return &sweepFixture{fixture: f, clk: clk, faults: faults}
}

// record commits n issues with keys of their own, one group each.
func (f *sweepFixture) record(t *testing.T, n int) {
	t.Helper()
	for range n {
		op := issue("alice", 1)
		op.Idem = &ledger.Idem{Key: fmt.Sprintf("k%d", f.n)}
		f.n++
		if o := wait(t, f.mustSubmit(t, op)); o.err != nil || o.res.Receipt == nil {
			t.Fatalf("issue with key %s = %+v", op.Idem.Key, o)
		}
	}
}

func (f *sweepFixture) expired(t *testing.T) bool {
	t.Helper()
	ok, err := f.l.Expired()
	if err != nil {
		t.Fatalf("Expired() = %v", err)
	}
	return ok
}

// openBreaker fails one commit, which opens the breaker.
func (f *sweepFixture) openBreaker(t *testing.T) {
	t.Helper()
	if err := f.faults.Set([]sdk.Fault{{Point: commitFaultPoint, Error: "disk on fire"}}); err != nil {
		t.Fatal(err)
	}
	if o := wait(t, f.mustSubmit(t, issue("bob", 1))); !errors.Is(o.err, durable.ErrUnavailable) {
		t.Fatalf("commit with the fault set = %+v, want ErrUnavailable", o)
	}
	if s := f.c.BreakerState(); s != breaker.StateOpen {
		t.Fatalf("BreakerState() after a failed commit = %v, want open", s)
	}
}

// TestSweepThroughCommitter pins that the sweeper's sweeps are operations
// of the committer: one runs as a committed group of its own kind and
// result, not counted as a client's operation; none is queued when
// nothing has expired; and while the breaker is open the sweep is
// deferred, queueing nothing and leaving the records.
func TestSweepThroughCommitter(t *testing.T) {
	f := newSweepFixture(t, time.Hour)
	f.record(t, 3)
	f.clk.Add(time.Minute)
	if !f.expired(t) {
		t.Fatal("Expired() = false with three records a minute old")
	}
	groups := f.metric(t, "wallet_commit_batch_size")
	if n, err := sweepExpired(t.Context(), f.l, f.c); n != 3 || err != nil {
		t.Fatalf("sweepExpired() = %d, %v; want 3 records swept", n, err)
	}
	if f.expired(t) {
		t.Error("Expired() = true after the sweep")
	}
	if got := f.metric(t, "wallet_commit_batch_size"); got != groups+1 {
		t.Errorf("wallet_commit_batch_size count = %v after a sweep, want %v: one group committed", got, groups+1)
	}
	if got := f.metric(t, "wallet_commits_total", "kind", "sweep", "result", "swept"); got != 1 {
		t.Errorf(`wallet_commits_total{kind="sweep",result="swept"} = %v, want 1`, got)
	}
	if got := f.metric(t, "wallet_commits_total", "kind", "issue", "result", "committed"); got != 3 {
		t.Errorf(`wallet_commits_total{kind="issue",result="committed"} = %v, want 3: a sweep is no client's operation`, got)
	}

	// Nothing expired: no group.
	if n, err := sweepExpired(t.Context(), f.l, f.c); n != 0 || err != nil {
		t.Errorf("sweepExpired() with nothing expired = %d, %v; want 0, nil", n, err)
	}
	if got := f.metric(t, "wallet_commit_batch_size"); got != groups+1 {
		t.Errorf("wallet_commit_batch_size count = %v after a sweep with nothing expired, want %v: no group", got, groups+1)
	}

	f.record(t, 2)
	f.clk.Add(time.Minute)
	f.openBreaker(t)
	refused := f.metric(t, "upstream_fail_total")
	if n, err := sweepExpired(t.Context(), f.l, f.c); n != 0 || !errors.Is(err, errSweepDeferred) {
		t.Errorf("sweepExpired() with the breaker open = %d, %v; want 0 and errSweepDeferred", n, err)
	}
	if !f.expired(t) {
		t.Error("Expired() = false after a sweep the open breaker deferred: the records must stay")
	}
	if got := f.metric(t, "upstream_fail_total"); got != refused {
		t.Errorf("upstream_fail_total = %v after a deferred sweep, want %v: the sweeper submits nothing while the breaker is open", got, refused)
	}
}

// TestSweeperRetriesAfterBreaker runs the sweeper's loop while the
// breaker is open: its sweeps are deferred and the records stay, and once
// the cool-down has passed a later tick sweeps them and the breaker
// closes.
func TestSweeperRetriesAfterBreaker(t *testing.T) {
	f := newSweepFixture(t, 2*time.Second)
	f.record(t, 4)
	f.clk.Add(time.Minute)
	f.openBreaker(t)
	f.faults.Set(nil) // the prober closes the breaker after the cool-down
	logs := &syncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})

	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { _ = sweep(ctx, f.l, f.c, 10*time.Millisecond, logger) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	waitUntil(t, "the sweeper to defer a sweep while the breaker is open", func() bool {
		return strings.Contains(logs.String(), "idempotency sweep deferred")
	})
	if s := f.c.BreakerState(); s != breaker.StateOpen {
		t.Fatalf("BreakerState() = %v when the sweep was deferred, want open: the cool-down is two seconds", s)
	}
	if !f.expired(t) {
		t.Fatal("Expired() = false while the breaker is open: a sweep went around the committer")
	}
	waitUntil(t, "the sweeper to sweep once the breaker lets commits through", func() bool { return !f.expired(t) })
	// The sweep's commit may be the half-open breaker's one trial call:
	// its records are gone when the commit applies, and the breaker
	// closes when the committer then counts its success.
	waitUntil(t, "the breaker to close", func() bool { return f.c.BreakerState() == breaker.StateClosed })
	if got := f.metric(t, "wallet_commits_total", "kind", "sweep", "result", "swept"); got < 1 {
		t.Errorf(`wallet_commits_total{kind="sweep",result="swept"} = %v, want at least 1`, got)
	}
}

// syncBuffer is a log output that the test reads while the sweeper
// writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
