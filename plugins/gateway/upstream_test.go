package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk"
)

// flaky is an upstream that answers 503 while failing is set, or for its
// first failFirst requests, and 200 otherwise; it counts every request.
type flaky struct {
	failing   atomic.Bool
	failFirst atomic.Int64
	hits      atomic.Int64
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := f.hits.Add(1)
	if f.failing.Load() || n <= f.failFirst.Load() {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprint(w, "ok")
}

// flakyConfig routes everything to url for the default tenant alone, so
// requests take the single-tenant bypass, without the scheduler.
func flakyConfig(url, extra string) string {
	return fmt.Sprintf(`
upstream "web" {
  url = %q
}
route "/" {
  upstream = "web"
}
default_tenant {
  rate_per_s = 1000
  burst      = 1000
}
%s`, url, extra)
}

func TestRetries(t *testing.T) {
	up := &flaky{}
	h := start(t, optionsFor(flakyConfig(newUpstreamServer(t, up), `retry {
  max_tries = 3
  backoff   = "10ms"
}`)))
	tests := []struct {
		method    string
		failFirst int64
		code      int
		hits      int64
	}{
		{"GET", 2, http.StatusOK, 3},                   // retried twice, then served
		{"PUT", 2, http.StatusOK, 3},                   // idempotent too
		{"GET", 5, http.StatusServiceUnavailable, 3},   // max_tries, then the last 503 as it is
		{"POST", 1, http.StatusServiceUnavailable, 1},  // never retried
		{"PATCH", 1, http.StatusServiceUnavailable, 1}, // nor this
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s failing %d", tt.method, tt.failFirst), func(t *testing.T) {
			up.hits.Store(0)
			up.failFirst.Store(tt.failFirst)
			rec := send(t, h, tt.method, "/x", nil, nil)
			if rec.Code != tt.code || up.hits.Load() != tt.hits {
				t.Errorf("%s = %d after %d upstream calls, want %d after %d", tt.method, rec.Code, up.hits.Load(), tt.code, tt.hits)
			}
		})
	}
	if got := metric(t, h, `backoff_retries_total{op="upstream"}`); got != 6 {
		t.Errorf(`backoff_retries_total{op="upstream"} = %v, want 6`, got)
	}
}

// TestRetrySendsTheSameRequest: every try of a retried GET carries the
// client's headers and the gateway's own, and a redirect from the
// upstream goes back to the client, not followed.
func TestRetrySendsTheSameRequest(t *testing.T) {
	var hits atomic.Int64
	var seen [3]http.Header
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		if n <= int64(len(seen)) {
			seen[n-1] = r.Header.Clone()
		}
		switch {
		case r.URL.Path == "/moved":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		case n < 3:
			http.Error(w, "down", http.StatusServiceUnavailable)
		default:
			fmt.Fprint(w, "ok")
		}
	})
	h := start(t, optionsFor(flakyConfig(newUpstreamServer(t, up), `retry {
  max_tries = 3
  backoff   = "10ms"
}`)))
	rec := send(t, h, "GET", "/x", http.Header{"X-Trace": {"t-1"}}, nil)
	if rec.Code != http.StatusOK || hits.Load() != 3 {
		t.Fatalf("GET = %d after %d calls, want 200 after 3", rec.Code, hits.Load())
	}
	for i, hdr := range seen {
		if hdr.Get("X-Trace") != "t-1" || hdr.Get("X-Gateway-Tenant") != defaultTenantName || hdr.Get("X-Forwarded-For") == "" {
			t.Errorf("try %d's header = %v, want X-Trace, X-Gateway-Tenant and X-Forwarded-For", i+1, hdr)
		}
	}
	rec = send(t, h, "GET", "/moved", nil, nil)
	if rec.Code != http.StatusFound || rec.Header().Get("Location") != "/elsewhere" || hits.Load() != 4 {
		t.Errorf("GET /moved = %d Location %q after %d calls, want 302 /elsewhere after 4", rec.Code, rec.Header().Get("Location"), hits.Load())
	}
}

// TestRetryStaysInDeadline: a retry whose backoff would end after the
// request's deadline is not made; the client gets the 503 at once.
func TestRetryStaysInDeadline(t *testing.T) {
	up := &flaky{}
	up.failing.Store(true)
	h := start(t, plugintestOptions(flakyConfig(newUpstreamServer(t, up), `retry {
  backoff = "8s"
  cap     = "8s"
}`), time.Second))
	begin := time.Now()
	rec := send(t, h, "GET", "/x", nil, nil)
	if rec.Code != http.StatusServiceUnavailable || up.hits.Load() != 1 {
		t.Errorf("GET = %d after %d calls, want 503 after 1: no backoff of 4-8s fits a 1s deadline", rec.Code, up.hits.Load())
	}
	if took := time.Since(begin); took > 900*time.Millisecond { // a backoff sleep would last to the 1s deadline
		t.Errorf("GET took %v, want the 503 at once", took)
	}
}

