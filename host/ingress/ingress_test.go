package ingress_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/plughost/plughost/host/ingress"
	"github.com/plughost/plughost/host/internal/testbin"
	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// bin is the directory TestMain builds the plugin binaries into.
var bin string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testbin.BuildFirst(m, "ingress", &bin,
		"./plugins/hello",
		"./host/e2e/testdata/plugins/crasher",
		"./host/e2e/testdata/plugins/faulty",
		"./host/e2e/testdata/plugins/caller",
	))
}

// fixture is an Ingress in front of real supervised plugins, served over
// real HTTP.
type fixture struct {
	g   *ingress.Ingress
	m   *metrics.Host
	srv *httptest.Server

	mu      sync.Mutex
	plugins map[string]*supervisor.Process

	// updateMu makes snapshots of plugins reach the ingress in the order
	// they were taken, as the host does.
	updateMu sync.Mutex
}

// pluginSpec describes a plugin for newFixture; name is also the binary.
type pluginSpec struct {
	name        string
	config      string
	required    bool
	maxInflight int
	maxRestarts int
	maxBody     int64 // the plugin block's max_body_bytes; 0 for none
}

// hello, faulty and caller are the plugin specs most tests use.
func hello() pluginSpec {
	return pluginSpec{name: "hello", config: `{"greeting":"hi"}`, required: true, maxRestarts: 5}
}

func faulty() pluginSpec {
	return pluginSpec{name: "faulty", config: `{"label":"x","limit":3}`, required: true, maxRestarts: 5}
}

func caller() pluginSpec {
	return pluginSpec{name: "caller", config: `{"target":"hello"}`, required: true, maxRestarts: 5}
}

// crasher fails at its first crash.
func crasher(required bool) pluginSpec {
	return pluginSpec{name: "crasher", config: `{}`, required: required}
}

var defaultLimits = ingress.Limits{MaxBodyBytes: 1 << 20, RequestTimeout: 30 * time.Second}

// newFixture starts the plugins, routes to them and stops everything when
// the test ends. It waits until the plugins that can start are ready.
func newFixture(t *testing.T, limits ingress.Limits, specs ...pluginSpec) *fixture {
	t.Helper()
	log := &testbin.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("host log:\n%s", log.String())
		}
	})
	logger := hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: log})
	f := &fixture{m: metrics.New(), plugins: map[string]*supervisor.Process{}}
	f.g = ingress.New(logger.Named("ingress"), f.m, limits)
	for _, s := range specs {
		opts := supervisor.Options{
			Logger:   logger.Named("supervisor"),
			Metrics:  f.m,
			Host:     f.g,
			OnChange: f.update,
			Policy: supervisor.Policy{
				InitialBackoff: 10 * time.Millisecond,
				MaxBackoff:     100 * time.Millisecond,
				MaxRestarts:    s.maxRestarts,
				Window:         time.Minute,
				StableAfter:    time.Minute,
				HealthInterval: time.Second,
				HealthTimeout:  10 * time.Second,
				HealthFailures: 3,
				StartTimeout:   30 * time.Second,
				Limits:         &pluginv1.Limits{MaxBodyBytes: limits.MaxBodyBytes, RequestTimeoutMs: limits.RequestTimeout.Milliseconds()},
			},
		}
		cfg := s.config
		p, err := supervisor.Start(t.Context(), supervisor.Spec{
			Name:         s.name,
			Path:         filepath.Join(bin, s.name),
			Mount:        "/" + s.name,
			MaxInflight:  s.maxInflight,
			MaxBodyBytes: s.maxBody,
			Required:     s.required,
			DataDir:      filepath.Join(t.TempDir(), s.name),
			Decode:       func(*pluginv1.Schema) ([]byte, error) { return []byte(cfg), nil },
		}, opts)
		if err != nil {
			t.Fatalf("start %s: %v", s.name, err)
		}
		t.Cleanup(func() { p.Stop(time.Now().Add(5 * time.Second)) })
		f.mu.Lock()
		f.plugins[s.name] = p
		f.mu.Unlock()
	}
	f.update()
	for _, s := range specs {
		if s.name == "crasher" {
			waitFor(t, 30*time.Second, "crasher to fail", func() bool {
				return f.plugin(s.name).Status().State == supervisor.StateFailed
			})
			continue
		}
		waitFor(t, 30*time.Second, s.name+" to be ready", f.plugin(s.name).Ready)
	}
	f.srv = httptest.NewServer(f.g)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) plugin(name string) *supervisor.Process {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.plugins[name]
}

