package durable_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/store"
)

// *store.DB is a Store as it is.
var _ durable.Store = (*store.DB)(nil)

// benchPut is one small write: a key and a 32-byte value.
type benchPut struct{ key, value []byte }

func openBenchStore(b *testing.B) *store.DB {
	b.Helper()
	db, err := store.Open(filepath.Join(b.TempDir(), "bench.db"), store.Options{Buckets: []store.Bucket{{Name: "kv"}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	return db
}

// putAll writes puts as one group: one write-ahead log record and
// fdatasync.
func putAll(db *store.DB, puts []benchPut) error {
	return db.Update(func(tx *store.Tx) error {
		for _, p := range puts {
			if err := tx.Put(0, p.key, p.value); err != nil {
				return err
			}
		}
		return nil
	})
}

func benchPuts(prefix string, n int) []benchPut {
	puts := make([]benchPut, n)
	for i := range puts {
		puts[i] = benchPut{key: fmt.Appendf(nil, "%s-%08d", prefix, i), value: make([]byte, 32)}
	}
	return puts
}

// BenchmarkCommitter compares, in one run, the kit's throughput with the
// raw store's at the same batch size. Kit: 64 concurrent submitters, each
// submitting one small put and waiting for its result before the next,
// through a committer over an sdk/store DB (its checkpointer running).
// Raw: the same number of puts written by one goroutine in groups of the
// kit's mean group size (store.DB.Update, checkpointing when due), which
// is the most the store does at that group size: Update takes turns and
// holds its lock across the fdatasync. The two alternate, rounds times
// per iteration, so that a machine's slow moments fall on both. It
// reports both figures (puts/s), the mean group size and kit/raw, whose
// target is at least 0.7.
//
//	go test -run '^$' -bench '^BenchmarkCommitter$' -benchtime 1x ./sdk/durable
func BenchmarkCommitter(b *testing.B) {
	const rounds = 4
	var kitTime, rawTime time.Duration
	var puts, groups int64
	for i := range b.N {
		for r := range rounds {
			prefix := fmt.Sprintf("%d-%d", i, r)
			n, g, d := benchKit(b, prefix)
			kitTime += d
			batch := max(1, int((n+g/2)/max(g, 1)))
			rawTime += benchRaw(b, prefix, int(n), batch)
			puts += n
			groups += g
		}
	}
	kitRate := float64(puts) / kitTime.Seconds()
	rawRate := float64(puts) / rawTime.Seconds()
	b.ReportMetric(kitRate, "kit_puts/s")
	b.ReportMetric(rawRate, "raw_puts/s")
	b.ReportMetric(float64(puts)/float64(max(groups, 1)), "puts/group")
	b.ReportMetric(kitRate/rawRate, "kit/raw")
}

// benchKit has 64 submitters put 200 values each through a committer
// over a fresh store, and returns the puts, the groups and the time.
func benchKit(b *testing.B, prefix string) (puts, groups int64, took time.Duration) {
	const (
		submitters = 64
		each       = 200
	)
	db := openBenchStore(b)
	var nGroups atomic.Int64
	c, err := durable.New(durable.Options[benchPut, struct{}]{
		Store: db,
		Apply: func(_ context.Context, puts []benchPut) ([]struct{}, error) {
			nGroups.Add(1)
			if err := putAll(db, puts); err != nil {
				return nil, err
			}
			return make([]struct{}, len(puts)), nil
		},
		Committers:    2,
		QueueCapacity: 4 * submitters,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			b.Error(err)
		}
	}()
	var nPuts atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for s := range submitters {
		ps := benchPuts(fmt.Sprintf("kit-%s-%d", prefix, s), each)
		wg.Go(func() {
			done := make(chan error, 1)
			for _, p := range ps {
				if err := c.Submit(p, func(_ struct{}, err error) { done <- err }); err != nil {
					b.Errorf("Submit = %v", err)
					return
				}
				if err := <-done; err != nil {
					b.Errorf("put = %v", err)
					return
				}
				nPuts.Add(1)
			}
		})
	}
	wg.Wait()
	return nPuts.Load(), nGroups.Load(), time.Since(start)
}

// benchRaw writes n puts to a fresh store in groups of batch, one after
// another, checkpointing when due, and returns the time.
func benchRaw(b *testing.B, prefix string, n, batch int) time.Duration {
	db := openBenchStore(b)
	puts := benchPuts("raw-"+prefix, n)
	start := time.Now()
	for lo := 0; lo < n; lo += batch {
		if err := putAll(db, puts[lo:min(lo+batch, n)]); err != nil {
			b.Fatal(err)
		}
		if db.CheckpointDue() {
			if err := db.Checkpoint(); err != nil {
				b.Fatal(err)
			}
		}
	}
	return time.Since(start)
}
