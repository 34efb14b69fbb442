package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// crashOpts are the crash test's store: data holds the last 50 groups'
// keys, last the index of the last group.
var crashOpts = Options{Buckets: []Bucket{{Name: "data"}, {Name: "last"}}, CheckpointInterval: time.Hour}

// crashWindow is how many groups' keys the data bucket keeps.
const crashWindow = 50

func crashKey(i int) []byte   { return fmt.Appendf(nil, "g%06d", i) }
func crashValue(i int) []byte { return fmt.Appendf(nil, "value of group %d", i) }

// crashGroup writes group i: its key, the deletion of the key crashWindow
// groups before, the last index, and one sequence number, which must be
// i+1.
func crashGroup(tx *Tx, i int) error {
	if err := tx.Put(0, crashKey(i), crashValue(i)); err != nil {
		return err
	}
	if i >= crashWindow {
		if err := tx.Delete(0, crashKey(i-crashWindow)); err != nil {
			return err
		}
	}
	if s := tx.NextSeq(); s != uint64(i+1) {
		return fmt.Errorf("group %d: NextSeq = %d, want %d", i, s, i+1)
	}
	return tx.Put(1, []byte("last"), binary.BigEndian.AppendUint64(nil, uint64(i)))
}

// crashCopy is the store's files as kill -9 would leave them at one
// moment, with what the store had acknowledged then and where its log
// ended.
type crashCopy struct {
	path    string
	acked   int    // groups acknowledged to the writer before the copy
	logFile string // suffix of the file the next record would go to
	logOff  int64  // where in it
	index   uint32 // that record's index in its generation
}

