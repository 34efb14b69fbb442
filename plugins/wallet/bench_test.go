package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

// BenchmarkTransfers measures durable transfers per second through the
// SDK's gRPC path (in-process, without the host's ingress): 64 clients,
// each moving money between its own pair of accounts, so no two clients
// race for a nonce. It reports transfers/s, p50/p99 latency and the mean
// group size; every answer is a receipt on disk.
//
//	go test -run '^$' -bench BenchmarkTransfers -benchtime 20000x ./plugins/wallet
func BenchmarkTransfers(b *testing.B) {
	const clients = 64
	w := &wallet{}
	h := plugintest.New(b, newDefinition(w), plugintest.Options{Config: `queue_capacity = 4096`})
	// b.Context is already cancelled when cleanups run.
	b.Cleanup(func() { _, _, _ = h.Drain(context.Background(), time.Now().Add(10*time.Second)) })
	post := func(path, key, body string) int {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for c := range clients {
		if code := post("/v1/issue", fmt.Sprintf("fund-%d", c), fmt.Sprintf(`{"to":"src-%d","amount":1000000000}`, c)); code != 200 {
			b.Fatalf("fund client %d: %d", c, code)
		}
	}
	metric := func(name string) float64 {
		text, err := h.Metrics(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(text, "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				var f float64
				fmt.Sscan(v, &f)
				return f
			}
		}
		return 0
	}
	groups0, ops0 := metric("wallet_commit_batch_size_count"), metric("wallet_commit_batch_size_sum")
	secs0 := metric("wallet_commit_seconds_sum")

	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			var mine []time.Duration
			for nonce := 1; next.Add(1) <= int64(b.N); nonce++ {
				t0 := time.Now()
				code := post("/v1/transfer", fmt.Sprintf("c%d-%d", c, nonce),
					fmt.Sprintf(`{"from":"src-%d","to":"dst-%d","amount":1,"nonce":%d}`, c, c, nonce))
				if code != 200 {
					b.Errorf("transfer: %d", code)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) == 0 {
		return
	}
	groups, ops := metric("wallet_commit_batch_size_count")-groups0, metric("wallet_commit_batch_size_sum")-ops0
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "transfers/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	if groups > 0 {
		b.ReportMetric(ops/groups, "ops/group")
		b.ReportMetric((metric("wallet_commit_seconds_sum")-secs0)/groups*1000, "ms/commit")
	}
}
