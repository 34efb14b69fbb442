package ingress_test

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/host/ingress"
	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// startHello starts another hello process for f's ingress, with greeting,
// as the host starts a replacement, and stops it when the test ends.
func (f *fixture) startHello(t *testing.T, greeting string) *supervisor.Process {
	t.Helper()
	p, err := supervisor.Start(t.Context(), supervisor.Spec{
		Name:     "hello",
		Path:     filepath.Join(bin, "hello"),
		Mount:    "/hello",
		Required: true,
		DataDir:  filepath.Join(t.TempDir(), "hello"),
		Decode:   func(*pluginv1.Schema) ([]byte, error) { return []byte(`{"greeting":"` + greeting + `"}`), nil },
	}, supervisor.Options{
		Logger: hclog.NewNullLogger(),
		Host:   f.g,
		Policy: supervisor.Policy{
			InitialBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, MaxRestarts: 5,
			Window: time.Minute, StableAfter: time.Minute, HealthInterval: time.Second,
			HealthTimeout: 10 * time.Second, HealthFailures: 3, StartTimeout: 30 * time.Second,
			Limits: &pluginv1.Limits{MaxBodyBytes: 1 << 20, RequestTimeoutMs: 30000},
		},
	})
	if err != nil {
		t.Fatalf("start another hello: %v", err)
	}
	t.Cleanup(func() { p.Stop(time.Now().Add(5 * time.Second)) })
	return p
}

// swap makes p the fixture's plugin of its name and updates the ingress.
func (f *fixture) swap(p *supervisor.Process) {
	f.mu.Lock()
	f.plugins[p.Name()] = p
	f.mu.Unlock()
	f.update()
}

func (f *fixture) held(name string) float64 {
	return testutil.ToFloat64(f.m.HeldRequests.WithLabelValues(name))
}

// TestHold checks the queue of a plugin being replaced: requests wait for
// the new process within the hold's count and time, and the others get
// 503 with Retry-After.
func TestHold(t *testing.T) {
	f := newFixture(t, defaultLimits, hello())
	old := f.plugin("hello")
	release := f.g.Hold("hello", time.Now().Add(time.Minute), 2)
	t.Cleanup(release)
	old.Stop(time.Now().Add(5 * time.Second))

	_, first := f.background(t, "/hello/")
	_, second := f.background(t, "/hello/")
	waitFor(t, 10*time.Second, "two requests to be held", func() bool { return f.held("hello") == 2 })
	if r := f.get(t, "/hello/"); r.code != http.StatusServiceUnavailable || r.errorCode() != "plugin_unavailable" || r.header.Get("Retry-After") == "" {
		t.Errorf("GET /hello/ beyond the hold's count = %d %v %s, want 503 plugin_unavailable with Retry-After", r.code, r.header, r.body)
	}
	if got := testutil.ToFloat64(f.m.HoldRejections.WithLabelValues("hello")); got != 1 {
		t.Errorf("plughost_hold_rejections_total = %v, want 1", got)
	}

	f.swap(f.startHello(t, "new"))
	release()
	for _, ch := range []<-chan response{first, second} {
		if r := receive(t, ch, "a held request"); r.code != http.StatusOK || !strings.Contains(r.body, `"greeting":"new"`) {
			t.Errorf("held GET /hello/ = %d %s, want 200 from the new process", r.code, r.body)
		}
	}
	if got := f.held("hello"); got != 0 {
		t.Errorf("plughost_held_requests = %v after the release, want 0", got)
	}

	// A hold that runs out answers 503 at its bound.
	cur := f.plugin("hello")
	start := time.Now() // the bound counts from here, stopping included
	release2 := f.g.Hold("hello", start.Add(300*time.Millisecond), 10)
	t.Cleanup(release2)
	cur.Stop(time.Now().Add(5 * time.Second))
	r := f.get(t, "/hello/")
	if r.code != http.StatusServiceUnavailable || r.errorCode() != "plugin_unavailable" {
		t.Errorf("GET /hello/ held past the hold's bound = %d %s, want 503 plugin_unavailable", r.code, r.body)
	}
	if took := time.Since(start); took < 300*time.Millisecond || took > 10*time.Second {
		t.Errorf("GET /hello/ held past a 300ms bound answered after %v, want at the bound", took)
	}
}

// refusing is a fake data plane that refuses every request as a
// draining plugin does, and calls onRefuse first.
type refusing struct {
	onRefuse func()
	calls    atomic.Int64
	done     chan struct{}
}

func (r *refusing) RoundTrip(context.Context, *dataplane.Request) (*dataplane.Response, error) {
	r.calls.Add(1)
	if r.onRefuse != nil {
		r.onRefuse()
	}
	return nil, dataplane.ErrRefused
}
func (r *refusing) Live() int             { return 1 }
func (r *refusing) Done() <-chan struct{} { return r.done }
func (r *refusing) Close()                {}

// drainingTarget is a hello whose process refuses every request, as one
// does once its drain has begun.
type drainingTarget struct {
	*supervisor.Process // the real hello, for its spec, manifest and status
	ep                  *supervisor.Endpoint
}

func (d drainingTarget) Endpoint() *supervisor.Endpoint { return d.ep }

// TestResendRefused checks that a request refused unrun by a process
// that began to drain after the request chose it goes to the process
// that replaced it; with none, it gets 503 without a warning.
func TestResendRefused(t *testing.T) {
	f := newFixture(t, defaultLimits, hello())
	next := f.plugin("hello")
	tr := &refusing{done: make(chan struct{})}
	// The request chooses the draining process; by the time it is
	// refused, the routing table has moved on, as in a replacement.
	tr.onRefuse = func() { f.g.Update([]ingress.Target{next}) }
	f.g.Update([]ingress.Target{drainingTarget{Process: next, ep: supervisor.NewEndpoint(nil, tr)}})
	if r := f.get(t, "/hello/"); r.code != http.StatusOK || !strings.Contains(r.body, `"greeting":"hi"`) {
		t.Errorf("GET /hello/ refused by a draining process = %d %s, want 200 from its replacement", r.code, r.body)
	}
	if got := tr.calls.Load(); got != 1 {
		t.Errorf("the draining process got %d requests, want 1", got)
	}

	// No replacement: 503, once.
	tr.calls.Store(0)
	tr.onRefuse = nil
	f.g.Update([]ingress.Target{drainingTarget{Process: next, ep: supervisor.NewEndpoint(nil, tr)}})
	if r := f.get(t, "/hello/"); r.code != http.StatusServiceUnavailable || r.errorCode() != "plugin_unavailable" {
		t.Errorf("GET /hello/ refused with no replacement = %d %s, want 503 plugin_unavailable", r.code, r.body)
	}
	if got := tr.calls.Load(); got != 1 {
		t.Errorf("the draining process got %d requests with no replacement, want 1", got)
	}
}