// update gives the ingress the current plugins, as the host does.
func (f *fixture) update() {
	f.updateMu.Lock()
	defer f.updateMu.Unlock()
	f.mu.Lock()
	ts := make([]ingress.Target, 0, len(f.plugins))
	for _, p := range f.plugins {
		ts = append(ts, p)
	}
	f.mu.Unlock()
	f.g.Update(ts)
}

// response is what a request through the fixture's server got back.
type response struct {
	code   int
	header http.Header
	body   string
}

// errorCode returns the "code" of the platform's JSON error body, or "".
func (r response) errorCode() string {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(r.body), &e) != nil {
		return ""
	}
	return e.Error.Code
}

func (f *fixture) do(t *testing.T, req *http.Request) response {
	t.Helper()
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.Method, req.URL.Path, err)
	}
	return response{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (f *fixture) request(t *testing.T, method, path string, body io.Reader) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, f.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	return f.do(t, req)
}

func (f *fixture) get(t *testing.T, path string) response {
	t.Helper()
	return f.request(t, http.MethodGet, path, nil)
}

// inflight reads plughost_inflight_requests for a plugin.
func (f *fixture) inflight(name string) float64 {
	return testutil.ToFloat64(f.m.Inflight.WithLabelValues(name))
}

// background sends a request that is expected to be held open and returns
// a cancel func and a channel with its outcome.
func (f *fixture) background(t *testing.T, path string) (context.CancelFunc, <-chan response) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan response, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			out <- response{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- response{code: resp.StatusCode, header: resp.Header, body: string(b)}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return cancel, out
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func receive(t *testing.T, ch <-chan response, what string) response {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out after 30s waiting for %s", what)
		return response{}
	}
}

