package store

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// model is what a store should hold: each bucket's keys and values.
type model []map[string]string

func (m model) clone() model {
	c := make(model, len(m))
	for i, b := range m {
		c[i] = maps.Clone(b)
	}
	return c
}

// kvs returns bucket b's pairs in [from, to) (nil bounds are open), in
// order, or in reverse order when desc is set.
func (m model) kvs(b int, from, to []byte, desc bool) [][2]string {
	var out [][2]string
	for _, k := range slices.Sorted(maps.Keys(m[b])) {
		if from != nil && k < string(from) || to != nil && k >= string(to) {
			continue
		}
		out = append(out, [2]string{k, m[b][k]})
	}
	if desc {
		slices.Reverse(out)
	}
	return out
}

// readKVs reads bucket b's pairs in [from, to) through r, stopping after
// limit pairs (0: no limit).
func readKVs(r Reader, b int, from, to []byte, desc bool, limit int) [][2]string {
	var out [][2]string
	fn := func(k, v []byte) bool {
		out = append(out, [2]string{string(k), string(v)})
		return limit == 0 || len(out) < limit
	}
	if desc {
		r.Descend(b, from, to, fn)
	} else {
		r.Ascend(b, from, to, fn)
	}
	return out
}

// modelKey is one of a small set of keys, so that writes hit the same
// keys again, in the file, in a frozen overlay and in the newest one.
func modelKey(r *rand.Rand) []byte { return fmt.Appendf(nil, "k%03d", r.IntN(200)) }

// bound is a random range bound: nil (open) one time in four.
func bound(r *rand.Rand) []byte {
	if r.IntN(4) == 0 {
		return nil
	}
	return modelKey(r)
}

// compareReader checks r against m with random lookups and ranges.
func compareReader(t *testing.T, what string, r Reader, m model, rnd *rand.Rand) {
	t.Helper()
	for b := range m {
		for range 4 {
			k := modelKey(rnd)
			want, ok := m[b][string(k)]
			got := r.Get(b, k)
			if ok != (got != nil) || ok && string(got) != want {
				t.Fatalf("%s: Get(%d, %q) = %q, want %q (present %t)", what, b, k, got, want, ok)
			}
		}
		for _, desc := range []bool{false, true} {
			from, to := bound(rnd), bound(rnd)
			limit := rnd.IntN(3) * 5 // 0 (all), 5 or 10
			want := m.kvs(b, from, to, desc)
			if limit > 0 && len(want) > limit {
				want = want[:limit]
			}
			got := readKVs(r, b, from, to, desc, limit)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("%s: bucket %d [%q, %q) descending %t limit %d (-want +got):\n%s", what, b, from, to, desc, limit, diff)
			}
		}
	}
}

