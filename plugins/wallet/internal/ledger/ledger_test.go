package ledger_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/wallettest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// clocked returns opts on the suite's clock (plugintest.Now) unless it
// names a clock of its own: records the tests write expire by the same
// clock they are read by, and a run with the clock moved a year ahead
// (plugintest.ClockShiftEnv) finds any test that expires with the
// calendar.
func clocked(opts ledger.Options) ledger.Options {
	if opts.Now == nil {
		opts.Now = plugintest.Now
	}
	return opts
}

// open opens the ledger at path on clocked(opts), and closes it when the
// test ends.
func open(t *testing.T, path string, opts ledger.Options) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(path, clocked(opts))
	if err != nil {
		t.Fatalf("Open(%q) = %v", path, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func newLedger(t *testing.T) *ledger.Ledger {
	t.Helper()
	return open(t, filepath.Join(t.TempDir(), "wallet.db"), ledger.Options{})
}

func apply(t *testing.T, l *ledger.Ledger, ops ...ledger.Op) []ledger.Result {
	t.Helper()
	res, err := l.Apply(t.Context(), ops)
	if err != nil {
		t.Fatalf("Apply(%d ops) = %v", len(ops), err)
	}
	if len(res) != len(ops) {
		t.Fatalf("Apply(%d ops) returned %d results", len(ops), len(res))
	}
	return res
}

func issue(to string, amount uint64) ledger.Op {
	return ledger.Op{Kind: ledger.KindIssue, To: to, Amount: amount}
}

func transfer(from, to string, amount, nonce uint64) ledger.Op {
	return ledger.Op{Kind: ledger.KindTransfer, From: from, To: to, Amount: amount, Nonce: nonce}
}

func burn(from string, amount, nonce uint64) ledger.Op {
	return ledger.Op{Kind: ledger.KindBurn, From: from, Amount: amount, Nonce: nonce}
}

func batch(from string, nonce uint64, legs ...ledger.Leg) ledger.Op {
	return ledger.Op{Kind: ledger.KindBatch, From: from, Nonce: nonce, Legs: legs}
}

func account(t *testing.T, l *ledger.Ledger, id string) ledger.Account {
	t.Helper()
	a, _, err := l.Account(id)
	if err != nil {
		t.Fatalf("Account(%q) = %v", id, err)
	}
	return a
}

// checkAudit checks the ledger's invariant: supply = issued − burned = the
// sum of balances.
func checkAudit(t *testing.T, l *ledger.Ledger) ledger.Audit {
	t.Helper()
	a, err := l.Audit()
	if err != nil {
		t.Fatalf("Audit() = %v", err)
	}
	if a.Overflow || a.Issued < a.Burned || a.Balances != a.Issued-a.Burned {
		t.Fatalf("Audit() = %+v: the sum of balances is not issued − burned", a)
	}
	return a
}

func TestApplyOutcomes(t *testing.T) {
	tests := []struct {
		name    string
		setup   []ledger.Op
		op      ledger.Op
		wantErr error
		// balances and nonces after the op
		want map[string]ledger.Account
	}{
		{
			name: "issue",
			op:   issue("a", 10),
			want: map[string]ledger.Account{"a": {ID: "a", Balance: 10}},
		},
		{
			name:  "transfer with the next nonce",
			setup: []ledger.Op{issue("a", 10)},
			op:    transfer("a", "b", 4, 1),
			want:  map[string]ledger.Account{"a": {ID: "a", Balance: 6, Nonce: 1}, "b": {ID: "b", Balance: 4}},
		},
		{
			name:    "transfer with nonce 0",
			setup:   []ledger.Op{issue("a", 10)},
			op:      transfer("a", "b", 4, 0),
			wantErr: ledger.ErrNonceMismatch,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: 10}, "b": {ID: "b"}},
		},
		{
			name:    "transfer skipping a nonce",
			setup:   []ledger.Op{issue("a", 10)},
			op:      transfer("a", "b", 4, 2),
			wantErr: ledger.ErrNonceMismatch,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: 10}},
		},
		{
			name:    "transfer reusing a nonce",
			setup:   []ledger.Op{issue("a", 10), transfer("a", "b", 1, 1)},
			op:      transfer("a", "b", 1, 1),
			wantErr: ledger.ErrNonceMismatch,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: 9, Nonce: 1}, "b": {ID: "b", Balance: 1}},
		},
		{
			name:    "transfer more than the balance",
			setup:   []ledger.Op{issue("a", 10)},
			op:      transfer("a", "b", 11, 1),
			wantErr: ledger.ErrInsufficientFunds,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: 10}, "b": {ID: "b"}},
		},
		{
			name:  "transfer the whole balance",
			setup: []ledger.Op{issue("a", 10)},
			op:    transfer("a", "b", 10, 1),
			want:  map[string]ledger.Account{"a": {ID: "a", Nonce: 1}, "b": {ID: "b", Balance: 10}},
		},
		{
			name:    "transfer from an empty account",
			op:      transfer("a", "b", 1, 1),
			wantErr: ledger.ErrInsufficientFunds,
			want:    map[string]ledger.Account{"a": {ID: "a"}},
		},
		{
			name:    "transfer to itself",
			setup:   []ledger.Op{issue("a", 10)},
			op:      transfer("a", "a", 1, 1),
			wantErr: ledger.ErrInvalid,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: 10}},
		},
		{
			name:  "burn",
			setup: []ledger.Op{issue("a", 10)},
			op:    burn("a", 3, 1),
			want:  map[string]ledger.Account{"a": {ID: "a", Balance: 7, Nonce: 1}},
		},
		{
			name:    "burn more than the balance",
			setup:   []ledger.Op{issue("a", 10)},
			op:      burn("a", 11, 1),
			wantErr: ledger.ErrInsufficientFunds,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: 10}},
		},
		{
			name:  "batch",
			setup: []ledger.Op{issue("a", 10)},
			op:    batch("a", 1, ledger.Leg{To: "b", Amount: 3}, ledger.Leg{To: "c", Amount: 4}, ledger.Leg{To: "b", Amount: 1}),
			want: map[string]ledger.Account{
				"a": {ID: "a", Balance: 2, Nonce: 1}, "b": {ID: "b", Balance: 4}, "c": {ID: "c", Balance: 4},
			},
		},
		{
			name:    "batch whose legs exceed the balance applies no leg",
			setup:   []ledger.Op{issue("a", 10)},
			op:      batch("a", 1, ledger.Leg{To: "b", Amount: 6}, ledger.Leg{To: "c", Amount: 5}),
			wantErr: ledger.ErrInsufficientFunds,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: 10}, "b": {ID: "b"}, "c": {ID: "c"}},
		},
		{
			name:    "batch with a wrong nonce applies no leg",
			setup:   []ledger.Op{issue("a", 10)},
			op:      batch("a", 3, ledger.Leg{To: "b", Amount: 1}),
			wantErr: ledger.ErrNonceMismatch,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: 10}, "b": {ID: "b"}},
		},
		{
			name:    "batch whose legs overflow",
			setup:   []ledger.Op{issue("a", 10)},
			op:      batch("a", 1, ledger.Leg{To: "b", Amount: math.MaxUint64}, ledger.Leg{To: "c", Amount: 2}),
			wantErr: ledger.ErrInvalid,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: 10}},
		},
		{
			name:    "batch paying itself",
			setup:   []ledger.Op{issue("a", 10)},
			op:      batch("a", 1, ledger.Leg{To: "a", Amount: 1}),
			wantErr: ledger.ErrInvalid,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: 10}},
		},
		{
			name:    "issue overflowing the supply",
			setup:   []ledger.Op{issue("a", math.MaxUint64-1)},
			op:      issue("b", 2),
			wantErr: ledger.ErrSupplyOverflow,
			want:    map[string]ledger.Account{"a": {ID: "a", Balance: math.MaxUint64 - 1}, "b": {ID: "b"}},
		},
		{
			name:    "zero amount",
			op:      issue("a", 0),
			wantErr: ledger.ErrInvalid,
			want:    map[string]ledger.Account{"a": {ID: "a"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger(t)
			for i, r := range apply(t, l, tt.setup...) {
				if r.Err != nil {
					t.Fatalf("setup op %d: %v", i, r.Err)
				}
			}
			seq := l.Seq()
			r := apply(t, l, tt.op)[0]
			if !errors.Is(r.Err, tt.wantErr) {
				t.Fatalf("Apply(%+v).Err = %v, want %v", tt.op, r.Err, tt.wantErr)
			}
			if (r.Receipt != nil) != (tt.wantErr == nil) {
				t.Errorf("Apply(%+v).Receipt = %+v, want one exactly when the op commits", tt.op, r.Receipt)
			}
			wantSeq := seq
			if tt.wantErr == nil {
				wantSeq++
			}
			if l.Seq() != wantSeq {
				t.Errorf("Seq() = %d after the op, want %d", l.Seq(), wantSeq)
			}
			for id, want := range tt.want {
				if diff := cmp.Diff(want, account(t, l, id)); diff != "" {
					t.Errorf("Account(%q) mismatch (-want +got):\n%s", id, diff)
				}
			}
			checkAudit(t, l)
		})
	}
}

