package ledger_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/wallettest"
)

func sweepOp(limit int) ledger.Op { return ledger.Op{Kind: ledger.KindSweep, Limit: limit} }

func TestSweep(t *testing.T) {
	clk := wallettest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	l := open(t, filepath.Join(t.TempDir(), "wallet.db"), ledger.Options{IdempotencyTTL: time.Minute, Now: clk.Now})
	for i := range 5 {
		op := issue("a", 1)
		op.Idem = &ledger.Idem{Key: string(rune('a' + i))}
		apply(t, l, op)
		clk.Add(time.Second)
	}
	// Reissue key "a" after it expired: its old sweep entry must go.
	clk.Add(time.Minute)
	op := issue("a", 1)
	op.Idem = &ledger.Idem{Key: "a"}
	apply(t, l, op)

	steps := []struct {
		limit, want int
	}{{3, 3}, {3, 1}, {3, 0}}
	for _, s := range steps {
		n, err := l.Sweep(t.Context(), s.limit)
		if err != nil || n != s.want {
			t.Fatalf("Sweep(%d) = %d, %v, want %d", s.limit, n, err, s.want)
		}
	}
	if _, ok, _ := l.Idempotency("a"); !ok {
		t.Errorf("Idempotency(a) = none, want the fresh record to survive the sweep")
	}
	for _, k := range []string{"b", "c", "d", "e"} {
		if _, ok, _ := l.Idempotency(k); ok {
			t.Errorf("Idempotency(%q) found an expired record", k)
		}
	}
}

// TestSweepInGroup applies sweeps as operations of groups with client
// operations, as the committer groups them: Expired tells when there is
// something to sweep, a sweep's result says how many it deleted and is
// marked a sweep, and a key reused in the same group keeps its fresh
// record whether the sweep comes before or after it.
func TestSweepInGroup(t *testing.T) {
	clk := wallettest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	l := open(t, filepath.Join(t.TempDir(), "wallet.db"), ledger.Options{IdempotencyTTL: time.Minute, Now: clk.Now})
	expired := func() bool {
		t.Helper()
		ok, err := l.Expired()
		if err != nil {
			t.Fatalf("Expired() = %v", err)
		}
		return ok
	}
	for _, k := range []string{"a", "b", "c", "d"} {
		apply(t, l, keyed(issue("x", 1), k))
	}
	if expired() {
		t.Fatal("Expired() = true before any record expired")
	}
	clk.Add(time.Minute) // every record expires at the group's time
	if !expired() {
		t.Fatal("Expired() = false with four expired records")
	}
	// "a" is reused before the sweep, "b" after it; the sweep takes the
	// other expired records.
	res := apply(t, l, keyed(issue("x", 1), "a"), sweepOp(10), keyed(issue("x", 1), "b"))
	if !res[1].Sweep || res[1].Swept != 3 || res[1].Receipt != nil || res[1].Record != nil {
		t.Errorf("sweep result = %+v, want Sweep, 3 swept (b, c, d) and no receipt or record", res[1])
	}
	if res[0].Replayed || res[0].Receipt == nil || res[2].Replayed || res[2].Receipt == nil {
		t.Errorf("reused keys = %+v, %+v; want both committed afresh", res[0], res[2])
	}
	for k, want := range map[string]bool{"a": true, "b": true, "c": false, "d": false} {
		if _, ok, err := l.Idempotency(k); err != nil || ok != want {
			t.Errorf("Idempotency(%q) = %t, %v; want %t", k, ok, err, want)
		}
	}
	if expired() {
		t.Error("Expired() = true after the sweep, with only fresh records left")
	}
	// The fresh records' index entries are the only ones: once they
	// expire, one sweep takes both, and nothing is left.
	clk.Add(time.Minute)
	if n, err := l.Sweep(t.Context(), 10); err != nil || n != 2 {
		t.Errorf("Sweep(10) = %d, %v; want 2 (a and b)", n, err)
	}
	if expired() {
		t.Error("Expired() = true after the last sweep")
	}
	if a, err := l.Audit(); err != nil || a.Receipts != 6 || a.Issued != 6 {
		t.Errorf("Audit() = %+v, %v; want 6 receipts and 6 issued: a sweep writes no receipt", a, err)
	}
}
