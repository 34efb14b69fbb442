package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plughost/plughost/plugins/gateway/internal/shed"
	"github.com/plughost/plughost/sdk"
)

// gate is an upstream that holds every request until it is opened (or
// the request's context ends), and counts those it holds.
type gate struct {
	open    chan struct{}
	waiting atomic.Int64
	served  atomic.Int64
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.waiting.Add(1)
	select {
	case <-g.open:
		g.served.Add(1)
		fmt.Fprint(w, "ok")
	case <-r.Context().Done():
	}
}

// metric returns the value of one series of the harness's exposition.
func metric(t *testing.T, h interface {
	Metrics(context.Context) (string, error)
}, series string) float64 {
	t.Helper()
	m, err := h.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(m))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no series %s in:\n%s", series, m)
	return 0
}

// waitUntil polls cond every 10ms for up to 10s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// queued is a request sent in the background; its answer arrives on done.
type queued struct {
	done chan *httptest.ResponseRecorder
}

func sendAsync(t *testing.T, h http.Handler, key string, wg *sync.WaitGroup) queued {
	return sendAsyncMethod(t, h, "GET", key, wg)
}

func sendAsyncMethod(t *testing.T, h http.Handler, method, key string, wg *sync.WaitGroup) queued {
	q := queued{done: make(chan *httptest.ResponseRecorder, 1)}
	hdr := http.Header{}
	if key != "" {
		hdr.Set("X-Api-Key", key)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		req := httptest.NewRequest(method, "/x", nil).WithContext(context.Background())
		req.Header = hdr
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		q.done <- rec
	}()
	return q
}

func (q queued) code(t *testing.T) (int, string) {
	t.Helper()
	select {
	case rec := <-q.done:
		return rec.Code, rec.Body.String()
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s")
		return 0, ""
	}
}