func TestNonceErrorNamesExpected(t *testing.T) {
	l := newLedger(t)
	apply(t, l, issue("a", 10), transfer("a", "b", 1, 1), transfer("a", "b", 1, 2))
	r := apply(t, l, transfer("a", "b", 1, 7))[0]
	var ne *ledger.NonceError
	if !errors.As(r.Err, &ne) || ne.Expected != 3 || ne.Got != 7 || ne.Account != "a" {
		t.Fatalf("Apply(nonce 7).Err = %v, want a NonceError expecting 3", r.Err)
	}
}

func TestGroupOpsSeeEachOther(t *testing.T) {
	l := newLedger(t)
	// One group: the second transfer with the same nonce loses, the third
	// spends what the first received, the last overdraws and is refused
	// without undoing the others.
	res := apply(t, l,
		issue("a", 10),
		transfer("a", "b", 5, 1),
		transfer("a", "b", 5, 1),
		transfer("b", "c", 5, 1),
		transfer("a", "c", 6, 2),
	)
	wantErrs := []error{nil, nil, ledger.ErrNonceMismatch, nil, ledger.ErrInsufficientFunds}
	for i, want := range wantErrs {
		if !errors.Is(res[i].Err, want) {
			t.Errorf("op %d: Err = %v, want %v", i, res[i].Err, want)
		}
	}
	var seqs []uint64
	for _, r := range res {
		if r.Receipt != nil {
			seqs = append(seqs, r.Receipt.Seq)
			if !r.Receipt.CommittedAt.Equal(res[0].Receipt.CommittedAt) {
				t.Errorf("receipt %d committed at %v, want the group's time %v", r.Receipt.Seq, r.Receipt.CommittedAt, res[0].Receipt.CommittedAt)
			}
		}
	}
	if diff := cmp.Diff([]uint64{1, 2, 3}, seqs); diff != "" {
		t.Errorf("receipt seqs mismatch (-want +got):\n%s", diff)
	}
	for id, want := range map[string]ledger.Account{
		"a": {ID: "a", Balance: 5, Nonce: 1}, "b": {ID: "b", Nonce: 1}, "c": {ID: "c", Balance: 5},
	} {
		if diff := cmp.Diff(want, account(t, l, id)); diff != "" {
			t.Errorf("Account(%q) mismatch (-want +got):\n%s", id, diff)
		}
	}
	checkAudit(t, l)
}

