package ledger_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/wallettest"
)

// state is everything lookups tell about a ledger, for comparing two.
type state struct {
	Seq      uint64
	Supply   ledger.Supply
	Accounts map[string]ledger.Account
	Receipts []ledger.Receipt
	Records  map[string]string // key → status and body, or "none"
	Audit    ledger.Audit
}

func stateOf(t *testing.T, l *ledger.Ledger, accounts, keys []string) state {
	t.Helper()
	s := state{Seq: l.Seq(), Accounts: map[string]ledger.Account{}, Records: map[string]string{}}
	var err error
	if s.Supply, _, err = l.Supply(); err != nil {
		t.Fatal(err)
	}
	for _, id := range accounts {
		s.Accounts[id] = account(t, l, id)
	}
	if s.Receipts, err = l.Receipts(0, 1<<20); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		rec, ok, err := l.Idempotency(k)
		switch {
		case err != nil:
			t.Fatalf("Idempotency(%q) = %v", k, err)
		case ok:
			s.Records[k] = fmt.Sprintf("%d %s", rec.Status, rec.Body)
		default:
			s.Records[k] = "none"
		}
	}
	s.Audit = checkAudit(t, l)
	return s
}

// keyed returns op with idempotency key k.
func keyed(op ledger.Op, k string) ledger.Op {
	op.Idem = &ledger.Idem{Key: k, Fingerprint: [32]byte{byte(len(k))}}
	return op
}

// walGroups applies groups of every kind, some before a checkpoint and
// some after, with a sweep of expired records among those after.
func walGroups(t *testing.T, l *ledger.Ledger, clk *wallettest.Clock) {
	t.Helper()
	apply(t, l, keyed(issue("a", 1000), "i1"), keyed(issue("b", 500), "i2"), keyed(issue("old", 1), "expiring"))
	apply(t, l, keyed(transfer("a", "b", 100, 1), "t1"), keyed(transfer("b", "c", 700, 1), "t2")) // t2: insufficient funds
	if err := l.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	clk.Add(2 * time.Hour)
	if n, err := l.Sweep(t.Context(), 10); err != nil || n != 5 {
		t.Fatalf("Sweep = %d, %v, want the 5 records of the first groups", n, err)
	}
	apply(t, l, keyed(batch("a", 2, ledger.Leg{To: "c", Amount: 50}, ledger.Leg{To: "d", Amount: 25}), "b1"))
	apply(t, l, keyed(burn("b", 60, 1), "u1"), transfer("c", "a", 10, 1), keyed(issue("d", 5), "i3"))
}

var (
	walAccounts = []string{"a", "b", "c", "d", "old"}
	walKeys     = []string{"i1", "i2", "expiring", "t1", "t2", "b1", "u1", "i3"}
)