// copyNow copies d's files, holding the writers' lock: no group is
// appended and no generation starts meanwhile, while a checkpoint may be
// writing the bbolt file (a copy reads its meta pages first, and bbolt
// writes the pages a meta names before the meta). Every group the store
// acknowledged is on disk then, as after kill -9.
func copyNow(t *testing.T, d *DB, acked *atomic.Int64) crashCopy {
	t.Helper()
	c := crashCopy{path: filepath.Join(t.TempDir(), filepath.Base(d.path))}
	err := copyFiles(d, c.path, func() {
		c.acked, c.logFile, c.logOff, c.index = int(acked.Load()), walSuffixes[d.log.gen%2], d.log.off, d.log.index
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// prefixOf opens the store at path and returns how many groups it holds,
// checking that they are groups 0 to n-1 exactly: the data bucket holds
// the window of keys before n, both ways, and the counter goes on from n.
func prefixOf(t *testing.T, path string) (int, Recovery) {
	t.Helper()
	d, err := Open(path, crashOpts)
	if err != nil {
		t.Fatalf("Open of a crash copy = %v, want it to open", err)
	}
	defer func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	}()
	n := 0
	err = d.Update(func(tx *Tx) error {
		if v := tx.Get(1, []byte("last")); v != nil {
			n = int(binary.BigEndian.Uint64(v)) + 1
		}
		var want [][2]string
		for i := max(0, n-crashWindow); i < n; i++ {
			want = append(want, [2]string{string(crashKey(i)), string(crashValue(i))})
		}
		if got := readKVs(tx, 0, nil, nil, false, 0); fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("last group %d, but the data bucket holds %d keys %v, want %v", n-1, len(got), got, want)
		}
		if s := tx.NextSeq(); s != uint64(n+1) {
			return fmt.Errorf("last group %d, but NextSeq = %d, want %d", n-1, s, n+1)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n, d.Recovery()
}

// TestCrashCopies takes copies of a store's files at random moments of a
// running workload (one writer, checkpoints running back to back), as
// kill -9 would leave them, and reopens each: it must hold exactly the
// groups acknowledged before the copy, a prefix of them and none
// missing. Each copy is also reopened with a torn append at the log's end
// (the first sector of a record written, the rest zero): that record is
// trimmed, and reported where it was. And with a byte flipped in the
// newest generation's last group, which is whole in the file: it is
// refused, naming the file, record and offset.
func TestCrashCopies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, crashOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	var acked atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 2)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := d.Update(func(tx *Tx) error { return crashGroup(tx, i) }); err != nil {
				errs <- err
				return
			}
			acked.Store(int64(i + 1))
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := d.Checkpoint(); err != nil {
				errs <- err
				return
			}
		}
	})
	rnd := rand.New(rand.NewPCG(3, 4))
	var copies []crashCopy
	for range 12 {
		time.Sleep(time.Duration(rnd.IntN(20)) * time.Millisecond) // a random moment, not a wait for a condition
		copies = append(copies, copyNow(t, d, &acked))
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, c := range copies {
		t.Run(fmt.Sprintf("copy %d after %d groups", i, c.acked), func(t *testing.T) {
			torn := imageOf(t, c.path)
			damaged := imageOf(t, c.path)
			n, rec := prefixOf(t, c.path)
			if n < c.acked || n > c.acked+1 {
				// The writer counts a group once its Update returns;
				// the copy may come in between.
				t.Fatalf("copy holds groups 0 to %d, want the %d acknowledged before it (or one more)", n-1, c.acked)
			}
			if rec.Trimmed != nil {
				t.Errorf("Recovery().Trimmed = %+v, want nothing: kill -9 tears nothing", rec.Trimmed)
			}

			tornAppend(t, torn+c.logFile, c.logOff, c.index, n)
			tn, trec := prefixOf(t, torn)
			if want := (&Trim{File: filepath.Base(torn) + c.logFile, Record: c.index, Offset: c.logOff}); trec.Trimmed == nil ||
				trec.Trimmed.File != want.File || trec.Trimmed.Record != want.Record || trec.Trimmed.Offset != want.Offset {
				t.Errorf("Recovery().Trimmed with a torn append = %+v, want record %d at offset %d of %s", trec.Trimmed, want.Record, want.Offset, want.File)
			}
			if tn != n {
				t.Errorf("copy with a torn append holds %d groups, want %d: the torn one is left out", tn, n)
			}

			if c.index < 2 {
				return // the generation holds no group yet
			}
			offs := recordOffsets(t, damaged+c.logFile)
			last := offs[c.index-1]
			editFile(t, damaged+c.logFile, func(b []byte) []byte {
				b[last+walHeader+walRecordHead+2] ^= 0x01
				return b
			})
			dd, err := Open(damaged, crashOpts)
			var ce *CorruptError
			want := fmt.Sprintf("record %d at offset %d", c.index-1, last)
			if !errors.As(err, &ce) || ce.File != filepath.Base(damaged)+c.logFile || ce.Where != want {
				if dd != nil {
					_ = dd.Close()
				}
				t.Errorf("Open with the last group's byte flipped = %v, want a *CorruptError at %s%s %s", err, filepath.Base(damaged), c.logFile, want)
			}
		})
	}
}

// tornAppend writes at off of the log file p what a crash during the
// append of group n (the index-th record of its generation) can leave:
// the record's first sector, after which the file system had not written
// the rest, which reads zero.
func tornAppend(t *testing.T, p string, off int64, index uint32, n int) {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	gen := binary.BigEndian.Uint64(data[walHeader:])
	es := []entry{{b: 0, k: crashKey(n), v: bytes.Repeat([]byte("t"), 3*walSector)}}
	rec := appendRecord(nil, gen, index, es)
	written := (off+walHeader+walRecordHead+walSector-1)/walSector*walSector - off
	if written < walHeader+walRecordHead {
		written += walSector
	}
	end := off + int64(len(rec))
	if int64(len(data)) < end {
		data = append(data, make([]byte, end-int64(len(data)))...)
	}
	copy(data[off:], rec[:written])
	clear(data[off+written : end])
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