func TestSupplyConservation(t *testing.T) {
	l := newLedger(t)
	apply(t, l, issue("a", 100), issue("b", 50))
	apply(t, l, transfer("a", "b", 30, 1), burn("b", 20, 1), batch("a", 2, ledger.Leg{To: "c", Amount: 10}, ledger.Leg{To: "d", Amount: 5}))
	apply(t, l, burn("c", 11, 1)) // refused
	s, seq, err := l.Supply()
	if err != nil {
		t.Fatal(err)
	}
	if s.Issued != 150 || s.Burned != 20 || seq != 5 {
		t.Errorf("Supply() = %+v at seq %d, want issued 150, burned 20 at seq 5", s, seq)
	}
	a := checkAudit(t, l)
	if a.Balances != 130 || a.Accounts != 4 || a.Receipts != 5 {
		t.Errorf("Audit() = %+v, want balances 130 over 4 accounts and 5 receipts", a)
	}
}

func TestReceiptLookup(t *testing.T) {
	l := newLedger(t)
	res := apply(t, l, issue("a", 10), batch("a", 1, ledger.Leg{To: "b", Amount: 3}, ledger.Leg{To: "c", Amount: 4}))
	for _, r := range res {
		got, err := l.Receipt(r.Receipt.TxID)
		if err != nil {
			t.Fatalf("Receipt(%q) = %v", r.Receipt.TxID, err)
		}
		if diff := cmp.Diff(*r.Receipt, got); diff != "" {
			t.Errorf("Receipt(%q) mismatch (-want +got):\n%s", r.Receipt.TxID, diff)
		}
	}
	if got := res[1].Receipt; got.Amount != 7 || got.Nonce != 1 || got.Kind != "batch" || len(got.Legs) != 2 {
		t.Errorf("batch receipt = %+v, want amount 7, nonce 1 and two legs", got)
	}
	for _, id := range []string{"tx_0000000000000003", "tx_0000000000000000", "nope", "tx_000000000000000g", ""} {
		if _, err := l.Receipt(id); !errors.Is(err, ledger.ErrNotFound) {
			t.Errorf("Receipt(%q) = %v, want ErrNotFound", id, err)
		}
	}
}