func TestHealthzWithoutPlugins(t *testing.T) {
	f := newFixture(t, defaultLimits)
	tests := []struct {
		path string
		want string
	}{
		{"/healthz", `{"status":"ok"}` + "\n"},
		{"/readyz", `{"ready":true,"draining":false,"plugins":[]}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			r := f.get(t, tt.path)
			if r.code != http.StatusOK || r.body != tt.want {
				t.Errorf("GET %s = %d %q, want 200 %q", tt.path, r.code, r.body, tt.want)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("GET %s Content-Type = %q, want application/json", tt.path, ct)
			}
		})
	}
	if r := f.get(t, "/nothing"); r.code != http.StatusNotFound || r.errorCode() != "not_found" {
		t.Errorf("GET /nothing with no plugins = %d %s, want 404 not_found", r.code, r.body)
	}
}

func TestReadyz(t *testing.T) {
	type readyBody struct {
		Ready    bool                `json:"ready"`
		Draining bool                `json:"draining"`
		Plugins  []supervisor.Status `json:"plugins"`
	}
	tests := []struct {
		name      string
		plugins   []pluginSpec
		drain     bool
		wantCode  int
		wantReady bool
		wantState map[string]supervisor.State
	}{
		{
			name:      "ready plugins",
			plugins:   []pluginSpec{hello(), faulty()},
			wantCode:  http.StatusOK,
			wantReady: true,
			wantState: map[string]supervisor.State{"faulty": supervisor.StateReady, "hello": supervisor.StateReady},
		},
		{
			name:      "draining",
			plugins:   []pluginSpec{hello()},
			drain:     true,
			wantCode:  http.StatusServiceUnavailable,
			wantState: map[string]supervisor.State{"hello": supervisor.StateReady},
		},
		{
			name:      "required plugin not ready",
			plugins:   []pluginSpec{hello(), crasher(true)},
			wantCode:  http.StatusServiceUnavailable,
			wantState: map[string]supervisor.State{"crasher": supervisor.StateFailed, "hello": supervisor.StateReady},
		},
		{
			name:      "optional plugin not ready",
			plugins:   []pluginSpec{hello(), crasher(false)},
			wantCode:  http.StatusOK,
			wantReady: true,
			wantState: map[string]supervisor.State{"crasher": supervisor.StateFailed, "hello": supervisor.StateReady},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, defaultLimits, tt.plugins...)
			if tt.drain {
				f.g.SetDraining()
			}
			r := f.get(t, "/readyz")
			if r.code != tt.wantCode {
				t.Errorf("GET /readyz = %d, want %d; body %s", r.code, tt.wantCode, r.body)
			}
			var body readyBody
			if err := json.Unmarshal([]byte(r.body), &body); err != nil {
				t.Fatalf("GET /readyz body %q: %v", r.body, err)
			}
			if body.Ready != tt.wantReady || body.Draining != tt.drain {
				t.Errorf("GET /readyz ready, draining = %t, %t, want %t, %t", body.Ready, body.Draining, tt.wantReady, tt.drain)
			}
			if got := f.g.Ready(); got != tt.wantReady {
				t.Errorf("Ready() = %t, want %t, as /readyz says", got, tt.wantReady)
			}
			got := map[string]supervisor.State{}
			var names []string
			for _, p := range body.Plugins {
				got[p.Name] = p.State
				names = append(names, p.Name)
			}
			// Only names and states: no pid, path, version, error.
			var raw struct {
				Plugins []map[string]any `json:"plugins"`
			}
			if err := json.Unmarshal([]byte(r.body), &raw); err != nil {
				t.Fatalf("GET /readyz body %q: %v", r.body, err)
			}
			for _, p := range raw.Plugins {
				for k := range p {
					if !map[string]bool{"name": true, "state": true, "health": true, "ready": true}[k] {
						t.Errorf("GET /readyz plugin %v has key %q, want only name, state, health and ready", p["name"], k)
					}
				}
				if want := p["state"] == string(supervisor.StateReady); p["ready"] != want {
					t.Errorf("GET /readyz plugin %v: ready = %v, want %t", p["name"], p["ready"], want)
				}
			}
			if diff := cmp.Diff(tt.wantState, got); diff != "" {
				t.Errorf("GET /readyz plugin states mismatch (-want +got):\n%s", diff)
			}
			for i := 1; i < len(names); i++ {
				if names[i-1] > names[i] {
					t.Errorf("GET /readyz plugins = %v, want them sorted by name", names)
				}
			}
			// Each plugin's own readiness: 200 while it serves.
			for name, state := range tt.wantState {
				want := http.StatusServiceUnavailable
				if state == supervisor.StateReady && !tt.drain {
					want = http.StatusOK
				}
				r := f.get(t, "/readyz/"+name)
				wantBody := fmt.Sprintf(`{"name":%q,"state":%q}`+"\n", name, state)
				if r.code != want || r.body != wantBody {
					t.Errorf("GET /readyz/%s = %d %s, want %d %s", name, r.code, r.body, want, wantBody)
				}
			}
			if r := f.get(t, "/readyz/nothing"); r.code != http.StatusNotFound || r.errorCode() != "not_found" {
				t.Errorf("GET /readyz/nothing = %d %s, want 404 not_found", r.code, r.body)
			}
			// /healthz is about the process only.
			if r := f.get(t, "/healthz"); r.code != http.StatusOK {
				t.Errorf("GET /healthz = %d, want 200", r.code)
			}
		})
	}
}

func TestRouting(t *testing.T) {
	f := newFixture(t, defaultLimits, hello(), faulty())
	tests := []struct {
		method, path string
		body         string
		wantCode     int
		wantErr      string // the JSON error code, or "" for a plugin's answer
		wantBody     string // substring of the body
		wantAllow    string // the Allow header
	}{
		{method: "GET", path: "/hello", wantCode: 200, wantBody: `{"greeting":"hi"}`},
		{method: "GET", path: "/hello/", wantCode: 200, wantBody: `{"greeting":"hi"}`},
		{method: "GET", path: "/hellox", wantCode: 404, wantErr: "not_found", wantBody: "no plugin is mounted"},
		{method: "GET", path: "/hellox/", wantCode: 404, wantErr: "not_found", wantBody: "no plugin is mounted"},
		{method: "GET", path: "/", wantCode: 404, wantErr: "not_found", wantBody: "no plugin is mounted"},
		{method: "GET", path: "/hello/nope", wantCode: 404, wantErr: "not_found", wantBody: `plugin \"hello\" has no route for GET /nope`},
		{method: "POST", path: "/hello/", wantCode: 405, wantErr: "method_not_allowed", wantBody: "POST is not allowed", wantAllow: "GET, HEAD"},
		{method: "DELETE", path: "/faulty/ok", wantCode: 405, wantErr: "method_not_allowed", wantAllow: "GET, HEAD"},
		{method: "GET", path: "/faulty/echo", wantCode: 405, wantErr: "method_not_allowed", wantAllow: "POST"},
		{method: "POST", path: "/faulty/poke", wantCode: 200, wantBody: "poked"},
		{method: "POST", path: "/faulty/poke", body: "x", wantCode: 413, wantErr: "body_too_large", wantBody: `"POST /poke takes no body; the limit is 0 bytes"`},
		{method: "GET", path: "/hello/sleep?ms=oops", wantCode: 400, wantErr: "bad_request"},
		{method: "GET", path: "/hello/sleep?ms=1", wantCode: 200, wantBody: `"slept_ms":1`},
		{method: "GET", path: "/faulty/ok", wantCode: 200, wantBody: "ok\n"},
		{method: "GET", path: "/faulty/panic", wantCode: 500, wantErr: "internal"},
		{method: "POST", path: "/faulty/echo", body: "ping", wantCode: 200, wantBody: "ping"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			r := f.request(t, tt.method, tt.path, body)
			if r.code != tt.wantCode || r.errorCode() != tt.wantErr || !strings.Contains(r.body, tt.wantBody) {
				t.Errorf("%s %s = %d %q, want %d with error code %q and body containing %q",
					tt.method, tt.path, r.code, r.body, tt.wantCode, tt.wantErr, tt.wantBody)
			}
			if got := r.header.Get("Allow"); got != tt.wantAllow {
				t.Errorf("%s %s Allow = %q, want %q", tt.method, tt.path, got, tt.wantAllow)
			}
			if tt.wantErr != "" && r.header.Get("Content-Type") != "application/json" {
				t.Errorf("%s %s Content-Type = %q, want application/json", tt.method, tt.path, r.header.Get("Content-Type"))
			}
		})
	}

	// Every answer from a plugin is counted under its code.
	if got := testutil.ToFloat64(f.m.Requests.WithLabelValues("hello", "200")); got != 3 {
		t.Errorf("plughost_http_requests_total{plugin=hello,code=200} = %v, want 3", got)
	}
	if got := testutil.ToFloat64(f.m.Requests.WithLabelValues("faulty", "500")); got != 1 {
		t.Errorf("plughost_http_requests_total{plugin=faulty,code=500} = %v, want 1", got)
	}

	// A plugin taken out of the table is no longer routed to.
	f.g.Update([]ingress.Target{f.plugin("faulty")})
	if r := f.get(t, "/hello/"); r.code != http.StatusNotFound || r.errorCode() != "not_found" {
		t.Errorf("GET /hello/ after removing hello = %d %s, want 404 not_found", r.code, r.body)
	}
}