// TestLookupsSeeLoggedGroups checks that lookups see a group as soon as
// Apply returns, before any checkpoint has put it into the bbolt file,
// and see the same after checkpoints and after a reopen.
func TestLookupsSeeLoggedGroups(t *testing.T) {
	clk := wallettest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	path := filepath.Join(t.TempDir(), "wallet.db")
	l := open(t, path, ledger.Options{IdempotencyTTL: time.Hour, Now: clk.Now, CheckpointInterval: time.Hour})
	walGroups(t, l, clk)
	if !l.Pending() {
		t.Fatal("Pending() = false after groups since the last checkpoint")
	}
	logged := stateOf(t, l, walAccounts, walKeys)
	want := map[string]ledger.Account{
		"a":   {ID: "a", Balance: 1000 - 100 - 75 + 10, Nonce: 2},
		"b":   {ID: "b", Balance: 500 + 100 - 60, Nonce: 1},
		"c":   {ID: "c", Balance: 50 - 10, Nonce: 1},
		"d":   {ID: "d", Balance: 25 + 5},
		"old": {ID: "old", Balance: 1},
	}
	if diff := cmp.Diff(want, logged.Accounts); diff != "" {
		t.Errorf("accounts before the checkpoint (-want +got):\n%s", diff)
	}
	if len(logged.Receipts) != 8 || logged.Receipts[7].Seq != 8 || logged.Seq != 8 {
		t.Errorf("Receipts(0) = %d receipts, last %+v, Seq() = %d; want seqs 1 to 8", len(logged.Receipts), logged.Receipts[len(logged.Receipts)-1], logged.Seq)
	}
	// A range that starts in the bbolt file and ends in the log.
	if rs, err := l.Receipts(3, 3); err != nil || len(rs) != 3 || rs[0].Seq != 4 || rs[2].Seq != 6 {
		t.Errorf("Receipts(3, 3) = %+v, %v, want seqs 4 to 6", rs, err)
	}
	if rc, err := l.Receipt(ledger.TxID(8)); err != nil || rc.Kind != "issue" || rc.To != "d" {
		t.Errorf("Receipt(8) = %+v, %v, want the last group's issue to d", rc, err)
	}
	for _, k := range []string{"i1", "i2", "expiring", "t1", "t2"} {
		if logged.Records[k] != "none" {
			t.Errorf("Idempotency(%q) = %s, want it swept", k, logged.Records[k])
		}
	}
	for _, k := range []string{"b1", "u1", "i3"} {
		if logged.Records[k] == "none" {
			t.Errorf("Idempotency(%q) = none, want the logged group's record", k)
		}
	}
	if logged.Audit.Accounts != 5 || logged.Audit.Receipts != 8 || logged.Supply.Issued != 1506 || logged.Supply.Burned != 60 {
		t.Errorf("Audit() = %+v, Supply() = %+v; want 5 accounts, 8 receipts, issued 1506, burned 60", logged.Audit, logged.Supply)
	}

	if err := l.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if l.Pending() {
		t.Error("Pending() = true after Checkpoint")
	}
	if diff := cmp.Diff(logged, stateOf(t, l, walAccounts, walKeys)); diff != "" {
		t.Errorf("lookups after the checkpoint differ (-before +after):\n%s", diff)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, path, ledger.Options{IdempotencyTTL: time.Hour, Now: clk.Now})
	if diff := cmp.Diff(logged, stateOf(t, l, walAccounts, walKeys)); diff != "" {
		t.Errorf("lookups after a reopen differ (-before +after):\n%s", diff)
	}
}