// TestQueuePolicies fills the queues behind one worker held by the
// upstream, with a scheduler queue of one dispatched ahead of it: acme
// over its max_queue, counting its dispatched request and its queued one,
// gets 429 while the default tenant is still queued; the default tenant,
// with nothing dispatched, displaces the oldest dispatched request (503
// dropped); a full intake, counting the dispatched request, gets 429 for
// anyone. Once the upstream answers, the rest are served.
func TestQueuePolicies(t *testing.T) {
	up := newGate()
	h := start(t, optionsFor(fmt.Sprintf(`
workers     = 1
work_queue  = 3
sched_queue = 1
shedding    = false
# The default tenant's request must meet the full scheduler queue,
# not start on a reserved worker.
reserved_workers = 0
upstream "web" {
  url = %q
}
route "/" {
  upstream = "web"
}
tenant "acme" {
  api_key_sha256 = %q
  max_queue      = 2
}
default_tenant {
  rate_per_s = 1000
  burst      = 1000
  max_queue  = 5
}`, newUpstreamServer(t, up), sumHex("acme-key"))))
	var wg sync.WaitGroup
	defer wg.Wait()
	depth := func(q string) float64 { return metric(t, h, `queue_depth{queue="`+q+`"}`) }

	a1 := sendAsync(t, h, "acme-key", &wg)
	waitUntil(t, "the worker to hold acme's first request", func() bool { return up.waiting.Load() == 1 })
	a2 := sendAsync(t, h, "acme-key", &wg)
	waitUntil(t, "acme's second request dispatched", func() bool { return depth("sched") == 1 })
	a3 := sendAsync(t, h, "acme-key", &wg)
	waitUntil(t, "acme's third request queued", func() bool { return depth("intake") == 1 })
	if rec := send(t, h, "GET", "/x", http.Header{"X-Api-Key": {"acme-key"}}, nil); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"code":"busy"`) {
		t.Fatalf("acme over its max_queue = %d %s, want 429 busy", rec.Code, rec.Body)
	}
	d1 := sendAsync(t, h, "", &wg)
	if code, body := a2.code(t); code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"dropped"`) {
		t.Fatalf("acme's dispatched request after the default tenant arrived = %d %s, want 503 dropped", code, body)
	}
	d2 := sendAsync(t, h, "", &wg)
	waitUntil(t, "the intake full", func() bool { return depth("intake") == 2 && depth("sched") == 1 })
	if rec := send(t, h, "GET", "/x", nil, nil); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"code":"busy"`) {
		t.Fatalf("the default tenant with the intake full = %d %s, want 429 busy", rec.Code, rec.Body)
	}
	close(up.open)
	for name, q := range map[string]queued{"a1": a1, "a3": a3, "d1": d1, "d2": d2} {
		if code, body := q.code(t); code != http.StatusOK {
			t.Errorf("%s = %d %s, want 200 once the upstream answers", name, code, body)
		}
	}
	for series, want := range map[string]float64{
		`queue_dropped_total{queue="sched"}`:                             1,
		`busy_rejections_total{endpoint="tenant"}`:                       1,
		`busy_rejections_total{endpoint="intake"}`:                       1,
		`gateway_tenant_requests_total{outcome="dropped",tenant="acme"}`: 1,
		`gateway_tenant_requests_total{outcome="served",tenant="acme"}`:  2,
		`tasks_spawned_total{kind="worker"}`:                             1,
	} {
		if got := metric(t, h, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// TestDrainAbortsAtDeadline drains with one request on the worker, whose
// upstream never answers, and one queued: the queued one gets 503 at
// once, the running one 503 before the drain deadline, and it is counted
// in tasks_aborted_total.
func TestDrainAbortsAtDeadline(t *testing.T) {
	up := newGate()
	h := start(t, optionsFor(twoTenants(newUpstreamServer(t, up), "workers = 1\nsched_queue = 1")))
	var wg sync.WaitGroup
	defer wg.Wait()
	running := sendAsync(t, h, "acme-key", &wg)
	waitUntil(t, "the worker to hold the first request", func() bool { return up.waiting.Load() == 1 })
	waiting := sendAsync(t, h, "acme-key", &wg)
	waitUntil(t, "the second request dispatched", func() bool { return metric(t, h, `queue_depth{queue="sched"}`) == 1 })

	start := time.Now()
	deadline := start.Add(time.Second)
	completed, abandoned, err := h.Drain(context.Background(), deadline)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := waiting.code(t); code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"draining"`) {
		t.Errorf("the queued request = %d %s, want 503 draining", code, body)
	}
	if code, body := running.code(t); code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"draining"`) {
		t.Errorf("the running request = %d %s, want 503 draining", code, body)
	}
	if abandoned != 0 || completed != 2 {
		t.Errorf("Drain completed %d and abandoned %d requests, want 2 and 0: the gateway answers them before the deadline", completed, abandoned)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Drain took %v past a 1s deadline", took)
	}
	if got := metric(t, h, `tasks_aborted_total{kind="worker"}`); got != 1 {
		t.Errorf(`tasks_aborted_total{kind="worker"} = %v, want 1`, got)
	}
	if got := metric(t, h, `tasks_canceled_total{kind="queued"}`); got != 1 {
		t.Errorf(`tasks_canceled_total{kind="queued"} = %v, want 1`, got)
	}
	close(up.open)
}

// TestShedding fills the tenant queues behind a held upstream, with
// nothing dispatched ahead of the worker (sched_queue 0), and watches the
// grades: at half the intake a write of the tenant over its share is shed
// while another tenant's write is queued; at three quarters every write;
// at 90% reads too, but an exempt route is still served. Health says
// degraded, and once the queues empty it steps back to ready after the
// hold, a level at a time.
func TestShedding(t *testing.T) {
	up := newGate()
	web := &echo{}
	h := start(t, optionsFor(fmt.Sprintf(`
