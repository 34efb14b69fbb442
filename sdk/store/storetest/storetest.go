// Package storetest holds what tests of a plugin built on package store
// need and its plugins must not: moving a store into states that only a
// crash or a damaged file leaves, naming where its log ends, copying its
// files as kill -9 leaves them, and Crash, the crash suite a plugin runs
// against its own writes. It is for tests only; it must not be imported
// by a plugin's production code.
package storetest

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/store/internal/testhook"
)

// LogEnd returns the base name of the write-ahead log file that d's next
// record goes to, and where in it: the end of its last record.
func LogEnd(d *store.DB) (string, int64) { return testhook.LogEnd(d) }

// Rotate starts d's write-ahead log's next generation, as a checkpoint
// does first, and leaves the last one's groups out of the bbolt file, as
// a checkpoint that has not committed yet does: the state a crash in the
// middle of a checkpoint leaves.
func Rotate(d *store.DB) error { return testhook.Rotate(d) }

// ForeignRecord returns a whole log record of generation gen that puts
// key "foreign" in bucket 0, as another store's log would hold.
func ForeignRecord(gen uint64) []byte { return testhook.ForeignRecord(gen) }

// Copy copies d's files to path (and its .wal and .wal.1) as kill -9
// would leave them at that moment: every group d has acknowledged is in
// the copy, and no group is half in it.
func Copy(d *store.DB, path string) error { return testhook.CopyFiles(d, path, nil) }

// Crash is the crash suite for a plugin's store: it opens a store with
// opts in a temporary directory, writes groups 0, 1, 2, … into it with
// write, one Update each, while checkpoints run back to back, takes
// copies of its files at copies random moments (Copy), and then opens
// each copy and calls check with a snapshot of it and the number of
// groups acknowledged before the copy. check returns an error unless the
// snapshot holds groups 0 to acked−1, and past them at most the group
// that was committing when the copy was taken, as a prefix. A copy that
// does not open, or a write or checkpoint that fails, fails the test.
func Crash(t *testing.T, opts store.Options, copies int, write func(tx *store.Tx, i int) error, check func(s *store.Snapshot, acked int) error) {
	t.Helper()
	dir := t.TempDir()
	d, err := store.Open(filepath.Join(dir, "store.db"), opts)
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
			if err := d.Update(func(tx *store.Tx) error { return write(tx, i) }); err != nil {
				errs <- fmt.Errorf("write group %d: %w", i, err)
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
				errs <- fmt.Errorf("checkpoint: %w", err)
				return
			}
		}
	})
	type crashCopy struct {
		path  string
		acked int
	}
	var taken []crashCopy
	rnd := rand.New(rand.NewPCG(uint64(copies), 1))
	for i := range copies {
		// A random moment of the workload, not a wait for a condition.
		time.Sleep(time.Duration(rnd.IntN(20)) * time.Millisecond)
		c := crashCopy{path: filepath.Join(dir, fmt.Sprintf("copy%d.db", i))}
		// No group commits while the copy is taken: the count read then
		// is what the copy must hold, or one more (committed, not yet
		// counted).
		if err := testhook.CopyFiles(d, c.path, func() { c.acked = int(acked.Load()) }); err != nil {
			t.Fatal(err)
		}
		taken = append(taken, c)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, c := range taken {
		cd, err := store.Open(c.path, opts)
		if err != nil {
			t.Fatalf("copy %d, taken after %d groups, does not open: %v", i, c.acked, err)
		}
		if err := cd.Scan(func(s *store.Snapshot) error { return check(s, c.acked) }); err != nil {
			t.Errorf("copy %d, taken after %d acknowledged groups: %v", i, c.acked, err)
		}
		if err := cd.Close(); err != nil {
			t.Error(err)
		}
	}
}