// chunked hides a reader's length so that the client sends it chunked.
type chunked struct{ io.Reader }

func TestBodyLimit(t *testing.T) {
	const limit = 1024
	f := newFixture(t, ingress.Limits{MaxBodyBytes: limit, RequestTimeout: 30 * time.Second}, faulty())
	small := strings.Repeat("a", limit)
	big := strings.Repeat("b", limit+1)
	tests := []struct {
		name     string
		body     io.Reader
		wantCode int
		wantErr  string
		wantBody string
	}{
		{name: "at the limit", body: strings.NewReader(small), wantCode: 200, wantBody: small},
		{name: "content-length over the limit", body: strings.NewReader(big), wantCode: 413, wantErr: "body_too_large", wantBody: "the limit is 1024"},
		{name: "chunked at the limit", body: chunked{strings.NewReader(small)}, wantCode: 200, wantBody: small},
		{name: "chunked over the limit", body: chunked{strings.NewReader(big)}, wantCode: 413, wantErr: "body_too_large", wantBody: "exceeds the limit of 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, f.srv.URL+"/faulty/echo", tt.body)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := tt.body.(chunked); ok && req.ContentLength != 0 {
				t.Fatalf("ContentLength = %d, want 0 (unknown) for a chunked body", req.ContentLength)
			}
			r := f.do(t, req)
			if r.code != tt.wantCode || r.errorCode() != tt.wantErr || !strings.Contains(r.body, tt.wantBody) {
				t.Errorf("POST /faulty/echo (%s) = %d %.80q, want %d with error code %q and body containing %.80q",
					tt.name, r.code, r.body, tt.wantCode, tt.wantErr, tt.wantBody)
			}
		})
	}
}