func TestReceiptsRange(t *testing.T) {
	l := newLedger(t)
	for range 5 {
		apply(t, l, issue("a", 1))
	}
	tests := []struct {
		after uint64
		limit int
		want  []uint64
	}{
		{0, 10, []uint64{1, 2, 3, 4, 5}},
		{2, 2, []uint64{3, 4}},
		{5, 10, nil},
		{math.MaxUint64, 10, nil},
		{0, 0, nil},
	}
	for _, tt := range tests {
		rs, err := l.Receipts(tt.after, tt.limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for _, r := range rs {
			got = append(got, r.Seq)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("Receipts(%d, %d) seqs mismatch (-want +got):\n%s", tt.after, tt.limit, diff)
		}
	}
}

func TestTxIDRoundTrip(t *testing.T) {
	for _, seq := range []uint64{1, 42, math.MaxUint64} {
		id := ledger.TxID(seq)
		if got, ok := ledger.ParseTxID(id); !ok || got != seq {
			t.Errorf("ParseTxID(%q) = %d, %v, want %d, true", id, got, ok, seq)
		}
	}
}

func TestIdempotencyRecords(t *testing.T) {
	clk := wallettest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	l := open(t, filepath.Join(t.TempDir(), "wallet.db"), ledger.Options{IdempotencyTTL: time.Hour, Now: clk.Now})
	fp := [32]byte{1}
	withKey := func(op ledger.Op, key string) ledger.Op {
		op.Idem = &ledger.Idem{Key: key, Fingerprint: fp}
		return op
	}
	res := apply(t, l,
		withKey(issue("a", 10), "k-issue"),
		withKey(transfer("a", "b", 20, 1), "k-poor"),
		withKey(transfer("a", "b", 1, 5), "k-nonce"),
		withKey(issue("a", 10), "k-issue"), // same key in the same group
	)
	if res[0].Record == nil || res[0].Record.Status != 200 || res[0].Replayed {
		t.Fatalf("committed op: Record = %+v, Replayed = %v, want a fresh 200 record", res[0].Record, res[0].Replayed)
	}
	if res[1].Record == nil || res[1].Record.Status != 422 {
		t.Errorf("insufficient funds: Record = %+v, want a 422 record", res[1].Record)
	}
	if res[2].Record != nil {
		t.Errorf("nonce mismatch: Record = %+v, want none: the key stays free for a corrected nonce", res[2].Record)
	}
	if !res[3].Replayed || res[3].Receipt != nil || string(res[3].Record.Body) != string(res[0].Record.Body) {
		t.Errorf("same key again: %+v, want the first record replayed and nothing applied", res[3])
	}
	if got := account(t, l, "a"); got.Balance != 10 {
		t.Errorf("Account(a).Balance = %d, want 10: the repeated issue must not apply", got.Balance)
	}

	rec, ok, err := l.Idempotency("k-issue")
	if err != nil || !ok {
		t.Fatalf("Idempotency(k-issue) = %v, %v", ok, err)
	}
	if diff := cmp.Diff(*res[0].Record, rec); diff != "" {
		t.Errorf("stored record mismatch (-want +got):\n%s", diff)
	}
	if _, ok, _ := l.Idempotency("k-nonce"); ok {
		t.Errorf("Idempotency(k-nonce) found a record; nonce mismatches are not recorded")
	}

	// After the TTL the record is gone for lookups and the key is free.
	clk.Add(time.Hour + time.Second)
	if _, ok, _ := l.Idempotency("k-issue"); ok {
		t.Errorf("Idempotency(k-issue) after the TTL found the record")
	}
	r := apply(t, l, withKey(issue("a", 1), "k-issue"))[0]
	if r.Replayed || r.Receipt == nil {
		t.Errorf("reusing an expired key = %+v, want a fresh commit", r)
	}
	if got := account(t, l, "a"); got.Balance != 11 {
		t.Errorf("Account(a).Balance = %d, want 11", got.Balance)
	}
}

func TestRecordAtomicWithCommit(t *testing.T) {
	// Render runs inside the transaction, after the op's balances and
	// receipt are written; an unstorable record (status > 65535) fails
	// the transaction there. Nothing of the group may remain.
	render := func(r ledger.Result) (int, []byte) {
		if r.Receipt != nil && r.Receipt.Amount == 13 {
			return 1 << 20, nil
		}
		return 200, []byte("ok")
	}
	l := open(t, filepath.Join(t.TempDir(), "wallet.db"), ledger.Options{Render: render})
	apply(t, l, issue("a", 100))
	before := checkAudit(t, l)
	ok := issue("b", 1)
	ok.Idem = &ledger.Idem{Key: "fine"}
	poison := transfer("a", "b", 13, 1)
	poison.Idem = &ledger.Idem{Key: "poison"}
	if _, err := l.Apply(t.Context(), []ledger.Op{ok, poison}); err == nil {
		t.Fatal("Apply with an unstorable record = nil, want the transaction to fail")
	}
	if diff := cmp.Diff(before, checkAudit(t, l)); diff != "" {
		t.Errorf("a failed group changed the ledger (-before +after):\n%s", diff)
	}
	for _, key := range []string{"fine", "poison"} {
		if _, found, _ := l.Idempotency(key); found {
			t.Errorf("Idempotency(%q) found a record of a rolled-back group", key)
		}
	}
	if _, err := l.Receipt(ledger.TxID(2)); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Receipt(seq 2) = %v, want ErrNotFound", err)
	}
	if got := account(t, l, "a"); got.Nonce != 0 || got.Balance != 100 {
		t.Errorf("Account(a) = %+v, want untouched", got)
	}
	// The same ops commit once the record can be stored.
	poison.Amount = 12
	if res := apply(t, l, ok, poison); res[0].Receipt.Seq != 2 || res[1].Receipt.Seq != 3 {
		t.Errorf("retried group = %+v, want seqs 2 and 3", res)
	}
}

func TestReopenKeepsEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	l, err := ledger.Open(path, clocked(ledger.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	op := transfer("a", "b", 4, 1)
	op.Idem = &ledger.Idem{Key: "k", Fingerprint: [32]byte{9}}
	res, err := l.Apply(t.Context(), []ledger.Op{issue("a", 10), op, burn("b", 1, 1)})
	if err != nil {
		t.Fatal(err)
	}
	before, err := l.Audit()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if _, _, err := l.Account("a"); !errors.Is(err, ledger.ErrClosed) {
		t.Errorf("Account after Close = %v, want ErrClosed", err)
	}
	if _, err := l.Apply(t.Context(), []ledger.Op{issue("a", 1)}); !errors.Is(err, ledger.ErrClosed) {
		t.Errorf("Apply after Close = %v, want ErrClosed", err)
	}

	l = open(t, path, ledger.Options{})
	after := checkAudit(t, l)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("Audit() after reopen mismatch (-before +after):\n%s", diff)
	}
	if l.Seq() != 3 {
		t.Errorf("Seq() after reopen = %d, want 3", l.Seq())
	}
	rec, ok, err := l.Idempotency("k")
	if err != nil || !ok || string(rec.Body) != string(res[1].Record.Body) || rec.Fingerprint != [32]byte{9} {
		t.Errorf("Idempotency(k) after reopen = %+v, %v, %v, want the stored record", rec, ok, err)
	}
	if got, err := l.Receipt(res[2].Receipt.TxID); err != nil || got.Seq != 3 {
		t.Errorf("Receipt(%q) after reopen = %+v, %v", res[2].Receipt.TxID, got, err)
	}
	// The next receipt continues the sequence.
	if r := apply(t, l, issue("c", 1))[0]; r.Receipt.Seq != 4 {
		t.Errorf("next receipt seq = %d, want 4", r.Receipt.Seq)
	}
}

func TestOpenLockedFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	open(t, path, ledger.Options{})
	start := time.Now()
	l, err := ledger.Open(path, clocked(ledger.Options{LockTimeout: 100 * time.Millisecond}))
	if !errors.Is(err, ledger.ErrLocked) {
		if err == nil {
			_ = l.Close()
		}
		t.Fatalf("Open of a file another handle holds = %v, want ErrLocked", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Open of a locked file took %v, want about the lock timeout", d)
	}
	t.Logf("Open of a locked file: %v", err)
}

func TestApplyConcurrent(t *testing.T) {
	// Many groups race for the same (account, nonce): exactly one wins.
	l := newLedger(t)
	apply(t, l, issue("a", 1000))
	const racers = 16
	var wg sync.WaitGroup
	wins := make(chan uint64, racers*4)
	for i := range racers {
		wg.Go(func() {
			for n := uint64(1); n <= 4; n++ {
				res, err := l.Apply(t.Context(), []ledger.Op{transfer("a", "b", uint64(i+1), n)})
				if err != nil {
					t.Errorf("Apply = %v", err)
					return
				}
				if res[0].Err == nil {
					wins <- n
				}
			}
		})
	}
	wg.Wait()
	close(wins)
	count := map[uint64]int{}
	for n := range wins {
		count[n]++
	}
	for n := uint64(1); n <= 4; n++ {
		if count[n] != 1 {
			t.Errorf("nonce %d won %d times, want exactly once", n, count[n])
		}
	}
	if got := account(t, l, "a"); got.Nonce != 4 {
		t.Errorf("Account(a).Nonce = %d, want 4", got.Nonce)
	}
	checkAudit(t, l)
}

// FuzzReceiptJSON checks that AppendJSON writes what json.Marshal writes,
// for plain and for escaped strings, legs or none, and any instant an int64
// of nanoseconds reaches.
func FuzzReceiptJSON(f *testing.F) {
	f.Add("tx_0000000000000001", "transfer", "alice", "bob", "", uint64(5), uint64(1), uint64(1), int64(1_700_000_000_123_456_789), 0)
	f.Add("tx_0000000000000002", "issue", "", "bob", "", uint64(1<<64-1), uint64(0), uint64(2), int64(0), 0)
	f.Add("tx_0000000000000003", "batch", "a<b>&\"c\\", "", "\u2028\xff\x01", uint64(3), uint64(9), uint64(3), int64(-1), 3)
	f.Add("tx_0000000000000004", "burn", "ü", "", "", uint64(1), uint64(2), uint64(4), int64(1<<63-1), 0)
	f.Fuzz(func(t *testing.T, txID, kind, from, to, leg string, amount, nonce, seq uint64, nanos int64, legs int) {
		r := ledger.Receipt{TxID: txID, Kind: kind, From: from, To: to, Amount: amount, Nonce: nonce, Seq: seq,
			CommittedAt: time.Unix(0, nanos).UTC()}
		for i := range legs % 4 {
			r.Legs = append(r.Legs, ledger.Leg{To: leg, Amount: amount + uint64(i)})
		}
		// time.Unix of an int64 of nanoseconds lies in years 1677-2262,
		// all of which MarshalJSON accepts, and every string encodes.
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatalf("json.Marshal(%+v) = %v", r, err)
		}
		if got := r.AppendJSON(nil); string(got) != string(want) {
			t.Fatalf("AppendJSON = %s\njson.Marshal = %s", got, want)
		}
	})
}

