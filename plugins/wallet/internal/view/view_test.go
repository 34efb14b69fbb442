package view_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/view"
	"github.com/plughost/plughost/plugins/wallet/internal/wallettest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newLedger(t *testing.T) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(filepath.Join(t.TempDir(), "wallet.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// issue commits an issue straight to the ledger, bypassing the view, and
// returns its seq.
func issue(t *testing.T, l *ledger.Ledger, to string, amount uint64) uint64 {
	t.Helper()
	res, err := l.Apply(t.Context(), []ledger.Op{{Kind: ledger.KindIssue, To: to, Amount: amount}})
	if err != nil || res[0].Receipt == nil {
		t.Fatalf("Apply(issue) = %+v, %v", res, err)
	}
	return res[0].Receipt.Seq
}

func balance(t *testing.T, v *view.View, id string) view.Account {
	t.Helper()
	a, err := v.Account(t.Context(), id, 0, 0)
	if err != nil {
		t.Fatalf("Account(%q) = %v", id, err)
	}
	return a
}

func TestStalenessWindow(t *testing.T) {
	l := newLedger(t)
	clk := wallettest.NewClock(time.Unix(1000, 0))
	v := view.New(view.Options{Source: l, Window: 250 * time.Millisecond, Now: clk.Now}, l.Seq())
	issue(t, l, "a", 5)
	first := balance(t, v, "a")
	if first.Balance != 5 || first.Seq != 1 || !first.AsOf.Equal(clk.Now()) {
		t.Fatalf("Account(a) = %+v, want balance 5 at seq 1, as of now", first)
	}

	issue(t, l, "a", 5) // not announced: the cached snapshot stands
	clk.Add(250 * time.Millisecond)
	if got := balance(t, v, "a"); got != first {
		t.Errorf("Account(a) within the window = %+v, want the cached %+v", got, first)
	}
	clk.Add(time.Millisecond)
	if got := balance(t, v, "a"); got.Balance != 10 || got.Seq != 2 {
		t.Errorf("Account(a) past the window = %+v, want a fresh read: balance 10 at seq 2", got)
	}
}

func TestAdvanceDropsTouched(t *testing.T) {
	l := newLedger(t)
	clk := wallettest.NewClock(time.Unix(1000, 0))
	v := view.New(view.Options{Source: l, Window: time.Hour, Now: clk.Now}, l.Seq())
	issue(t, l, "a", 1)
	issue(t, l, "b", 1)
	balance(t, v, "a")
	balance(t, v, "b")
	if s, err := v.Supply(t.Context(), 0, 0); err != nil || s.Issued != 2 {
		t.Fatalf("Supply() = %+v, %v", s, err)
	}
	issue(t, l, "a", 1)
	issue(t, l, "b", 1)
	v.Advance(4, []string{"a"})
	if got := balance(t, v, "a"); got.Balance != 2 {
		t.Errorf("Account(a) after Advance naming it = %+v, want the fresh balance 2", got)
	}
	if got := balance(t, v, "b"); got.Balance != 1 {
		t.Errorf("Account(b) after Advance not naming it = %+v, want the cached balance 1", got)
	}
	if s, _ := v.Supply(t.Context(), 0, 0); s.Issued != 4 || s.Seq != 4 {
		t.Errorf("Supply() after Advance = %+v, want a fresh read", s)
	}
}

func TestZeroWindowAlwaysReads(t *testing.T) {
	l := newLedger(t)
	v := view.New(view.Options{Source: l}, l.Seq())
	for want := uint64(1); want <= 3; want++ {
		issue(t, l, "a", 1)
		if got := balance(t, v, "a"); got.Balance != want {
			t.Errorf("Account(a) = %+v, want balance %d", got, want)
		}
	}
}

func TestMinSeqWaits(t *testing.T) {
	l := newLedger(t)
	v := view.New(view.Options{Source: l, Window: time.Hour}, l.Seq())
	balance(t, v, "a") // cache the empty account at seq 0
	got := make(chan view.Account, 1)
	errc := make(chan error, 1)
	go func() {
		a, err := v.Account(context.Background(), "a", 1, time.Minute)
		errc <- err
		got <- a
	}()
	seq := issue(t, l, "a", 7)
	v.Advance(seq, []string{"a"})
	if err := <-errc; err != nil {
		t.Fatalf("Account(min_seq 1) = %v", err)
	}
	if a := <-got; a.Seq < 1 || a.Balance != 7 {
		t.Errorf("Account(min_seq 1) = %+v, want a snapshot including seq 1", a)
	}
}

func TestMinSeqCachedOlderSnapshotIsNotServed(t *testing.T) {
	l := newLedger(t)
	v := view.New(view.Options{Source: l, Window: time.Hour}, l.Seq())
	balance(t, v, "a")
	seq := issue(t, l, "a", 3)
	v.Advance(seq, nil) // announced, but not as touching a
	a, err := v.Account(t.Context(), "a", seq, 0)
	if err != nil || a.Seq < seq || a.Balance != 3 {
		t.Errorf("Account(min_seq %d) = %+v, %v, want a read including it", seq, a, err)
	}
}

func TestWaitEnds(t *testing.T) {
	l := newLedger(t)
	stop := make(chan struct{})
	v := view.New(view.Options{Source: l, Window: time.Hour, Stop: stop}, l.Seq())

	t.Run("wait passes", func(t *testing.T) {
		start := time.Now()
		a, err := v.Account(t.Context(), "a", 99, 50*time.Millisecond)
		if err != nil || a.Seq != 0 {
			t.Errorf("Account(min_seq 99, wait 50ms) = %+v, %v, want the current snapshot", a, err)
		}
		if d := time.Since(start); d < 50*time.Millisecond {
			t.Errorf("Account returned after %v, want it to wait 50ms", d)
		}
	})
	t.Run("ctx ends", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancel()
		if _, err := v.Account(ctx, "a", 99, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Account with an expiring ctx = %v, want DeadlineExceeded", err)
		}
	})
	t.Run("stop", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			_, err := v.Supply(context.Background(), 99, time.Hour)
			done <- err
		}()
		close(stop)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Supply after Stop = %v, want the current snapshot", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Supply kept waiting after Stop was closed")
		}
	})
}

func TestReadErrors(t *testing.T) {
	l := newLedger(t)
	v := view.New(view.Options{Source: l, Window: time.Hour}, l.Seq())
	_ = l.Close()
	if _, err := v.Account(t.Context(), "a", 0, 0); !errors.Is(err, ledger.ErrClosed) {
		t.Errorf("Account on a closed ledger = %v, want ErrClosed", err)
	}
	if _, err := v.Supply(t.Context(), 0, 0); !errors.Is(err, ledger.ErrClosed) {
		t.Errorf("Supply on a closed ledger = %v, want ErrClosed", err)
	}
}