func TestBusy(t *testing.T) {
	h := hello()
	h.maxInflight = 1
	f := newFixture(t, defaultLimits, h)

	cancel, held := f.background(t, "/hello/sleep?ms=60000")
	waitFor(t, 30*time.Second, "the sleep request to be in flight", func() bool { return f.inflight("hello") == 1 })

	r := f.get(t, "/hello/")
	if r.code != http.StatusTooManyRequests || r.errorCode() != "busy" {
		t.Errorf("GET /hello/ at max_inflight = %d %s, want 429 busy", r.code, r.body)
	}
	if ra := r.header.Get("Retry-After"); ra != "1" {
		t.Errorf("429 Retry-After = %q, want 1", ra)
	}
	if got := testutil.ToFloat64(f.m.BusyRejections.WithLabelValues("hello")); got != 1 {
		t.Errorf("plughost_busy_rejections_total{plugin=hello} = %v, want 1", got)
	}

	cancel()
	receive(t, held, "the cancelled sleep request")
	waitFor(t, 30*time.Second, "the slot to be released", func() bool { return f.inflight("hello") == 0 })
	if r := f.get(t, "/hello/"); r.code != http.StatusOK {
		t.Errorf("GET /hello/ after the slot was released = %d %s, want 200", r.code, r.body)
	}
}

