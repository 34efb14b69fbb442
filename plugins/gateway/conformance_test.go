package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

// TestConformance runs the SDK's conformance kit on the built binary, with
// two tenants (so requests go through the scheduler and its workers) in
// front of a loopback upstream whose /slow answers after ms milliseconds:
// the in-flight request of the drain check.
func TestConformance(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(slowUpstream))
	t.Cleanup(up.Close)
	plugintest.Conformance(t, plugintest.Build(t, "."), fmt.Sprintf(`
upstream "slow" {
  url = %q
}
route "/" {
  upstream = "slow"
}
tenant "acme" {
  api_key_sha256 = %q
}
default_tenant {
  rate_per_s = 1000
  burst      = 1000
}
`, up.URL, sumHex("acme-key")),
		plugintest.InFlight("GET /slow?ms=300"))
}

// slowUpstream answers 200 after the query's ms milliseconds, or at once.
func slowUpstream(w http.ResponseWriter, r *http.Request) {
	ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
	select {
	case <-time.After(time.Duration(ms) * time.Millisecond):
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"slept_ms":%d}`, ms)
	case <-r.Context().Done():
	}
}