// TestCrashRecovery opens what a crash leaves behind, the bbolt file and
// the write-ahead log as they are on disk, and finds every committed
// group; a log whose last record is torn or damaged loses that group
// whole and nothing else.
func TestCrashRecovery(t *testing.T) {
	clk := wallettest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	opts := ledger.Options{IdempotencyTTL: time.Hour, Now: clk.Now, CheckpointInterval: time.Hour}
	path := filepath.Join(t.TempDir(), "wallet.db")
	l := open(t, path, opts)
	walGroups(t, l, clk)
	before := stateOf(t, l, walAccounts, walKeys)
	image := crashImage(t, path)
	// The last group alone, to see what losing it looks like.
	last := []ledger.Op{keyed(issue("e", 7), "last")}
	apply(t, l, last...)
	withLast := crashImage(t, path)
	// Where the last record ends; a longer generation's stale records
	// may follow it in the file.
	logFile, end := ledger.LogEnd(l)
	accounts, keys := append(walAccounts, "e"), append(walKeys, "last")

	t.Run("whole log", func(t *testing.T) {
		// Copies: opening a crashed ledger replays its log into it.
		got := stateOf(t, open(t, crashImage(t, image), opts), walAccounts, walKeys)
		if diff := cmp.Diff(before, got); diff != "" {
			t.Errorf("recovered ledger differs (-before the crash +after):\n%s", diff)
		}
		want := stateOf(t, l, accounts, keys)
		if diff := cmp.Diff(want, stateOf(t, open(t, crashImage(t, withLast), opts), accounts, keys)); diff != "" {
			t.Errorf("recovered ledger with the last group differs (-before the crash +after):\n%s", diff)
		}
	})
	// lastStart is where the last record starts.
	lastStart := func(p string) int {
		offs, _ := logRecords(t, p+logFile)
		for i, o := range offs {
			if o < int(end) && (i+1 == len(offs) || offs[i+1] >= int(end)) {
				return o
			}
		}
		t.Fatalf("no record ends at %d of %s", end, logFile)
		return 0
	}
	edit := func(p string, f func(data []byte)) {
		data, err := os.ReadFile(p + logFile)
		if err != nil {
			t.Fatal(err)
		}
		f(data)
		if err := os.WriteFile(p+logFile, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// withoutLast is the state a recovery that loses the last group finds.
	withoutLast := before
	withoutLast.Accounts = map[string]ledger.Account{"e": {ID: "e"}}
	for id, a := range before.Accounts {
		withoutLast.Accounts[id] = a
	}
	withoutLast.Records = map[string]string{"last": "none"}
	for k, r := range before.Records {
		withoutLast.Records[k] = r
	}
	// A crash can leave the last record short or zeroed, never
	// acknowledged: Open trims it.
	for name, damage := range map[string]func(p string){
		"torn last record": func(p string) {
			if err := os.Truncate(p+logFile, end-1); err != nil {
				t.Fatal(err)
			}
		},
		"zeroed last record": func(p string) {
			edit(p, func(data []byte) { clear(data[lastStart(p):end]) })
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := crashImage(t, withLast)
			damage(p)
			got := stateOf(t, open(t, p, opts), accounts, keys)
			if diff := cmp.Diff(withoutLast, got); diff != "" {
				t.Errorf("recovered ledger differs from the one before the last group (-want +got):\n%s", diff)
			}
		})
	}
	// A crash does not flip bits: the last record, whole in the file and
	// failing its checksum, was acknowledged and is damaged. Open refuses
	// it; Check reports it and Repair drops it.
	t.Run("flipped bit in the last record", func(t *testing.T) {
		p := crashImage(t, withLast)
		start := lastStart(p)
		edit(p, func(data []byte) { data[end-2] ^= 0x10 })
		_, err := ledger.Open(p, clocked(opts))
		where := fmt.Sprintf("wallet.db%s record ", logFile)
		at := fmt.Sprintf(" at offset %d:", start)
		if !errors.Is(err, ledger.ErrCorrupt) || !strings.Contains(err.Error(), where) || !strings.Contains(err.Error(), at) {
			t.Fatalf("Open = %v, want ErrCorrupt naming %q and %q", err, where, at)
		}
		rep, err := ledger.Check(p, opts)
		if err != nil || rep.OK() || !rep.Repairable {
			t.Fatalf("Check = %+v, %v; want the damage found and repairable", rep, err)
		}
		rrep, err := ledger.Repair(p, opts)
		if err != nil || !rrep.Repaired || len(rrep.Drops) != 1 || rrep.Drops[0].Records != 1 {
			t.Fatalf("Repair = %+v, %v; want the last record dropped", rrep, err)
		}
		got := stateOf(t, open(t, p, opts), accounts, keys)
		if diff := cmp.Diff(withoutLast, got); diff != "" {
			t.Errorf("repaired ledger differs from the one before the last group (-want +got):\n%s", diff)
		}
	})
	t.Run("another ledger's log", func(t *testing.T) {
		// The bbolt file is new; the log left in its place belongs to
		// the old one and must not be replayed into it.
		p := crashImage(t, withLast)
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		fresh := open(t, p, opts)
		if got := stateOf(t, fresh, accounts, nil); got.Seq != 0 || got.Audit.Accounts != 0 {
			t.Errorf("new ledger beside an old log: seq %d, %d accounts; want an empty ledger", got.Seq, got.Audit.Accounts)
		}
	})
}

// TestFailedLogWrite checks that a group whose log record cannot be
// written is refused whole, leaving no trace in lookups, in later groups
// or in a recovery, and that the ledger carries on once the log writes
// again.
func TestFailedLogWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	opts := ledger.Options{CheckpointInterval: time.Hour}
	l := open(t, path, opts)
	apply(t, l, keyed(issue("a", 100), "i1"))
	apply(t, l, keyed(transfer("a", "b", 10, 1), "t1"))
	accounts, keys := []string{"a", "b"}, []string{"i1", "t1", "t2"}
	before := stateOf(t, l, accounts, keys)

	// The record is written but its fdatasync fails once: the ledger cuts
	// it off the log, so that no recovery replays a group it refused.
	fails := 1
	ledger.SetLogSync(l, func(f *os.File) error {
		if fails > 0 {
			fails--
			return errors.New("injected EIO")
		}
		return f.Sync()
	})
	res, err := l.Apply(t.Context(), []ledger.Op{keyed(transfer("a", "b", 5, 2), "t2")})
	if err == nil || errors.Is(err, ledger.ErrOutcomeUnknown) || l.Err() != nil {
		t.Fatalf("Apply whose fdatasync fails = %+v, %v (ledger: %v); want an error, the outcome known, the ledger usable", res, err, l.Err())
	}
	if diff := cmp.Diff(before, stateOf(t, l, accounts, keys)); diff != "" {
		t.Errorf("lookups after the failed group differ (-before +after):\n%s", diff)
	}
	checkRecovered(t, path, opts, before, accounts, keys, "a recovery replays the failed group")

	// The same operation again: its nonce was not used, and its receipt
	// takes the seq the failed group did not.
	res = apply(t, l, keyed(transfer("a", "b", 5, 2), "t2"))
	if res[0].Err != nil || res[0].Receipt.Seq != 3 {
		t.Fatalf("Apply after the log recovered = %+v, want receipt seq 3", res[0])
	}
	after := stateOf(t, l, accounts, keys)
	if a := after.Accounts["a"]; a.Balance != 85 || a.Nonce != 2 {
		t.Errorf("account a = %+v, want balance 85, nonce 2", a)
	}
	if err := l.Checkpoint(); err != nil {
		t.Fatalf("Checkpoint after the failed group = %v", err)
	}
	checkRecovered(t, path, opts, after, accounts, keys, "after the failed group and a checkpoint")
}