// TestModel runs random groups of Put, Delete and DeleteRange against a
// store, with checkpoints running all the while, and after each group
// compares Get, Ascend and Descend with random bounds, through Tx, View
// and Scan, against a map holding what the groups committed. Readers in
// other goroutines meanwhile check that each snapshot they take is in
// order both ways, and Scrub drops the map's pages from under them
// (dropMapped) while checkpoints grow the file past a small map and
// remap it. A group that fails leaves nothing; NextSeq counts across
// groups, checkpoints and a reopen.
func TestModel(t *testing.T) {
	opts := Options{Buckets: []Bucket{{Name: "a"}, {Name: "b", Sequential: true}, {Name: "c"}}, CheckpointInterval: time.Hour,
		Hooks: &Hooks{MmapSize: 32 << 10}}
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	m := make(model, len(opts.Buckets))
	for i := range m {
		m[i] = map[string]string{}
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var checkpoints, snapshots, scrubs atomic.Int64
	errs := make(chan error, 4)
	wg.Go(func() {
		pace := time.NewTicker(100 * time.Microsecond) // pacing, not a wait for a condition
		defer pace.Stop()
		for {
			select {
			case <-stop:
				return
			case <-pace.C:
			}
			if _, err := d.Scrub(16); err != nil {
				errs <- fmt.Errorf("Scrub: %w", err)
				return
			}
			scrubs.Add(1)
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if !d.Pending() {
				time.Sleep(100 * time.Microsecond) // pacing, not a wait for a condition
				continue
			}
			if err := d.Checkpoint(); err != nil {
				errs <- fmt.Errorf("Checkpoint: %w", err)
				return
			}
			checkpoints.Add(1)
		}
	})
	for g := range 2 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 99))
			for {
				select {
				case <-stop:
					return
				default:
				}
				b := rnd.IntN(len(opts.Buckets))
				err := d.Scan(func(s *Snapshot) error {
					up := readKVs(s, b, nil, nil, false, 0)
					down := readKVs(s, b, nil, nil, true, 0)
					slices.Reverse(down)
					if !slices.IsSortedFunc(up, func(x, y [2]string) int { return cmp3(x[0], y[0]) }) || !slices.Equal(up, down) {
						return fmt.Errorf("bucket %d: Ascend %d keys, Descend %d keys, not one order", b, len(up), len(down))
					}
					return nil
				})
				if err != nil {
					errs <- fmt.Errorf("Scan: %w", err)
					return
				}
				snapshots.Add(1)
			}
		})
	}
	rnd := rand.New(rand.NewPCG(7, 7))
	var seq uint64
	errAbort := errors.New("abort")
	for i := range 400 {
		next := m.clone()
		abort := rnd.IntN(10) == 0
		var seqs []uint64
		err := d.Update(func(tx *Tx) error {
			writes := 1 + rnd.IntN(12)
			if rnd.IntN(8) == 0 {
				// Past scanWrites: the group's reads index its writes.
				writes = scanWrites + rnd.IntN(2*scanWrites)
			}
			for range writes {
				b := rnd.IntN(len(opts.Buckets))
				if rnd.IntN(8) == 0 {
					// A read between writes, which sees every one before it.
					k := modelKey(rnd)
					want, ok := next[b][string(k)]
					if got := tx.Get(b, k); ok != (got != nil) || ok && string(got) != want {
						t.Fatalf("group %d: Tx.Get(%d, %q) = %q, want %q (present %t)", i, b, k, got, want, ok)
					}
				}
				switch k := modelKey(rnd); rnd.IntN(10) {
				case 0, 1:
					if err := tx.Delete(b, k); err != nil {
						return err
					}
					delete(next[b], string(k))
				case 2:
					from, to := bound(rnd), bound(rnd)
					if err := tx.DeleteRange(b, from, to); err != nil {
						return err
					}
					for _, kv := range next.kvs(b, from, to, false) {
						delete(next[b], kv[0])
					}
				default:
					v := fmt.Appendf(nil, "v%d-%s", i, k)
					if err := tx.Put(b, k, v); err != nil {
						return err
					}
					v[0] = 'X' // Put copied it
					next[b][string(k)] = fmt.Sprintf("v%d-%s", i, k)
				}
			}
			if rnd.IntN(3) == 0 {
				seqs = append(seqs, tx.NextSeq(), tx.NextSeq())
			}
			compareReader(t, fmt.Sprintf("group %d, Tx", i), tx, next, rnd)
			if abort {
				return errAbort
			}
			return nil
		})
		if abort {
			if !errors.Is(err, errAbort) {
				t.Fatalf("group %d: Update = %v, want its fn's error", i, err)
			}
		} else if err != nil {
			t.Fatalf("group %d: %v", i, err)
		} else {
			m = next
			for _, s := range seqs {
				if seq++; s != seq {
					t.Fatalf("group %d: NextSeq = %d, want %d", i, s, seq)
				}
			}
		}
		if err := d.View(func(s *Snapshot) error {
			compareReader(t, fmt.Sprintf("after group %d, View", i), s, m, rnd)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := d.Scan(func(s *Snapshot) error {
			compareReader(t, fmt.Sprintf("after group %d, Scan", i), s, m, rnd)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d checkpoints, %d concurrent snapshots and %d scrubs ran alongside the groups", checkpoints.Load(), snapshots.Load(), scrubs.Load())
	if checkpoints.Load() == 0 || snapshots.Load() == 0 || scrubs.Load() == 0 {
		t.Errorf("%d checkpoints, %d snapshots, %d scrubs: want all to run during the groups", checkpoints.Load(), snapshots.Load(), scrubs.Load())
	}
	// Half the writes in the log, half in the file: a reopen replays the
	// log, and the counter goes on from where it was.
	if err := d.Update(func(tx *Tx) error { return tx.Put(0, []byte("k000"), []byte("last")) }); err != nil {
		t.Fatal(err)
	}
	m[0]["k000"] = "last"
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if d, err = Open(path, opts); err != nil {
		t.Fatal(err)
	}
	if err := d.View(func(s *Snapshot) error { compareReader(t, "after reopen", s, m, rnd); return nil }); err != nil {
		t.Fatal(err)
	}
	var got uint64
	if err := d.Update(func(tx *Tx) error { got = tx.NextSeq(); return nil }); err != nil {
		t.Fatal(err)
	}
	if got != seq+1 {
		t.Errorf("NextSeq after reopen = %d, want %d", got, seq+1)
	}
}

func cmp3(a, b string) int { return bytes.Compare([]byte(a), []byte(b)) }
