package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/store"
)

// targetProofP99 is the bound on an inclusion proof's p99 for a
// log of a million entries.
const targetProofP99 = 2 * time.Millisecond

// BenchmarkInclusionProof builds a log of PLUGHOST_BENCH_REGISTRY_LOG
// entries (default 1,000,000) straight into a store, starts the registry
// on it in-process, and asks for inclusion proofs of random versions in
// the whole tree, one at a time, while the deep verifier walks the log:
// it reports the p99 and the median of the proof's answer through the
// SDK's handler. It runs once whatever b.N is.
func BenchmarkInclusionProof(b *testing.B) {
	n := uint64(1_000_000)
	if s := os.Getenv("PLUGHOST_BENCH_REGISTRY_LOG"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil || v == 0 {
			b.Fatalf("PLUGHOST_BENCH_REGISTRY_LOG=%q: want a count of entries", s)
		}
		n = v
	}
	dir := b.TempDir()
	t0 := time.Now()
	fillLog(b, filepath.Join(dir, storeFile), n)
	b.Logf("built a log of %d entries in %v", n, time.Since(t0).Round(time.Millisecond))

	h := plugintest.New(b, definition(), plugintest.Options{Config: approvers(), DataDir: dir,
		Limits: sdk.Limits{MaxBodyBytes: maxBodyBytes, RequestTimeout: 10 * time.Second}})
	b.Cleanup(func() { _, _, _ = h.Drain(context.Background(), time.Now().Add(10*time.Second)) })

	const asks = 5000
	lat := make([]time.Duration, 0, asks)
	b.ResetTimer()
	for i := range asks {
		v := uint64(i)*7919%n + 1 // spread over the whole tree, the same each run
		req := httptest.NewRequest("GET", fmt.Sprintf("/v1/proof/inclusion?version=%d&size=%d", v, n), nil)
		rec := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(rec, req)
		lat = append(lat, time.Since(start))
		if rec.Code != http.StatusOK {
			b.Fatalf("inclusion proof of %d in %d: %d %s", v, n, rec.Code, rec.Body)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	b.ReportMetric(float64(p99)/float64(time.Microsecond), "p99-µs")
	b.ReportMetric(float64(p50)/float64(time.Microsecond), "p50-µs")
	verdict := "met"
	if p99 > targetProofP99 {
		verdict = "MISSED"
	}
	b.Logf("inclusion proofs in a log of %d entries, in-process: p50 %v, p99 %v (target ≤ %v: %s)",
		n, p50, p99, targetProofP99, verdict)
}

// fillLog writes a log of n committed entries into the store at path, in
// groups of 10,000, as the committer would have: each entry chained to
// the one before it, its leaf and interior hashes in the tree, and HEAD.
func fillLog(tb testing.TB, path string, n uint64) {
	tb.Helper()
	db, err := store.Open(path, storeOpts)
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	var h head
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).Format(time.RFC3339)
	sig := sign(tb, "a", hex.EncodeToString(make([]byte, 32)))
	for h.Version < n {
		err := db.Update(func(tx *store.Tx) error {
			for range min(10_000, n-h.Version) {
				e := entry{
					Version:     h.Version + 1,
					PrevHash:    hex.EncodeToString(h.Hash[:]),
					Artifact:    []byte(fmt.Sprintf(`{"n":%d}`, h.Version+1)),
					Approvals:   []approval{{Approver: "a", Signature: sig}, {Approver: "b", Signature: sig}},
					CommittedAt: at,
				}
				hash := entryHash(h.Hash, e)
				e.Hash = hex.EncodeToString(hash[:])
				if err := appendEntry(tx, e, hash); err != nil {
					return err
				}
				h = head{Version: e.Version, Hash: hash}
			}
			return tx.Put(bucketMeta, keyHead, h.encode())
		})
		if err != nil {
			tb.Fatalf("fill to %d: %v", h.Version, err)
		}
		if db.CheckpointDue() {
			if err := db.Checkpoint(); err != nil {
				tb.Fatal(err)
			}
		}
	}
}