func TestRequestTimeout(t *testing.T) {
	// caller's /slow declares no timeout of its own, so request_timeout
	// applies; hello's /sleep declares ten minutes. The timeout must not
	// be tight: the other requests here must beat it on a busy machine.
	f := newFixture(t, ingress.Limits{MaxBodyBytes: 1 << 20, RequestTimeout: 2 * time.Second}, caller())

	r := f.get(t, "/caller/slow?ms=60000")
	if r.code != http.StatusGatewayTimeout || r.errorCode() != "timeout" {
		t.Errorf("GET /caller/slow past request_timeout = %d %s, want 504 timeout", r.code, r.body)
	}
	// The plugin's handler saw its context end.
	waitFor(t, 30*time.Second, "the plugin to see the request cancelled", func() bool {
		return f.get(t, "/caller/cancelled").body == `{"cancelled":1}`+"\n"
	})
	if r := f.get(t, "/caller/slow?ms=1"); r.code != http.StatusOK {
		t.Errorf("GET /caller/slow?ms=1 = %d %s, want 200 within request_timeout", r.code, r.body)
	}
}

func TestPluginUnavailable(t *testing.T) {
	f := newFixture(t, defaultLimits, hello(), crasher(false))

	t.Run("failed plugin", func(t *testing.T) {
		r := f.get(t, "/crasher/anything")
		if r.code != http.StatusServiceUnavailable || r.errorCode() != "plugin_unavailable" || !strings.Contains(r.body, "failed") {
			t.Errorf("GET /crasher/anything = %d %s, want 503 plugin_unavailable naming its state", r.code, r.body)
		}
		if ra := r.header.Get("Retry-After"); ra != "1" {
			t.Errorf("503 Retry-After = %q, want 1", ra)
		}
	})

	t.Run("process killed mid-request", func(t *testing.T) {
		p := f.plugin("hello")
		pid := p.Status().Pid
		_, held := f.background(t, "/hello/sleep?ms=60000")
		waitFor(t, 30*time.Second, "the sleep request to be in flight", func() bool { return f.inflight("hello") == 1 })
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		r := receive(t, held, "the request to the killed plugin")
		if r.code != http.StatusServiceUnavailable || r.errorCode() != "plugin_unavailable" {
			t.Errorf("GET /hello/sleep while the plugin is killed = %d %s, want 503 plugin_unavailable", r.code, r.body)
		}
		waitFor(t, 30*time.Second, "hello to be restarted", func() bool { return p.Ready() && p.Status().Pid != pid })
	})

	t.Run("stopped plugin", func(t *testing.T) {
		f.plugin("hello").Stop(time.Now().Add(5 * time.Second))
		r := f.get(t, "/hello/")
		if r.code != http.StatusServiceUnavailable || r.errorCode() != "plugin_unavailable" || !strings.Contains(r.body, "stopped") {
			t.Errorf("GET /hello/ after Stop = %d %s, want 503 plugin_unavailable naming its state", r.code, r.body)
		}
	})
}

func TestDrainAborted(t *testing.T) {
	f := newFixture(t, defaultLimits, hello())
	_, held := f.background(t, "/hello/sleep?ms=60000")
	// In flight at the host is not yet in flight at the plugin (the
	// request may still be on the wire, and a drain that overtakes it
	// answers "draining"); hello counts a sleep when it starts one.
	waitFor(t, 30*time.Second, "the sleep request to reach hello", func() bool { return sleepsStarted(t, f.plugin("hello")) == 1 })

	f.plugin("hello").Stop(time.Now().Add(300 * time.Millisecond))
	r := receive(t, held, "the request abandoned at the drain deadline")
	if r.code != http.StatusServiceUnavailable || r.errorCode() != "drain_aborted" {
		t.Errorf("GET /hello/sleep past the drain deadline = %d %s, want 503 drain_aborted", r.code, r.body)
	}
	if got := testutil.ToFloat64(f.m.DrainAborted.WithLabelValues("hello")); got != 1 {
		t.Errorf("plughost_drain_aborted_total{plugin=hello} = %v, want 1", got)
	}
}