// TestLogUnrecoverable checks that when a failed log record cannot be cut
// off either, the group's outcome is reported unknown and the ledger
// refuses every later write, while lookups keep answering and a reopen
// recovers every acknowledged group.
func TestLogUnrecoverable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	opts := ledger.Options{CheckpointInterval: time.Hour}
	l, err := ledger.Open(path, clocked(opts))
	if err != nil {
		t.Fatal(err)
	}
	apply(t, l, keyed(issue("a", 100), "i1"))
	accounts, keys := []string{"a", "b"}, []string{"i1", "t1"}
	before := stateOf(t, l, accounts, keys)
	ledger.SetLogSync(l, func(*os.File) error { return errors.New("injected EIO") })
	_, err = l.Apply(t.Context(), []ledger.Op{keyed(transfer("a", "b", 5, 1), "t1")})
	if !errors.Is(err, ledger.ErrOutcomeUnknown) || !errors.Is(l.Err(), ledger.ErrFailed) {
		t.Fatalf("Apply whose record cannot be written or removed = %v (ledger: %v), want ErrOutcomeUnknown and the ledger failed", err, l.Err())
	}
	if _, err := l.Apply(t.Context(), []ledger.Op{issue("c", 1)}); !errors.Is(err, ledger.ErrFailed) {
		t.Errorf("Apply on a failed ledger = %v, want ErrFailed", err)
	}
	if err := l.Checkpoint(); !errors.Is(err, ledger.ErrFailed) {
		t.Errorf("Checkpoint on a failed ledger = %v, want ErrFailed", err)
	}
	if l.CheckpointDue() {
		t.Error("CheckpointDue() = true on a failed ledger")
	}
	if diff := cmp.Diff(before, stateOf(t, l, accounts, keys)); diff != "" {
		t.Errorf("lookups on the failed ledger differ (-before +after):\n%s", diff)
	}
	if err := l.Close(); err == nil {
		t.Error("Close of a failed ledger = nil, want the reason it skipped the final checkpoint")
	}
	// What the outcome was is up to the disk; what was acknowledged is
	// there either way.
	got := stateOf(t, open(t, path, opts), accounts, []string{"i1"})
	if a := got.Accounts["a"]; a.Nonce > 1 || got.Audit.Issued != 100 || got.Records["i1"] == "none" {
		t.Errorf("reopened ledger: a = %+v, issued %d, i1 %s; want the acknowledged issue", a, got.Audit.Issued, got.Records["i1"])
	}
}