// TestBreaker opens the breaker with failures in a row, answers 503 at
// once without calling the upstream while it is open, reports degraded
// health, and closes again after the cool-down once a probe succeeds.
func TestBreaker(t *testing.T) {
	up := &flaky{}
	up.failing.Store(true)
	h := start(t, optionsFor(flakyConfig(newUpstreamServer(t, up), `breaker {
  failures  = 3
  cool_down = "300ms"
  probes    = 1
}`)))
	for i := range 3 {
		if rec := send(t, h, "POST", "/x", nil, nil); rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("POST %d to a failing upstream = %d, want its 503", i, rec.Code)
		}
	}
	rec := send(t, h, "POST", "/x", nil, nil)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"code":"upstream_unavailable"`) || up.hits.Load() != 3 {
		t.Fatalf("POST with the breaker open = %d %s after %d upstream calls, want 503 upstream_unavailable without a call", rec.Code, rec.Body, up.hits.Load())
	}
	if hl, err := h.Health(context.Background()); err != nil || hl.Status != sdk.StatusDegraded || !strings.Contains(hl.Reason, "web") {
		t.Errorf("Health with the breaker open = %+v, %v; want degraded naming upstream web", hl, err)
	}
	if got := metric(t, h, "gateway_degraded"); got != 1 {
		t.Errorf("gateway_degraded = %v, want 1", got)
	}
	up.failing.Store(false)
	time.Sleep(300 * time.Millisecond) // the cool-down itself: the breaker's rule, not a stand-in for a condition
	waitUntil(t, "a probe to close the breaker", func() bool {
		return send(t, h, "POST", "/x", nil, nil).Code == http.StatusOK
	})
	if hl, err := h.Health(context.Background()); err != nil || hl.Status != sdk.StatusReady {
		t.Errorf("Health after recovery = %+v, %v; want ready", hl, err)
	}
	if got := metric(t, h, "gateway_degraded"); got != 0 {
		t.Errorf("gateway_degraded after recovery = %v, want 0", got)
	}
}

// TestUpstreamDownIsQuick: an upstream nobody listens on gets 503 at
// once, not a hang.
func TestUpstreamDownIsQuick(t *testing.T) {
	// A deadline far beyond the bound, so that a hang cannot pass for
	// an answer; three tries with their backoff take about 150ms.
	h := start(t, plugintestOptions(flakyConfig("http://127.0.0.1:1", ""), 30*time.Second))
	begin := time.Now()
	rec := send(t, h, "GET", "/x", nil, nil)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"code":"upstream_unavailable"`) {
		t.Errorf("GET to a closed port = %d %s, want 503 upstream_unavailable", rec.Code, rec.Body)
	}
	if took := time.Since(begin); took > 5*time.Second {
		t.Errorf("GET to a closed port took %v against a 30s deadline; want the 503 at once", took)
	}
}

// TestUpstreamTimeout: an upstream slower than the request's deadline
// gets 504 upstream_timeout when the deadline passes, counted as a read
// timeout.
func TestUpstreamTimeout(t *testing.T) {
	up := newGate()
	defer close(up.open)
	h := start(t, plugintestOptions(flakyConfig(newUpstreamServer(t, up), ""), 300*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req := httptest.NewRequest("GET", "/x", nil).WithContext(ctx)
	rec := httptest.NewRecorder()
	begin := time.Now()
	h.ServeHTTP(rec, req)
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("GET to a stalled upstream took %v past a 300ms deadline", took)
	}
	waitUntil(t, "the read timeout counted", func() bool { return metric(t, h, `io_timeouts_total{op="read"}`) == 1 })
}

// TestUpstreamConnectionsReused checks that the gateway keeps as many
// idle upstream connections as it had calls in flight: rounds of more
// concurrent calls than workers, on the single-tenant bypass, dial only
// in the first round.
func TestUpstreamConnectionsReused(t *testing.T) {
	const concurrent, rounds = 32, 4
	var (
		dials   atomic.Int64
		arrived atomic.Int64
		mu      sync.Mutex
		open    chan struct{}
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		wait := open
		mu.Unlock()
		arrived.Add(1)
		<-wait // all of the round's calls are in flight at once
		fmt.Fprint(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	h := start(t, optionsFor(flakyConfig(srv.URL, "workers = 8")))
	for round := range rounds {
		mu.Lock()
		open = make(chan struct{})
		mu.Unlock()
		var wg sync.WaitGroup
		codes := make(chan int, concurrent)
		for range concurrent {
			wg.Go(func() { codes <- send(t, h, "GET", "/x", nil, nil).Code })
		}
		for deadline := time.Now().Add(10 * time.Second); arrived.Load() < int64(concurrent*(round+1)); {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d calls reached the upstream, want %d", round, arrived.Load()-int64(concurrent*round), concurrent)
			}
			time.Sleep(time.Millisecond)
		}
		mu.Lock()
		close(open)
		mu.Unlock()
		wg.Wait()
		close(codes)
		for code := range codes {
			if code != http.StatusOK {
				t.Fatalf("round %d: a call answered %d, want 200", round, code)
			}
		}
	}
	if got := dials.Load(); got > concurrent {
		t.Errorf("%d rounds of %d concurrent calls opened %d upstream connections, want at most %d", rounds, concurrent, got, concurrent)
	}
}

// TestDropHopByHop: the hop-by-hop headers, those Connection names, and
// their lookalikes with underscores go; the end-to-end ones stay.
func TestDropHopByHop(t *testing.T) {
	h := http.Header{"Connection": {"X-Hop, keep-alive"}, "X-Hop": {"1"}, "Keep-Alive": {"timeout=5"}, "Te": {"trailers"},
		"Proxy-Authorization": {"Basic eA=="}, "Transfer-Encoding": {"chunked"}, "Upgrade": {"h2c"}, "X-Api-Key": {"k"}, "X-End": {"2"},
		"X_api_key": {"k"}, "x_API-key": {"k"}, "Transfer_encoding": {"chunked"}, "X_end": {"3"}}
	dropHopByHop(h)
	if want := (http.Header{"X-End": {"2"}, "X_end": {"3"}}); !reflect.DeepEqual(h, want) {
		t.Errorf("dropHopByHop left %v, want %v", h, want)
	}
}