// sleepsStarted reads hello_sleeps_total from the plugin's own metrics.
func sleepsStarted(t *testing.T, p *supervisor.Process) float64 {
	t.Helper()
	raw, err := p.Families(t.Context())
	if err != nil {
		return 0
	}
	for _, b := range raw {
		mf := &dto.MetricFamily{}
		if err := proto.Unmarshal(b, mf); err != nil {
			t.Fatalf("decode hello's metrics: %v", err)
		}
		if mf.GetName() == "hello_sleeps_total" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

func TestStreaming(t *testing.T) {
	f := newFixture(t, defaultLimits, faulty())
	r := f.get(t, "/faulty/stream?n=3")
	want := "data: 0\n\ndata: 1\n\ndata: 2\n\n"
	if r.code != http.StatusOK || r.body != want {
		t.Errorf("GET /faulty/stream?n=3 = %d %q, want 200 %q", r.code, r.body, want)
	}
	if ct := r.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("GET /faulty/stream Content-Type = %q, want text/event-stream", ct)
	}

	// The events arrive as the plugin sends them: the first is readable
	// while the plugin is still streaming the rest.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, f.srv.URL+"/faulty/stream?n=1000", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, len("data: 0\n\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: 0\n\n" {
		t.Errorf("first event of a long stream = %q, %v, want %q", first, err, "data: 0\n\n")
	}
	resp.Body.Close() // the client goes away mid-stream
	waitFor(t, 30*time.Second, "the abandoned stream to end", func() bool { return f.inflight("faulty") == 0 })
}

func TestCall(t *testing.T) {
	f := newFixture(t, defaultLimits, hello(), faulty(), caller())

	tests := []struct {
		name     string
		req      *pluginv1.CallRequest
		wantCode codes.Code
		wantHTTP int32
		wantBody string
	}{
		{
			name:     "hello",
			req:      &pluginv1.CallRequest{Plugin: "hello", Request: &pluginv1.HTTPRequest{Method: "GET", Path: "/"}},
			wantHTTP: 200,
			wantBody: `{"greeting":"hi"}`,
		},
		{
			name:     "query string",
			req:      &pluginv1.CallRequest{Plugin: "hello", Request: &pluginv1.HTTPRequest{Method: "GET", Path: "/sleep", RawQuery: "ms=oops"}},
			wantHTTP: 400,
			wantBody: "bad_request",
		},
		{
			name:     "body",
			req:      &pluginv1.CallRequest{Plugin: "faulty", Request: &pluginv1.HTTPRequest{Method: "POST", Path: "/echo", Body: []byte("ping")}},
			wantHTTP: 200,
			wantBody: "ping",
		},
		{
			name:     "streaming route",
			req:      &pluginv1.CallRequest{Plugin: "faulty", Request: &pluginv1.HTTPRequest{Method: "GET", Path: "/stream", RawQuery: "n=2"}},
			wantHTTP: 200,
			wantBody: "data: 0\n\ndata: 1\n\n",
		},
		{
			name:     "no route",
			req:      &pluginv1.CallRequest{Plugin: "hello", Request: &pluginv1.HTTPRequest{Method: "GET", Path: "/nope"}},
			wantHTTP: 404,
			wantBody: "not_found",
		},
		{
			name:     "unknown plugin",
			req:      &pluginv1.CallRequest{Plugin: "nope", Request: &pluginv1.HTTPRequest{Method: "GET", Path: "/"}},
			wantCode: codes.NotFound,
		},
		{
			name:     "relative path",
			req:      &pluginv1.CallRequest{Plugin: "hello", Request: &pluginv1.HTTPRequest{Method: "GET", Path: "sleep"}},
			wantCode: codes.InvalidArgument,
		},
		{
			name:     "no request",
			req:      &pluginv1.CallRequest{Plugin: "hello"},
			wantCode: codes.InvalidArgument,
		},
		{
			name:     "bad method",
			req:      &pluginv1.CallRequest{Plugin: "hello", Request: &pluginv1.HTTPRequest{Method: "GE T", Path: "/"}},
			wantCode: codes.InvalidArgument,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := f.g.Call(t.Context(), tt.req)
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("Call(%v) = %v, want code %v", tt.req, err, tt.wantCode)
			}
			if err != nil {
				return
			}
			if resp.GetStatus() != tt.wantHTTP || !strings.Contains(string(resp.GetBody()), tt.wantBody) {
				t.Errorf("Call(%v) = %d %q, want %d with body containing %q", tt.req, resp.GetStatus(), resp.GetBody(), tt.wantHTTP, tt.wantBody)
			}
		})
	}

	// A plugin calls another through the Host service it reaches over the
	// go-plugin broker.
	t.Run("from a plugin", func(t *testing.T) {
		r := f.get(t, "/caller/call?plugin=hello&path=/")
		if r.code != http.StatusOK || !strings.Contains(r.body, `{"greeting":"hi"}`) {
			t.Errorf("GET /caller/call?plugin=hello = %d %s, want 200 with hello's greeting", r.code, r.body)
		}
		r = f.get(t, "/caller/call?plugin=nope&path=/")
		if r.code != http.StatusBadGateway || !strings.Contains(r.body, "NotFound") {
			t.Errorf("GET /caller/call?plugin=nope = %d %s, want 502 relaying NotFound", r.code, r.body)
		}
	})
}

