package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkServe sends GETs of the default tenant through the in-process
// harness (the real data plane) and the gateway's scheduler to a loopback
// upstream, for profiling the gateway's own path: go test -bench Serve
// -cpuprofile cpu.out.
func BenchmarkServe(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))
	b.Cleanup(up.Close)
	cfg := strings.NewReplacer("rate_per_s = 1000", "rate_per_s = 1000000", "burst      = 1000", "burst      = 1000000").Replace(twoTenants(up.URL, ""))
	h := start(b, optionsFor(cfg))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest("GET", "/x", nil)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Errorf("GET = %d %s", rec.Code, rec.Body)
				return
			}
		}
	})
}
