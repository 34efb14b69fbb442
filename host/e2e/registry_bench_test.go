package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// targetRegistryPerSec is the target: committed entries per
// second, each a proposal and a quorum of two approvals.
const targetRegistryPerSec = 3000

// BenchmarkRegistry commits a fixed count of entries
// (PLUGHOST_BENCH_REGISTRY_ENTRIES, default 30000) through the host from
// 32 clients. Each client proposes 16 artifacts in one batch call, then
// sends the approvals of a and b for them in one batch call (the quorum
// is 2), and sends again, for the entries not yet committed, what was
// refused (429) or not answered. It reports committed entries/s from the
// first proposal to the last commit, the p99 of an entry's commit
// latency (its proposal's call to the answer that says it is
// committed), the p99 of an inclusion proof in the log it made, and the
// machine's steal. It runs once whatever b.N is.
func BenchmarkRegistry(b *testing.B) {
	const clients, batch = 32, 16
	total := envInt(b, "PLUGHOST_BENCH_REGISTRY_ENTRIES", 30000, 10_000_000)
	dir := b.TempDir()
	h := startBenchHost(b, benchBase(dir)+regConfig())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}, Timeout: 30 * time.Second}
	post := func(path string, body any) (int, []byte, error) {
		bs, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		resp, err := client.Post(h.ingress+"/registry"+path, "application/json", bytes.NewReader(bs))
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		return resp.StatusCode, out, err
	}
	// The whole run's deadline: a client that cannot get its entries
	// committed by then fails the benchmark rather than retrying for ever.
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
	defer cancel()

	type result struct {
		Status     int    `json:"status"`
		ProposalID string `json:"proposal_id"`
		Digest     string `json:"digest"`
		Committed  bool   `json:"committed"`
		Version    uint64 `json:"version"`
	}
	type results struct {
		Results []result `json:"results"`
	}
	type pending struct {
		artifact json.RawMessage
		id       string
		sigs     [2]string // a's and b's, once proposed
		start    time.Time
	}
	var (
		committed, refused atomic.Int64
		latMu              sync.Mutex
		lats               []time.Duration
		maxVersion         atomic.Uint64
		wg                 sync.WaitGroup
	)
	m0, machineOK := machineCPU()
	start := time.Now()
	b.ResetTimer()
	for cl := range clients {
		share := total / clients
		if cl < total%clients {
			share++
		}
		wg.Go(func() {
			var mine []time.Duration
			defer func() {
				latMu.Lock()
				lats = append(lats, mine...)
				latMu.Unlock()
			}()
			next := 0 // artifacts made
			var open []*pending
			for done := 0; done < share; {
				if ctx.Err() != nil {
					b.Errorf("client %d: %d of %d entries committed when the run's deadline passed", cl, done, share)
					return
				}
				// Propose up to a batch of new artifacts and those whose
				// proposal was refused.
				var toPropose []*pending
				for _, p := range open {
					if p.id == "" {
						toPropose = append(toPropose, p)
					}
				}
				for len(open) < batch && next < share {
					p := &pending{artifact: json.RawMessage(fmt.Sprintf(`{"c":%d,"n":%d}`, cl, next)), start: time.Now()}
					next++
					open = append(open, p)
					toPropose = append(toPropose, p)
				}
				if len(toPropose) > 0 {
					arts := make([]map[string]json.RawMessage, len(toPropose))
					for i, p := range toPropose {
						arts[i] = map[string]json.RawMessage{"artifact": p.artifact}
					}
					var rs results
					code, body, err := post("/v1/proposals/batch", map[string]any{"proposals": arts})
					if err != nil || code != http.StatusOK || json.Unmarshal(body, &rs) != nil || len(rs.Results) != len(toPropose) {
						refused.Add(1)
						time.Sleep(time.Millisecond) // a refused call: back off, then the same batch again
						continue
					}
					for i, r := range rs.Results {
						if r.Status != http.StatusAccepted {
							refused.Add(1)
							continue
						}
						d, err := hex.DecodeString(r.Digest)
						if err != nil {
							b.Errorf("digest %q: %v", r.Digest, err)
							return
						}
						p := toPropose[i]
						p.id = r.ProposalID
						for j, name := range []string{"a", "b"} {
							p.sigs[j] = base64.StdEncoding.EncodeToString(ed25519.Sign(regKey(name), d))
						}
					}
				}
				// Approve every proposed entry not yet committed: a
				// repeated approval changes nothing.
				var toApprove []*pending
				var approvals []map[string]string
				for _, p := range open {
					if p.id == "" {
						continue
					}
					toApprove = append(toApprove, p)
					for j, name := range []string{"a", "b"} {
						approvals = append(approvals, map[string]string{"proposal_id": p.id, "approver": name, "signature": p.sigs[j]})
					}
				}
				if len(toApprove) == 0 {
					continue
				}
				var rs results
				code, body, err := post("/v1/approvals/batch", map[string]any{"approvals": approvals})
				if err != nil || code != http.StatusOK || json.Unmarshal(body, &rs) != nil || len(rs.Results) != len(approvals) {
					refused.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				now := time.Now()
				kept := open[:0]
				for _, p := range open {
					i := slices.Index(toApprove, p)
					if i >= 0 && slices.ContainsFunc(rs.Results[2*i:2*i+2], func(r result) bool { return r.Committed }) {
						mine = append(mine, now.Sub(p.start))
						done++
						committed.Add(1)
						for _, r := range rs.Results[2*i : 2*i+2] {
							for v := maxVersion.Load(); r.Version > v && !maxVersion.CompareAndSwap(v, r.Version); v = maxVersion.Load() {
							}
						}
						continue
					}
					if i >= 0 {
						refused.Add(1)
					}
					kept = append(kept, p)
				}
				open = kept
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	machine := machineLine(m0, machineOK)
	if b.Failed() {
		return
	}
	if n := committed.Load(); n != int64(total) || maxVersion.Load() != uint64(total) {
		b.Fatalf("%d entries committed, highest version %d; want %d of each", n, maxVersion.Load(), total)
	}
	slices.Sort(lats)
	p99 := lats[len(lats)*99/100]
	rate := float64(total) / elapsed.Seconds()

	// Inclusion proofs of spread versions in the whole log, one at a time.
	size := uint64(total)
	var proofs []time.Duration
	for i := range 2000 {
		v := uint64(i)*7919%size + 1
		t0 := time.Now()
		resp, err := client.Get(fmt.Sprintf("%s/registry/v1/proof/inclusion?version=%d&size=%d", h.ingress, v, size))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("inclusion proof of %d in %d: %d", v, size, resp.StatusCode)
		}
		proofs = append(proofs, time.Since(t0))
	}
	slices.Sort(proofs)
	proofP99 := proofs[len(proofs)*99/100]

	b.ReportMetric(rate, "entries/s")
	b.ReportMetric(micros(p99), "commit-p99-µs")
	b.ReportMetric(micros(proofP99), "proof-p99-µs")
	b.Logf("\n%d entries, each proposed and approved by two of three approvers, by %d clients in batches of %d, durable, through plughost\n"+
		"%-26s %14.0f %12s %s\n%-26s %14v\n%-26s %14v (a log of %d entries)\n%-26s %14d\n%s",
		total, clients, batch,
		"committed entries/s", rate, fmt.Sprintf("≥ %d", targetRegistryPerSec), verdict(rate >= targetRegistryPerSec),
		"commit p99", roundDur(p99), "inclusion proof p99", roundDur(proofP99), size,
		"refused or not committed", refused.Load(), machine)
}
