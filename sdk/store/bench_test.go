package store

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"
)

// benchPending is how many writes wait for a checkpoint in
// BenchmarkAscendFirst.
const benchPending = 4000

// BenchmarkAscendFirst reads the first key of a bucket of 4,000 keys
// through View and Ascend, with all of them written into the bbolt file
// (nothing pending) and with all of them waiting in the overlay for a
// checkpoint (pending). Its ns/op is one read of each; it reports each
// case's ns per read and their ratio, pending/empty, from the same run:
// pending writes must cost a seek, not a sort (at most 2×).
func BenchmarkAscendFirst(b *testing.B) {
	opts := Options{Buckets: []Bucket{{Name: "kv"}}, CheckpointInterval: time.Hour, CheckpointBytes: 1 << 30}
	open := func(checkpoint bool) *DB {
		d, err := Open(filepath.Join(b.TempDir(), "s.db"), opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = d.Close() })
		// Random order, in groups of 100, as a plugin's requests come.
		r := rand.New(rand.NewPCG(1, 2))
		keys := r.Perm(benchPending)
		for i := 0; i < len(keys); i += 100 {
			err := d.Update(func(tx *Tx) error {
				for _, k := range keys[i : i+100] {
					if err := tx.Put(0, fmt.Appendf(nil, "key%06d", k), []byte("value")); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		if checkpoint {
			if err := d.Checkpoint(); err != nil {
				b.Fatal(err)
			}
			if d.Pending() {
				b.Fatal("writes still pending after a checkpoint")
			}
		}
		return d
	}
	empty, pending := open(true), open(false)
	first := func(d *DB) {
		var got []byte
		err := d.View(func(s *Snapshot) error {
			s.Ascend(0, nil, nil, func(k, _ []byte) bool {
				got = k
				return false
			})
			return nil
		})
		if err != nil || string(got) != "key000000" {
			b.Fatalf("first key = %q, %v; want key000000", got, err)
		}
	}
	// The two are read in turn, each timed, so that a change of the
	// machine's load meanwhile weighs on both alike.
	first(empty)
	first(pending)
	var inEmpty, inPending time.Duration
	n := 0
	for b.Loop() {
		t0 := time.Now()
		first(pending)
		t1 := time.Now()
		first(empty)
		inPending += t1.Sub(t0)
		inEmpty += time.Since(t1)
		n++
	}
	perPending := float64(inPending.Nanoseconds()) / float64(n)
	perEmpty := float64(inEmpty.Nanoseconds()) / float64(n)
	b.ReportMetric(perEmpty, "ns/empty")
	b.ReportMetric(perPending, "ns/pending")
	b.ReportMetric(perPending/perEmpty, "pending/empty")
}