// TestCheckpointFailure checks that a checkpoint whose bbolt commit fails
// fails the ledger (bbolt may have written the new meta page, after which
// the log's current generation would be skipped), and that a reopen finds
// every acknowledged group.
func TestCheckpointFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	var file *os.File
	opts := ledger.WithOpenFile(ledger.Options{CheckpointInterval: time.Hour}, func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
		file = f
		return f, err
	})
	l, err := ledger.Open(path, clocked(opts))
	if err != nil {
		t.Fatal(err)
	}
	apply(t, l, keyed(issue("a", 100), "i1"))
	apply(t, l, keyed(transfer("a", "b", 10, 1), "t1"))
	accounts, keys := []string{"a", "b"}, []string{"i1", "t1"}
	before := stateOf(t, l, accounts, keys)
	// bbolt reads through its memory map; its writes now fail.
	if err := file.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Checkpoint(); !errors.Is(err, ledger.ErrFailed) {
		t.Fatalf("Checkpoint whose commit fails = %v, want ErrFailed", err)
	}
	if _, err := l.Apply(t.Context(), []ledger.Op{issue("c", 1)}); !errors.Is(err, ledger.ErrFailed) {
		t.Errorf("Apply after a failed checkpoint = %v, want ErrFailed", err)
	}
	if diff := cmp.Diff(before, stateOf(t, l, accounts, keys)); diff != "" {
		t.Errorf("lookups after the failed checkpoint differ (-before +after):\n%s", diff)
	}
	_ = l.Close() // the file is already closed under it
	if diff := cmp.Diff(before, stateOf(t, open(t, path, ledger.Options{}), accounts, keys)); diff != "" {
		t.Errorf("reopened ledger differs (-before +after):\n%s", diff)
	}
}

// TestMissingLog checks that a file a crash left with groups in its log
// is refused without either log file, with a way out, rather than opened
// without them; that a file one checkpoint older than its log files
// recovers (they keep a generation until the one after next overwrites
// it); and that a log newer than that is refused.
func TestMissingLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	l := open(t, path, ledger.Options{CheckpointInterval: time.Hour})
	apply(t, l, keyed(issue("a", 100), "i1"))
	for _, missing := range []string{".wal", ".wal.1"} {
		image := crashImage(t, path)
		if err := os.Remove(image + missing); err != nil {
			t.Fatal(err)
		}
		if l, err := ledger.Open(image, clocked(ledger.Options{})); !errors.Is(err, ledger.ErrCorrupt) || !strings.Contains(err.Error(), "create an empty file") {
			if l != nil {
				_ = l.Close()
			}
			t.Fatalf("Open without %s = %v, want ErrLogMismatch saying how to go on", missing, err)
		}
	}
	logFile, _ := ledger.LogEnd(l)
	image := crashImage(t, path)
	if err := os.WriteFile(image+logFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := account(t, open(t, image, ledger.Options{}), "a"); got.Balance != 0 {
		t.Errorf("account a after opening with an empty log = %+v, want the logged issue gone", got)
	}

	older := crashImage(t, path)
	if err := l.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	apply(t, l, keyed(issue("a", 5), "i2"))
	image = crashImage(t, older)
	copyLogs(t, path, image)
	if got := account(t, open(t, image, ledger.Options{}), "a"); got.Balance != 105 {
		t.Errorf("account a of a file one checkpoint older than its log = %+v, want balance 105", got)
	}

	if err := l.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	apply(t, l, keyed(issue("a", 7), "i3"))
	image = crashImage(t, older)
	copyLogs(t, path, image)
	if l, err := ledger.Open(image, clocked(ledger.Options{})); !errors.Is(err, ledger.ErrCorrupt) || !strings.Contains(err.Error(), "restored from different times") {
		if l != nil {
			_ = l.Close()
		}
		t.Errorf("Open of a file two checkpoints older than its log = %v, want ErrCorrupt naming the mismatch", err)
	}
}