workers     = 1
work_queue  = 4
sched_queue = 0
shed_hold   = "200ms"
# Every request but the first must queue, not start on a reserved worker.
reserved_workers = 0
upstream "held" {
  url = %q
}
upstream "health" {
  url = %q
}
route "/" {
  upstream = "held"
}
route "/healthz" {
  upstream = "health"
  exempt   = true
}
tenant "acme" {
  api_key_sha256 = %q
}
default_tenant {
  rate_per_s = 1000
  burst      = 1000
}`, newUpstreamServer(t, up), newUpstreamServer(t, web), sumHex("acme-key"))))
	var wg sync.WaitGroup
	defer wg.Wait()
	var pending []queued
	depth := func() float64 { return metric(t, h, `queue_depth{queue="intake"}`) }
	acme := http.Header{"X-Api-Key": {"acme-key"}}

	pending = append(pending, sendAsync(t, h, "", &wg))
	waitUntil(t, "the worker held", func() bool { return up.waiting.Load() == 1 })
	pending = append(pending, sendAsync(t, h, "acme-key", &wg), sendAsync(t, h, "acme-key", &wg))
	waitUntil(t, "acme's two queued: half the intake", func() bool { return depth() == 2 })

	if rec := send(t, h, "POST", "/x", acme, nil); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"code":"shedding"`) {
		t.Fatalf("acme's POST over its share at half load = %d %s, want 503 shedding", rec.Code, rec.Body)
	}
	pending = append(pending, sendAsyncMethod(t, h, "POST", "", &wg)) // within the default tenant's share
	waitUntil(t, "three quarters of the intake", func() bool { return depth() == 3 })
	if rec := send(t, h, "POST", "/x", nil, nil); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("the default tenant's POST at three quarters = %d, want 503: every write is shed", rec.Code)
	}
	pending = append(pending, sendAsync(t, h, "acme-key", &wg)) // reads still queue
	waitUntil(t, "the intake full", func() bool { return depth() == 4 })
	if rec := send(t, h, "GET", "/x", nil, nil); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("a GET at full load = %d, want 503: reads are shed too", rec.Code)
	}
	if rec := send(t, h, "GET", "/healthz", nil, nil); rec.Code != http.StatusOK {
		t.Fatalf("GET on the exempt route at full load = %d %s, want 200", rec.Code, rec.Body)
	}
	hl, err := h.Health(context.Background())
	if err != nil || hl.Status != sdk.StatusDegraded || !strings.Contains(hl.Reason, "shedding all requests") {
		t.Fatalf("Health at full load = %+v, %v; want degraded, shedding all requests", hl, err)
	}
	close(up.open)
	for i, q := range pending {
		if code, body := q.code(t); code != http.StatusOK {
			t.Errorf("queued request %d = %d %s, want 200", i, code, body)
		}
	}
	// Three levels to step down, each after 200ms below its threshold,
	// and never back up meanwhile: no flapping.
	level := func(reason string) int {
		for l := 3; l > 0; l-- {
			if strings.Contains(reason, shed.Describe(l)) {
				return l
			}
		}
		return 0
	}
	last, seen := 3, []int{}
	waitUntil(t, "health ready again", func() bool {
		hl, err := h.Health(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		l := level(hl.Reason)
		if l > last {
			t.Fatalf("the shedding level rose from %d to %d with the queues empty: it flaps (levels seen %v)", last, l, seen)
		}
		if l != last || len(seen) == 0 {
			seen = append(seen, l)
		}
		last = l
		return hl.Status == sdk.StatusReady
	})
	t.Logf("levels seen while recovering: %v", seen)
	if got := metric(t, h, `rejected_total{reason="shed"}`); got != 3 {
		t.Errorf(`rejected_total{reason="shed"} = %v, want 3`, got)
	}
}

// TestReservedWorker holds the one worker with acme's request: the
// default tenant's, with nothing running or waiting, starts at once on
// a reserved worker, while acme's second waits in the scheduler queue
// though the other reserved worker is free.
func TestReservedWorker(t *testing.T) {
	up := newGate()
	h := start(t, optionsFor(twoTenants(newUpstreamServer(t, up), "workers = 1\nreserved_workers = 2\nsched_queue = 1\nshedding = false")))
	var wg sync.WaitGroup
	defer wg.Wait()
	a1 := sendAsync(t, h, "acme-key", &wg)
	waitUntil(t, "the worker to hold acme's request", func() bool { return up.waiting.Load() == 1 })
	d1 := sendAsync(t, h, "", &wg)
	waitUntil(t, "the default tenant's request upstream beside acme's", func() bool { return up.waiting.Load() == 2 })
	a2 := sendAsync(t, h, "acme-key", &wg)
	waitUntil(t, "acme's second request dispatched", func() bool { return metric(t, h, `queue_depth{queue="sched"}`) == 1 })
	if got := up.waiting.Load(); got != 2 {
		t.Errorf("%d requests upstream with acme's second dispatched, want 2: acme has one running, so no reserved worker for it", got)
	}
	close(up.open)
	for name, q := range map[string]queued{"a1": a1, "a2": a2, "d1": d1} {
		if code, body := q.code(t); code != http.StatusOK {
			t.Errorf("%s = %d %s, want 200", name, code, body)
		}
	}
	for series, want := range map[string]float64{
		`gateway_reserved_total`:             1,
		`tasks_spawned_total{kind="worker"}`: 3,
		`queue_dropped_total{queue="sched"}`: 0,
	} {
		if got := metric(t, h, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// TestSchedulerSeriesOnlyWithScheduler checks that the scheduler's series
// (queue_depth, queue_dropped_total and the tasks_* counters) are
// exported only by a gateway that has a scheduler: one with one tenant,
// whose requests take the bypass, exports none of them.
func TestSchedulerSeriesOnlyWithScheduler(t *testing.T) {
	up := newUpstreamServer(t, &flaky{})
	series := []string{"queue_depth", "queue_dropped_total", "tasks_spawned_total", "tasks_aborted_total", "tasks_canceled_total"}
	for _, tc := range []struct {
		name, config string
		sched        bool
	}{{"one tenant", flakyConfig(up, ""), false}, {"two tenants", twoTenants(up, ""), true}} {
		h := start(t, optionsFor(tc.config))
		m, err := h.Metrics(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range series {
			if has := strings.Contains(m, "\n"+s+"{"); has != tc.sched {
				t.Errorf("%s: series %s exported: %t, want %t", tc.name, s, has, tc.sched)
			}
		}
	}
}