// TestIdempotencyRecordStorage checks how records are stored: a committed
// operation's record refers to its receipt rather than copying it, and
// still gives back the whole body, across a reopen; records written before
// the reference existed, with the body whole, still read; and a record
// whose receipt is missing is an error, not an empty body.
func TestIdempotencyRecordStorage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	// As the API renders: the receipt and a newline.
	render := func(r ledger.Result) (int, []byte) {
		if r.Err != nil {
			return 422, []byte(`{"error":"refused"}` + "\n")
		}
		return 200, append(r.Receipt.AppendJSON(nil), '\n')
	}
	fp := [32]byte{7}
	l, err := ledger.Open(path, clocked(ledger.Options{Render: render}))
	if err != nil {
		t.Fatal(err)
	}
	op := issue("a", 10)
	op.Idem = &ledger.Idem{Key: "new", Fingerprint: fp}
	res, err := l.Apply(t.Context(), []ledger.Op{op})
	if err != nil || res[0].Record == nil {
		t.Fatalf("Apply = %+v, %v", res, err)
	}
	want := append(res[0].Receipt.AppendJSON(nil), '\n')
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// Look at the file as bbolt stores it, and add records in the format
	// from before references.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	legacy := func(status uint16, body string) []byte {
		b := binary.BigEndian.AppendUint64(nil, uint64(plugintest.Now().Add(time.Hour).UnixNano()))
		b = append(b, fp[:]...)
		b = binary.BigEndian.AppendUint16(b, status)
		return append(b, body...)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		idem := tx.Bucket([]byte("idem"))
		if v := idem.Get([]byte("new")); len(v) != 4+42+12+1 {
			t.Errorf("stored record is %d bytes, want %d: the store's checksum, header, receipt seq and checksum, newline", len(v), 4+42+12+1)
		}
		ref := func(seq uint64) []byte {
			b := binary.BigEndian.AppendUint64(nil, uint64(plugintest.Now().Add(time.Hour).UnixNano()))
			b = append(b, fp[:]...)
			b = binary.BigEndian.AppendUint16(b, 200|0x8000)
			b = binary.BigEndian.AppendUint64(b, seq)
			return binary.BigEndian.AppendUint32(b, 0) // not the receipt's checksum
		}
		for k, v := range map[string][]byte{
			"old-200":  legacy(200, `{"tx_id":"old"}`+"\n"),
			"old-422":  legacy(422, `{"error":"old"}`+"\n"),
			"dangling": ref(999),
			"changed":  ref(1),
		} {
			if err := idem.Put([]byte(k), framed([]byte(k), v)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	l = open(t, path, ledger.Options{Render: render})
	for key, body := range map[string]string{
		"new":     string(want),
		"old-200": `{"tx_id":"old"}` + "\n",
		"old-422": `{"error":"old"}` + "\n",
	} {
		rec, ok, err := l.Idempotency(key)
		if err != nil || !ok || string(rec.Body) != body || rec.Fingerprint != fp {
			t.Errorf("Idempotency(%q) = %q, %v, %v, want %q", key, rec.Body, ok, err, body)
		}
	}
	again := apply(t, l, op)[0]
	if !again.Replayed || string(again.Record.Body) != string(want) {
		t.Errorf("Apply of the same key after a reopen = %+v, want %q replayed", again, want)
	}
	if _, _, err := l.Idempotency("dangling"); err == nil || !strings.Contains(err.Error(), "receipt 999, which is missing") {
		t.Errorf("Idempotency(dangling) = %v, want an error naming the missing receipt", err)
	}
	if _, _, err := l.Idempotency("changed"); err == nil || !strings.Contains(err.Error(), "receipt 1, which has changed") {
		t.Errorf("Idempotency(changed) = %v, want an error saying receipt 1 changed", err)
	}
}