// copyLogs copies the write-ahead log files of the ledger at from over
// those of the ledger at to.
func copyLogs(t *testing.T, from, to string) {
	t.Helper()
	for _, suffix := range []string{".wal", ".wal.1"} {
		data, err := os.ReadFile(from + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to+suffix, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLogLimit checks that a write-ahead log past its size checkpoints
// before it takes another group, so it stays bounded without a committer.
func TestLogLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	l := open(t, path, ledger.Options{CheckpointInterval: time.Hour, CheckpointBytes: 1})
	for i := range 20 {
		apply(t, l, keyed(issue("a", 1), fmt.Sprintf("k%d", i)))
		if !l.CheckpointDue() {
			t.Fatalf("CheckpointDue() = false after group %d with CheckpointBytes 1", i)
		}
	}
	for _, suffix := range []string{".wal", ".wal.1"} {
		fi, err := os.Stat(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > 4096 {
			t.Errorf("log file %s is %d bytes after 20 one-op groups, each checkpointed before the next: want one record's size", suffix, fi.Size())
		}
	}
	checkAudit(t, l)
}

// TestPanicInGroupLeavesNoTrace checks that a group that panics half-way
// (here in Options.Render, after its first op was written) leaves nothing
// for the next group to commit along with its own.
func TestPanicInGroupLeavesNoTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	render := func(r ledger.Result) (int, []byte) {
		if r.Receipt != nil && r.Receipt.Amount == 13 {
			panic("render 13")
		}
		return 200, r.Receipt.AppendJSON(nil)
	}
	opts := ledger.Options{Render: render, CheckpointInterval: time.Hour}
	l := open(t, path, opts)
	apply(t, l, keyed(issue("a", 100), "i1"))
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Apply with a panicking Render did not panic")
			}
		}()
		// The first op's receipt and record are written before the
		// second op panics.
		_, _ = l.Apply(t.Context(), []ledger.Op{keyed(issue("b", 5), "i2"), keyed(issue("x", 13), "i4")})
	}()
	res := apply(t, l, keyed(issue("c", 1), "i3"))
	if res[0].Receipt.Seq != 2 {
		t.Errorf("receipt after the panicked group has seq %d, want 2", res[0].Receipt.Seq)
	}
	want := stateOf(t, l, []string{"a", "b", "c"}, []string{"i1", "i2", "i3"})
	if b := want.Accounts["b"]; b.Balance != 0 || want.Records["i2"] != "none" || want.Supply.Issued != 101 {
		t.Errorf("after the panicked group: b = %+v, record i2 = %s, issued %d; want nothing of it", b, want.Records["i2"], want.Supply.Issued)
	}
	if err := l.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, stateOf(t, l, []string{"a", "b", "c"}, []string{"i1", "i2", "i3"})); diff != "" {
		t.Errorf("the checkpoint changed what lookups see (-before +after):\n%s", diff)
	}
}

