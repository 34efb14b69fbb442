package ledger_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
)

// ack is what a client was told: the receipt of its keyed operation.
type ack struct {
	key  string
	seq  uint64
	body []byte
}

// workerAccount is the account of load's worker w: an id that no other
// id contains and that no binary field is likely to hold.
func workerAccount(w int) string { return fmt.Sprintf("worker-%d-5f3a9c0e", w) }

// load runs writers in several goroutines against a ledger at a new path,
// with checkpoints alongside, then leaves records in both log files (a
// generation not yet in the bbolt file and the next one) and one group
// whose answer never reached its client (the last record). It returns
// the crash image's path and the acknowledgements.
func load(t *testing.T) (string, []ack) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "wallet.db")
	l := open(t, path, ledger.Options{CheckpointInterval: 2 * time.Millisecond})
	var (
		mu   sync.Mutex
		acks []ack
		wg   sync.WaitGroup
		errs = make(chan error, 8)
		done = make(chan struct{})
	)
	record := func(ops []ledger.Op, res []ledger.Result) {
		mu.Lock()
		defer mu.Unlock()
		for i, r := range res {
			if r.Receipt != nil {
				acks = append(acks, ack{key: ops[i].Idem.Key, seq: r.Receipt.Seq, body: r.Record.Body})
			}
		}
	}
	applyKeyed := func(w, i int, nonce uint64) error {
		ops := []ledger.Op{
			keyed(issue(workerAccount(w), 10), fmt.Sprintf("i-%d-%d", w, i)),
			keyed(transfer(workerAccount(w), "sink", 3, nonce), fmt.Sprintf("t-%d-%d", w, i)),
		}
		res, err := l.Apply(t.Context(), ops)
		if err != nil {
			return err
		}
		record(ops, res)
		return nil
	}
	wg.Go(func() {
		n := 0
		for {
			select {
			case <-done:
				if n == 0 {
					errs <- errors.New("no checkpoint ran during the load")
				}
				return
			case <-time.After(l.CheckpointIn()):
			}
			if l.CheckpointDue() {
				if err := l.Checkpoint(); err != nil {
					errs <- err
					return
				}
				n++
			}
		}
	})
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Go(func() {
			for i := range 150 {
				if err := applyKeyed(w, i, uint64(i+1)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	writers.Wait()
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Both log files hold records: generation G, not yet in the bbolt
	// file, and G+1.
	if err := l.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	for i := 150; i < 160; i++ {
		if err := applyKeyed(0, i, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	ledger.Rotate(l)
	for i := 160; i < 170; i++ {
		if err := applyKeyed(0, i, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	// In flight at the crash: committed, but its client never heard.
	apply(t, l, keyed(issue("late", 1), "in-flight"))
	return crashImage(t, path), acks
}

// logRecords returns where each record of the run at the start of the
// log file at p starts, and where the run ends.
func logRecords(t *testing.T, p string) ([]int, int) {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int
	off := 0
	for off+8 <= len(data) {
		n := int(binary.BigEndian.Uint32(data[off:]))
		if n == 0 || off+8+n > len(data) {
			break
		}
		offs = append(offs, off)
		off += 8 + n
	}
	return offs, off
}

// logSuffixes returns the suffixes of the older and the newer log
// generations' files of the image at p: the newer holds the in-flight
// group, the image's last record.
func logSuffixes(t *testing.T, p string) (older, newer string) {
	t.Helper()
	data, err := os.ReadFile(p + ".wal")
	if err != nil {
		t.Fatal(err)
	}
	offs, _ := logRecords(t, p+".wal")
	if len(offs) > 0 && bytes.Contains(data[offs[len(offs)-1]:], []byte("in-flight")) {
		return ".wal.1", ".wal"
	}
	return ".wal", ".wal.1"
}

func flip(t *testing.T, p string, at func(data []byte) int) {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	data[at(data)] ^= 0xa5
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkAcks opens the ledger at p and checks that every acknowledged
// operation with a seq of at most upTo (all when upTo is 0) replays its
// recorded receipt, the rest are absent, and supply = Σ balances.
func checkAcks(t *testing.T, p string, acks []ack, upTo uint64) {
	t.Helper()
	l, err := ledger.Open(p, clocked(ledger.Options{}))
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	defer func() { _ = l.Close() }()
	checkAudit(t, l)
	for _, a := range acks {
		rec, ok, err := l.Idempotency(a.key)
		if err != nil {
			t.Fatalf("Idempotency(%q) = %v", a.key, err)
		}
		if upTo != 0 && a.seq > upTo {
			if ok {
				t.Errorf("Idempotency(%q) = %s after a repair that dropped seq %d", a.key, rec.Body, a.seq)
			}
			continue
		}
		if !ok || !bytes.Equal(rec.Body, a.body) {
			t.Errorf("Idempotency(%q) = %s, %v; want the acknowledged receipt %s", a.key, rec.Body, ok, a.body)
		}
		if l.Seq() < a.seq {
			t.Errorf("Seq() = %d, below the acknowledged %d", l.Seq(), a.seq)
		}
	}
}

// TestCorruption damages the files a real load left, one way per case:
// Open either recovers every acknowledged operation exactly or refuses
// with ErrCorrupt naming the file; Check finds every refused case; and
// Repair, where cutting the log can repair it, leaves a ledger that opens
// and lacks exactly the acknowledged operations it reported dropped.
func TestCorruption(t *testing.T) {
	image, acks := load(t)
	other, _ := load(t)
	older, newer := logSuffixes(t, image)
	pageSize := os.Getpagesize()
	for _, tc := range []struct {
		name       string
		damage     func(t *testing.T, p string) string // returns the file's suffix
		recovers   bool                                // Open recovers every acknowledged write
		refuses    bool                                // Open refuses
		repairable bool
	}{
		{
			name: "flipped byte 20 of the newest generation",
			damage: func(t *testing.T, p string) string {
				flip(t, p+newer, func([]byte) int { return 20 })
				return newer
			},
			refuses: true, repairable: true,
		},
		{
			name: "flipped byte in the older generation",
			damage: func(t *testing.T, p string) string {
				offs, _ := logRecords(t, p+older)
				flip(t, p+older, func([]byte) int { return offs[len(offs)/2] + 30 })
				return older
			},
			refuses: true, repairable: true,
		},
		{
			name: "flipped byte in the middle of a record",
			damage: func(t *testing.T, p string) string {
				offs, _ := logRecords(t, p+newer)
				flip(t, p+newer, func([]byte) int { return (offs[3] + offs[4]) / 2 })
				return newer
			},
			refuses: true, repairable: true,
		},
		{
			name: "zeroed range in the newest generation",
			damage: func(t *testing.T, p string) string {
				offs, _ := logRecords(t, p+newer)
				data, err := os.ReadFile(p + newer)
				if err != nil {
					t.Fatal(err)
				}
				clear(data[offs[2]+4 : offs[5]])
				if err := os.WriteFile(p+newer, data, 0o600); err != nil {
					t.Fatal(err)
				}
				return newer
			},
			refuses: true, repairable: true,
		},
		{
			name: "truncated newest generation (torn tail)",
			damage: func(t *testing.T, p string) string {
				offs, _ := logRecords(t, p+newer)
				if err := os.Truncate(p+newer, int64(offs[len(offs)-1]+20)); err != nil {
					t.Fatal(err)
				}
				return newer
			},
			recovers: true,
		},
		{
			name: "truncated older generation",
			damage: func(t *testing.T, p string) string {
				offs, _ := logRecords(t, p+older)
				if err := os.Truncate(p+older, int64(offs[len(offs)-3]+2)); err != nil {
					t.Fatal(err)
				}
				return older
			},
			refuses: true, repairable: true,
		},
		{
			// The older generation's run then stops at a whole zero
			// header, as at its end: only the newer generation's start
			// record says that records are missing.
			name: "zeroed tail of the older log generation",
			damage: func(t *testing.T, p string) string {
				offs, _ := logRecords(t, p+older)
				data, err := os.ReadFile(p + older)
				if err != nil {
					t.Fatal(err)
				}
				clear(data[offs[len(offs)/2]:])
				if err := os.WriteFile(p+older, data, 0o600); err != nil {
					t.Fatal(err)
				}
				return older
			},
			refuses: true, repairable: true,
		},
		{
			name: "flipped byte in a value of the main file",
			damage: func(t *testing.T, p string) string {
				// Every copy of worker 1's account value (its key and
				// value lie side by side in a leaf page), the live one
				// among them; no logged group rewrites it, and Open
				// reads it to check the supply. The id occurs nowhere
				// else but in JSON, where a quote follows it, so the
				// flip always lands in a value and never in bbolt's
				// page structure.
				data, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for i := 0; ; {
					j := bytes.Index(data[i:], []byte(workerAccount(1)))
					if j < 0 {
						break
					}
					if at := i + j + len(workerAccount(1)); at+8 < len(data) && data[at] != '"' {
						data[at+6] ^= 0x40 // in the balance
						n++
					}
					i += j + 1
				}
				if n == 0 {
					t.Fatal("worker 1's account not found in the file")
				}
				if err := os.WriteFile(p, data, 0o600); err != nil {
					t.Fatal(err)
				}
				return ""
			},
			refuses: true,
		},
		{
			name: "flipped byte in the newer meta page",
			damage: func(t *testing.T, p string) string {
				flip(t, p, func(data []byte) int {
					// txid at offset 64 of each meta page.
					if binary.LittleEndian.Uint64(data[64:]) > binary.LittleEndian.Uint64(data[pageSize+64:]) {
						return 64
					}
					return pageSize + 64
				})
				return "*" // the older meta's log generation may be gone
			},
			// bbolt reads the older meta; the log holds what the newer
			// checkpoint wrote unless a rotation reused its file since.
			recovers: true, refuses: true,
		},
		{
			name: "flipped byte in both meta pages",
			damage: func(t *testing.T, p string) string {
				flip(t, p, func([]byte) int { return 64 })
				flip(t, p, func([]byte) int { return pageSize + 64 })
				return ""
			},
			refuses: true,
		},
		{
			name: "log file from another data dir",
			damage: func(t *testing.T, p string) string {
				data, err := os.ReadFile(other + newer)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p+newer, data, 0o600); err != nil {
					t.Fatal(err)
				}
				return newer
			},
			refuses: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := crashImage(t, image)
			file := filepath.Base(p) + tc.damage(t, p)
			named := "storage corrupt: " + file + " "
			if strings.HasSuffix(file, "*") {
				named = "storage corrupt: " + filepath.Base(p) // any file of the data dir
			}
			_, err := ledger.Open(crashImage(t, p), clocked(ledger.Options{}))
			switch {
			case err == nil && tc.recovers:
				checkAcks(t, crashImage(t, p), acks, 0)
				if rep, err := ledger.Check(p, ledger.Options{}); err != nil || !rep.OK() {
					t.Errorf("Check(recoverable damage) = %+v, %v; want no problem", rep, err)
				}
				return
			case err == nil:
				t.Fatal("Open of damaged files succeeded, want ErrCorrupt")
			case !tc.refuses || !errors.Is(err, ledger.ErrCorrupt) || !(strings.Contains(err.Error(), named) || strings.Contains(err.Error(), strings.TrimSuffix(named, " ")+":")):
				// A flip that lands in a key rather than a value can fail
				// bbolt's page walk at open: "wallet.db: the file cannot be read".
				t.Fatalf("Open = %v, want ErrCorrupt naming %s", err, file)
			}
			t.Logf("Open: %v", err)
			rep, err := ledger.Check(p, ledger.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() || !strings.HasPrefix(rep.Problems[0].File, filepath.Base(p)) {
				t.Fatalf("Check = %+v, want the damage found", rep.Problems)
			}
			if rep.Repairable != tc.repairable {
				t.Fatalf("Check says repairable %v, want %v: %+v", rep.Repairable, tc.repairable, rep.Problems)
			}
			rrep, err := ledger.Repair(p, ledger.Options{})
			if !tc.repairable {
				if !errors.Is(err, ledger.ErrCorrupt) || !strings.Contains(err.Error(), "backup") {
					t.Errorf("Repair = %v, want it refused with restore from backup", err)
				}
				return
			}
			if err != nil || !rrep.Repaired {
				t.Fatalf("Repair = %+v, %v; want it repaired", rrep, err)
			}
			t.Logf("Repair drops receipts %d to %d, %d keys readable: %+v", rrep.LostFrom, rrep.LostTo, len(rrep.LostKeys), dropsOf(rrep))
			// Exactly the acknowledged operations in the reported range
			// are gone: every one from LostFrom to LostTo.
			var maxAck uint64
			for _, a := range acks {
				maxAck = max(maxAck, a.seq)
			}
			if rrep.LostFrom == 0 || rrep.LostTo < maxAck || rrep.LostFrom > maxAck {
				t.Errorf("Repair reports losing seqs %d to %d, but acknowledged seqs run to %d after the damage", rrep.LostFrom, rrep.LostTo, maxAck)
			}
			// Keys of the damaged records cannot be read; every
			// acknowledged key after the first readable one must be
			// listed.
			lost := map[string]bool{}
			for _, k := range rrep.LostKeys {
				lost[k] = true
			}
			firstListed := uint64(1<<64 - 1)
			for _, a := range acks {
				if lost[a.key] {
					firstListed = min(firstListed, a.seq)
				}
			}
			if len(rrep.LostKeys) == 0 {
				t.Error("Repair lists no lost keys, though readable records follow the damage")
			}
			for _, a := range acks {
				if a.seq >= rrep.LostFrom && !lost[a.key] && a.seq > firstListed {
					t.Errorf("acknowledged key %q (seq %d) is lost but not reported", a.key, a.seq)
				}
			}
			checkAcks(t, p, acks, rrep.LostFrom-1)
			if rep, err := ledger.Check(p, ledger.Options{}); err != nil || !rep.OK() {
				t.Errorf("Check after Repair and Open = %+v, %v; want healthy", rep, err)
			}
		})
	}
}

func dropsOf(r ledger.Report) []string {
	var out []string
	for _, d := range r.Drops {
		out = append(out, fmt.Sprintf("%s gen %d records %d-%d (%d, %d bytes)", d.File, d.Gen, d.First, d.Last, d.Records, d.Bytes))
	}
	return out
}

// TestCheckHealthyLedger checks that a ledger after a real load, and
// its crash image, are reported healthy.
func TestCheckHealthyLedger(t *testing.T) {
	image, acks := load(t)
	rep, err := ledger.Check(image, ledger.Options{})
	if err != nil || !rep.OK() || rep.Drops != nil {
		t.Fatalf("Check(healthy) = %+v, %v; want nothing", rep, err)
	}
	if rep.Seq < acks[len(acks)-1].seq {
		t.Errorf("Check's Seq = %d, want at least %d", rep.Seq, acks[len(acks)-1].seq)
	}
	checkAcks(t, image, acks, 0)
}