func TestCallCancelled(t *testing.T) {
	f := newFixture(t, defaultLimits, hello())
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	resp, err := f.g.Call(ctx, &pluginv1.CallRequest{Plugin: "hello", Request: &pluginv1.HTTPRequest{Method: "GET", Path: "/sleep", RawQuery: "ms=60000"}})
	if err != nil {
		t.Fatalf("Call(/sleep past the caller's deadline) = %v, want an HTTP answer", err)
	}
	if resp.GetStatus() != http.StatusGatewayTimeout {
		t.Errorf("Call(/sleep past the caller's deadline) = %d %s, want 504", resp.GetStatus(), resp.GetBody())
	}
	// ctx.Err() may not be set yet when the answer arrives just after the
	// deadline (the context's timer runs on its own), so compare clocks.
	if deadline, _ := ctx.Deadline(); time.Now().Before(deadline) {
		t.Errorf("Call returned %v before the caller's deadline", time.Until(deadline))
	}
}

// TestHeadContentLength: a plugin's answer to HEAD keeps the
// Content-Length it set, the length of the GET's body, rather than that
// of the body it did not send.
func TestHeadContentLength(t *testing.T) {
	f := newFixture(t, defaultLimits, faulty())
	r := f.request(t, http.MethodHead, "/faulty/sized", nil)
	if r.code != http.StatusOK || r.header.Get("Content-Length") != "42" {
		t.Errorf("HEAD /faulty/sized = %d with Content-Length %q, want 200 with the plugin's 42", r.code, r.header.Get("Content-Length"))
	}
	r = f.request(t, http.MethodHead, "/faulty/ok", nil)
	if r.code != http.StatusOK || r.header.Get("Content-Length") != "3" {
		t.Errorf("HEAD /faulty/ok = %d with Content-Length %q, want 200 with 3, the length of the body it wrote", r.code, r.header.Get("Content-Length"))
	}
}

// TestHopHeadersDropped checks that a plugin's hop-by-hop answer headers,
// and those its Connection header names, do not reach the client, and
// that its other headers do.
func TestHopHeadersDropped(t *testing.T) {
	f := newFixture(t, defaultLimits, faulty())
	r := f.get(t, "/faulty/hop")
	if r.code != http.StatusOK || r.header.Get("X-Kept") != "1" {
		t.Fatalf("GET /faulty/hop = %d %v, want 200 with X-Kept", r.code, r.header)
	}
	for _, k := range []string{"X-Named", "Keep-Alive", "Upgrade", "Trailer", "Proxy-Authenticate", "Connection"} {
		if v, ok := r.header[k]; ok {
			t.Errorf("the answer carries the plugin's %s: %q", k, v)
		}
	}
}