// TestLookupsDuringCheckpoints runs lookups against a writer that
// checkpoints often: every lookup must see one state that existed (the
// sum of balances is the supply; receipt seqs have no gaps; two accounts
// that only trade with each other keep their total).
func TestLookupsDuringCheckpoints(t *testing.T) {
	l := open(t, filepath.Join(t.TempDir(), "wallet.db"), ledger.Options{CheckpointInterval: time.Millisecond})
	apply(t, l, issue("a", 1000), issue("b", 1000))
	done := make(chan struct{})
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				a, err := l.Audit()
				if err == nil && a.Balances != a.Issued-a.Burned {
					err = fmt.Errorf("audit %+v: balances are not the supply", a)
				}
				var rs []ledger.Receipt
				if err == nil {
					rs, err = l.Receipts(0, 1<<20)
				}
				for i, r := range rs {
					if err == nil && r.Seq != uint64(i+1) {
						err = fmt.Errorf("receipt %d has seq %d", i+1, r.Seq)
					}
				}
				if err == nil {
					x, _, err1 := l.Account("a")
					y, _, err2 := l.Account("b")
					err = errors.Join(err1, err2)
					// Read one after the other: a commit may come between,
					// but never takes from both or gives to both.
					if err == nil && (x.Balance > 2000 || y.Balance > 2000) {
						err = fmt.Errorf("balances %d and %d", x.Balance, y.Balance)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var nonceA, nonceB uint64
	for i := range 300 {
		var op ledger.Op
		if i%2 == 0 {
			nonceA++
			op = transfer("a", "b", 3, nonceA)
		} else {
			nonceB++
			op = transfer("b", "a", 2, nonceB)
		}
		apply(t, l, keyed(op, fmt.Sprintf("k%d", i)))
		if l.CheckpointDue() {
			if err := l.Checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(done)
	wg.Wait()
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	a := checkAudit(t, l)
	if a.Receipts != 302 {
		t.Errorf("Audit().Receipts = %d, want 302", a.Receipts)
	}
}

// TestCrashMidCheckpoint opens what a crash during a checkpoint leaves:
// the log's next generation started, in the other file, and groups
// committed to it, while the bbolt file still lacks the generation
// before. Lookups meanwhile, the recovery, and a checkpoint after it all
// see every group.
func TestCrashMidCheckpoint(t *testing.T) {
	clk := wallettest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	opts := ledger.Options{IdempotencyTTL: time.Hour, Now: clk.Now, CheckpointInterval: time.Hour}
	path := filepath.Join(t.TempDir(), "wallet.db")
	l := open(t, path, opts)
	apply(t, l, keyed(issue("a", 1000), "i1"), keyed(issue("b", 500), "i2"))
	before, _ := ledger.LogEnd(l)
	ledger.Rotate(l)
	after, _ := ledger.LogEnd(l)
	if before == after {
		t.Fatalf("the next generation went to the same file %s", after)
	}
	// A key of the frozen generation again, and transfers that read its
	// accounts.
	res := apply(t, l, keyed(issue("a", 1000), "i1"), keyed(transfer("a", "c", 100, 1), "t1"))
	if !res[0].Replayed {
		t.Errorf("replay of a frozen generation's key = %+v, want its record", res[0])
	}
	apply(t, l, keyed(transfer("b", "a", 50, 1), "t2"), keyed(burn("c", 10, 1), "u1"))
	accounts, keys := []string{"a", "b", "c"}, []string{"i1", "i2", "t1", "t2", "u1"}
	want := stateOf(t, l, accounts, keys)
	if a := want.Accounts["a"]; a.Balance != 950 || a.Nonce != 1 || want.Audit.Receipts != 5 {
		t.Fatalf("lookups with a frozen generation: a = %+v, %d receipts; want balance 950, nonce 1, 5 receipts", a, want.Audit.Receipts)
	}
	checkRecovered(t, path, opts, want, accounts, keys, "with a frozen generation")
	// The checkpoint that was cut short, done now, writes the frozen
	// generation; the next one the current.
	if !l.CheckpointDue() {
		t.Error("CheckpointDue() = false after a checkpoint was cut short")
	}
	for range 2 {
		if err := l.Checkpoint(); err != nil {
			t.Fatal(err)
		}
	}
	if l.Pending() {
		t.Error("Pending() = true after two checkpoints")
	}
	if diff := cmp.Diff(want, stateOf(t, l, accounts, keys)); diff != "" {
		t.Errorf("lookups after the checkpoints differ (-before +after):\n%s", diff)
	}
	checkRecovered(t, path, opts, want, accounts, keys, "after the checkpoints")
}

// TestCheckpointsAlongsideWriters runs checkpoints in one goroutine while
// another commits groups and others look up, under the race detector:
// every group committed is in the ledger, lookups always see a state that
// existed, and a reopen sees the same.
func TestCheckpointsAlongsideWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	opts := ledger.Options{CheckpointInterval: time.Hour}
	l := open(t, path, opts)
	apply(t, l, issue("a", 1000), issue("b", 1000))
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Go(func() {
		n := 0
		for {
			select {
			case <-done:
				if n == 0 {
					errs <- errors.New("no checkpoint ran alongside the writer")
				}
				return
			default:
			}
			if err := l.Checkpoint(); err != nil {
				errs <- err
				return
			}
			n++
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			a, err := l.Audit()
			if err == nil && (a.Balances != a.Issued-a.Burned || uint64(a.Receipts) != a.Seq) {
				err = fmt.Errorf("audit %+v: balances are not the supply, or receipts are missing", a)
			}
			if err != nil {
				errs <- err
				return
			}
		}
	})
	var nonceA, nonceB uint64
	for i := range 400 {
		ops := []ledger.Op{}
		nonceA++
		ops = append(ops, keyed(transfer("a", "b", 3, nonceA), fmt.Sprintf("a%d", i)))
		nonceB++
		ops = append(ops, keyed(transfer("b", "a", 2, nonceB), fmt.Sprintf("b%d", i)))
		if i%50 == 0 {
			// A key of an earlier group, maybe frozen, maybe in the file.
			ops = append(ops, keyed(transfer("a", "b", 3, 1), "a0"))
		}
		res := apply(t, l, ops...)
		if i%50 == 0 && i > 0 && !res[2].Replayed {
			t.Errorf("group %d: key a0 = %+v, want its record replayed", i, res[2])
		}
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	keys := []string{"a0", "a399", "b399"}
	want := stateOf(t, l, []string{"a", "b"}, keys)
	if a := want.Accounts["a"]; a.Balance != 1000-400 || a.Nonce != 400 || want.Seq != 802 {
		t.Errorf("account a = %+v, seq %d; want balance 600, nonce 400, seq 802", a, want.Seq)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, stateOf(t, open(t, path, opts), []string{"a", "b"}, keys)); diff != "" {
		t.Errorf("reopened ledger differs (-before +after):\n%s", diff)
	}
}

// TestForeignLogFiles checks that log files another ledger left beside a
// new bbolt file are neither replayed nor, after a clean close, taken for
// a log newer than the file.
func TestForeignLogFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.db")
	for _, suffix := range []string{".wal", ".wal.1"} {
		// A generation above any a new ledger picks.
		if err := os.WriteFile(path+suffix, ledger.ForeignRecord(1<<63), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l, err := ledger.Open(path, clocked(ledger.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, path, ledger.Options{CheckpointInterval: time.Hour})
	if got := stateOf(t, l, []string{"a"}, nil); got.Seq != 0 || got.Audit.Accounts != 0 {
		t.Errorf("new ledger beside foreign log files: seq %d, %d accounts; want an empty ledger", got.Seq, got.Audit.Accounts)
	}
	apply(t, l, issue("a", 1))
	if got := account(t, open(t, crashImage(t, path), ledger.Options{}), "a"); got.Balance != 1 {
		t.Errorf("account a after a crash = %+v, want the logged issue", got)
	}
}

// TestCheckpointRemapsWhileGroupSyncs checks that a checkpoint whose
// commit grows bbolt's memory map, for which bbolt waits for every read
// transaction, finishes while a group waits for its log's fdatasync: a
// group holding its read transaction there would deadlock with lookups,
// which wait for the remap while the group waits for them.
func TestCheckpointRemapsWhileGroupSyncs(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 100<<10)
	render := func(r ledger.Result) (int, []byte) { return 200, big }
	opts := ledger.WithMmapSize(ledger.Options{Render: render, CheckpointInterval: time.Hour}, 64<<10)
	l := open(t, filepath.Join(t.TempDir(), "wallet.db"), opts)
	// Records of 100 KiB each: the checkpoint of these outgrows the map.
	for i := range 4 {
		apply(t, l, keyed(issue("a", 1), fmt.Sprintf("k%d", i)))
	}
	ledger.Rotate(l)
	entered, release := make(chan struct{}), make(chan struct{})
	ledger.SetLogSync(l, func(f *os.File) error {
		close(entered)
		<-release
		return f.Sync()
	})
	applied := make(chan error, 1)
	go func() {
		_, err := l.Apply(t.Context(), []ledger.Op{issue("b", 1)})
		applied <- err
	}()
	<-entered
	checkpointed := make(chan error, 1)
	go func() { checkpointed <- l.Checkpoint() }()
	done := false
	select {
	case err := <-checkpointed:
		done = true
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the checkpoint did not finish within 10 s while a group waited for fdatasync")
	}
	close(release)
	if err := <-applied; err != nil {
		t.Error(err)
	}
	ledger.SetLogSync(l, nil)
	if !done {
		// Without the fix the three wait for each other for good: the
		// test binary's timeout reports it, with the stacks.
		<-checkpointed
	}
	if got := account(t, l, "b"); got.Balance != 1 {
		t.Errorf("account b = %+v, want the group that waited", got)
	}
}

// checkRecovered opens what kill -9 would leave of the ledger at path
// now (crashImage) and checks that lookups there show want; what says
// when.
func checkRecovered(t *testing.T, path string, opts ledger.Options, want state, accounts, keys []string, what string) {
	t.Helper()
	if diff := cmp.Diff(want, stateOf(t, open(t, crashImage(t, path), opts), accounts, keys)); diff != "" {
		t.Errorf("%s: recovered ledger differs (-before the crash +after):\n%s", what, diff)
	}
}
