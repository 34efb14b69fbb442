package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/plughost/plughost/host/admin"
	"github.com/plughost/plughost/host/supervisor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakePlugins is an admin.Plugins with fixed statuses that records
// restarts; the real one, the host's plugin set, is covered end to end.
type fakePlugins struct {
	statuses []supervisor.Status

	mu        sync.Mutex
	restarted []string
	faults    []admin.Fault
}

func (f *fakePlugins) Statuses() []supervisor.Status { return f.statuses }

func (f *fakePlugins) Restart(name string) bool {
	if !slices.ContainsFunc(f.statuses, func(s supervisor.Status) bool { return s.Name == name }) {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restarted = append(f.restarted, name)
	return true
}

// Upgrade records an upgrade of hello; broken's binary fails its pin.
func (f *fakePlugins) Upgrade(name string) error {
	if !slices.ContainsFunc(f.statuses, func(s supervisor.Status) bool { return s.Name == name }) {
		return admin.ErrNoPlugin
	}
	if name == "broken" {
		return fmt.Errorf("%w: want sha256 00, got 11", admin.ErrChecksum)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restarted = append(f.restarted, "upgrade "+name)
	return nil
}

func (f *fakePlugins) SetFaults(_ context.Context, name string, faults []admin.Fault) ([]admin.Fault, error) {
	if !slices.ContainsFunc(f.statuses, func(s supervisor.Status) bool { return s.Name == name }) {
		return nil, admin.ErrNoPlugin
	}
	for _, ft := range faults {
		if ft.Point == "misspelt" {
			return nil, fmt.Errorf("%w %q: this plugin's fault points are \"ledger.commit\"", admin.ErrUnknownFaultPoint, ft.Point)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = faults
	return faults, nil
}

func (f *fakePlugins) restarts() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.restarted)
}

var statuses = []supervisor.Status{
	{Name: "broken", State: supervisor.StateFailed, Restarts: 6, LastError: "start: plugin exited", Required: false, Mount: "/broken"},
	{Name: "hello", State: supervisor.StateReady, Health: "degraded", Pid: 4242, Restarts: 1, Version: "0.1.0", Required: true, Mount: "/hello"},
}

// newServer serves the admin handler over real HTTP.
func newServer(t *testing.T, token string) (*httptest.Server, *fakePlugins) {
	t.Helper()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "plughost_test_total", Help: "A test counter."})
	c.Add(7)
	reg.MustRegister(c)
	plugins := &fakePlugins{statuses: statuses}
	h := admin.New(reg, plugins, admin.Options{Token: token, Faults: token != ""})
	t.Cleanup(h.Close)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, plugins
}

type response struct {
	code   int
	header http.Header
	body   string
}

func (r response) errorCode() string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(r.body), &e) != nil {
		return ""
	}
	return e.Error.Code
}

func do(t *testing.T, srv *httptest.Server, method, path, auth string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	c := *srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

func TestListPlugins(t *testing.T) {
	srv, _ := newServer(t, "")
	r := do(t, srv, http.MethodGet, "/v1/plugins", "")
	if r.code != http.StatusOK {
		t.Fatalf("GET /v1/plugins = %d %s, want 200", r.code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("GET /v1/plugins Content-Type = %q, want application/json", ct)
	}
	var got []supervisor.Status
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatalf("GET /v1/plugins body %q: %v", r.body, err)
	}
	if diff := cmp.Diff(statuses, got); diff != "" {
		t.Errorf("GET /v1/plugins mismatch (-want +got):\n%s", diff)
	}
	// The field names are the API; pin a few.
	for _, field := range []string{`"name":"hello"`, `"state":"ready"`, `"health":"degraded"`, `"pid":4242`, `"last_error":"start: plugin exited"`, `"required":true`, `"mount":"/hello"`} {
		if !strings.Contains(r.body, field) {
			t.Errorf("GET /v1/plugins = %s, want it to contain %s", r.body, field)
		}
	}
}

func TestRoutes(t *testing.T) {
	tests := []struct {
		method, path string
		wantCode     int
		wantErr      string // JSON error code, "" for a success body
		wantBody     string
		wantAllow    string // the Allow header
		wantRestart  []string
	}{
		{method: "POST", path: "/v1/plugins/hello/restart", wantCode: 202, wantBody: `{"plugin":"hello","status":"restarting"}`, wantRestart: []string{"hello"}},
		{method: "POST", path: "/v1/plugins/nope/restart", wantCode: 404, wantErr: "not_found", wantBody: `no plugin named \"nope\"`},
		{method: "GET", path: "/v1/plugins/hello/restart", wantCode: 405, wantErr: "method_not_allowed", wantAllow: "POST"},
		{method: "POST", path: "/v1/plugins/hello/upgrade", wantCode: 202, wantBody: `{"plugin":"hello","status":"upgrading"}`, wantRestart: []string{"upgrade hello"}},
		{method: "POST", path: "/v1/plugins/nope/upgrade", wantCode: 404, wantErr: "not_found", wantBody: `no plugin named \"nope\"`},
		{method: "POST", path: "/v1/plugins/broken/upgrade", wantCode: 409, wantErr: "checksum_mismatch", wantBody: "sha256"},
		{method: "GET", path: "/v1/plugins/hello/upgrade", wantCode: 405, wantErr: "method_not_allowed", wantAllow: "POST"},
		{method: "DELETE", path: "/v1/plugins", wantCode: 405, wantErr: "method_not_allowed", wantAllow: "GET, HEAD"},
		{method: "GET", path: "/v1/plugins/hello/faults", wantCode: 405, wantErr: "method_not_allowed", wantAllow: "DELETE, POST"},
		{method: "POST", path: "/v1/plugins", wantCode: 405, wantErr: "method_not_allowed", wantAllow: "GET, HEAD"},
		{method: "GET", path: "/v1/nothing", wantCode: 404, wantErr: "not_found"},
		{method: "GET", path: "/v1/plugins/hello", wantCode: 404, wantErr: "not_found"},
		{method: "GET", path: "/nothing", wantCode: 404, wantErr: "not_found", wantBody: "no admin endpoint at /nothing"},
		{method: "PUT", path: "/", wantCode: 404, wantErr: "not_found"},
		{method: "GET", path: "/index.html", wantCode: 404, wantErr: "not_found"},
		{method: "GET", path: "/v1/status/hello", wantCode: 404, wantErr: "not_found"},
		{method: "POST", path: "/v1/status", wantCode: 405, wantErr: "method_not_allowed", wantAllow: "GET, HEAD"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			srv, plugins := newServer(t, "")
			r := do(t, srv, tt.method, tt.path, "")
			if r.code != tt.wantCode || r.errorCode() != tt.wantErr || !strings.Contains(r.body, tt.wantBody) {
				t.Errorf("%s %s = %d %s, want %d with error code %q and body containing %q",
					tt.method, tt.path, r.code, r.body, tt.wantCode, tt.wantErr, tt.wantBody)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s %s Content-Type = %q, want application/json", tt.method, tt.path, ct)
			}
			if got := r.header.Get("Allow"); got != tt.wantAllow {
				t.Errorf("%s %s Allow = %q, want %q", tt.method, tt.path, got, tt.wantAllow)
			}
			if diff := cmp.Diff(tt.wantRestart, plugins.restarts()); diff != "" {
				t.Errorf("%s %s restarts mismatch (-want +got):\n%s", tt.method, tt.path, diff)
			}
		})
	}
}

// TestAPICrossOrigin: without a token, a request a browser makes for
// another origin's page cannot restart, upgrade or inject faults; a
// script's request, which names no origin, still can.
func TestAPICrossOrigin(t *testing.T) {
	srv, plugins := newServer(t, "")
	for _, path := range []string{"/v1/plugins/hello/restart", "/v1/plugins/hello/upgrade", "/v1/plugins/hello/faults"} {
		for _, hdr := range [][2]string{{"Sec-Fetch-Site", "cross-site"}, {"Origin", "http://evil.example"}} {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(hdr[0], hdr[1])
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("POST %s with %s: %s = %d, want 403", path, hdr[0], hdr[1], resp.StatusCode)
			}
		}
	}
	if got := plugins.restarts(); len(got) != 0 {
		t.Fatalf("restarts after cross-origin posts = %q, want none", got)
	}
	if r := do(t, srv, http.MethodPost, "/v1/plugins/hello/restart", ""); r.code != http.StatusAccepted {
		t.Fatalf("POST /v1/plugins/hello/restart from a script = %d %s, want 202", r.code, r.body)
	}
}

func TestToken(t *testing.T) {
	const token = "s3cret-token"
	tests := []struct {
		name         string
		method, path string
		auth         string
		wantCode     int
	}{
		{name: "no token", method: "GET", path: "/v1/plugins", wantCode: 401},
		{name: "wrong token", method: "GET", path: "/v1/plugins", auth: "Bearer wrong", wantCode: 401},
		{name: "token prefix", method: "GET", path: "/v1/plugins", auth: "Bearer s3cret", wantCode: 401},
		{name: "not bearer", method: "GET", path: "/v1/plugins", auth: token, wantCode: 401},
		{name: "basic scheme", method: "GET", path: "/v1/plugins", auth: "Basic " + token, wantCode: 401},
		{name: "right token", method: "GET", path: "/v1/plugins", auth: "Bearer " + token, wantCode: 200},
		{name: "scheme in lower case", method: "GET", path: "/v1/plugins", auth: "bearer " + token, wantCode: 200},
		{name: "scheme in upper case", method: "GET", path: "/v1/plugins", auth: "BEARER " + token, wantCode: 200},
		{name: "two spaces after the scheme", method: "GET", path: "/v1/plugins", auth: "Bearer  " + token, wantCode: 200},
		{name: "scheme glued to the token", method: "GET", path: "/v1/plugins", auth: "Bearer" + token, wantCode: 401},
		{name: "restart without token", method: "POST", path: "/v1/plugins/hello/restart", wantCode: 401},
		{name: "restart with token", method: "POST", path: "/v1/plugins/hello/restart", auth: "Bearer " + token, wantCode: 202},
		{name: "unknown endpoint needs the token first", method: "GET", path: "/v1/nothing", wantCode: 401},
		{name: "unknown endpoint with token", method: "GET", path: "/v1/nothing", auth: "Bearer " + token, wantCode: 404},
		{name: "wrong method with token", method: "PUT", path: "/v1/plugins", auth: "Bearer " + token, wantCode: 405},
		{name: "metrics stay open", method: "GET", path: "/metrics", wantCode: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, plugins := newServer(t, token)
			r := do(t, srv, tt.method, tt.path, tt.auth)
			if r.code != tt.wantCode {
				t.Errorf("%s %s with Authorization %q = %d %s, want %d", tt.method, tt.path, tt.auth, r.code, r.body, tt.wantCode)
			}
			if tt.wantCode == http.StatusUnauthorized {
				if r.errorCode() != "unauthorized" {
					t.Errorf("401 body = %s, want error code unauthorized", r.body)
				}
				if got := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
					t.Errorf("401 WWW-Authenticate = %q, want a Bearer challenge", got)
				}
				if strings.Contains(r.body, token) {
					t.Errorf("401 body %s reveals the token", r.body)
				}
				if len(plugins.restarts()) != 0 {
					t.Errorf("unauthorised request restarted %v", plugins.restarts())
				}
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	srv, _ := newServer(t, "")
	r := do(t, srv, http.MethodGet, "/metrics", "")
	if r.code != http.StatusOK {
		t.Fatalf("GET /metrics = %d %s, want 200", r.code, r.body)
	}
	if !strings.Contains(r.body, "plughost_test_total 7") {
		t.Errorf("GET /metrics = %s, want plughost_test_total 7", r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET /metrics Content-Type = %q, want the text exposition format", ct)
	}
}

func TestFaults(t *testing.T) {
	const auth = "Bearer s3cret"
	post := func(t *testing.T, srv *httptest.Server, path, body string) response {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", auth)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return response{code: resp.StatusCode, header: resp.Header, body: string(b)}
	}

	t.Run("disabled", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		fp := &fakePlugins{statuses: statuses}
		h := admin.New(reg, fp, admin.Options{})
		t.Cleanup(h.Close)
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		r := do(t, srv, http.MethodDelete, "/v1/plugins/hello/faults", "")
		if r.code != http.StatusForbidden || r.errorCode() != "faults_disabled" {
			t.Errorf("DELETE faults with faults off = %d %s, want 403 faults_disabled", r.code, r.body)
		}
		// A well-formed body is refused; a malformed one is the client's
		// error whatever the debug setting.
		for _, tc := range []struct {
			body     string
			wantCode int
			wantErr  string
		}{
			{`{"faults":[{"point":"ledger.commit","delay":"2s"}]}`, http.StatusForbidden, "faults_disabled"},
			{`{"faults":[]}`, http.StatusForbidden, "faults_disabled"},
			{`{not json`, http.StatusBadRequest, "bad_request"},
			{`{"faults":[],"x":1}`, http.StatusBadRequest, "bad_request"},
			{`{"faults":[{"point":"p","delay":"soon"}]}`, http.StatusBadRequest, "bad_request"},
			{`{"faults":[{"point":"p"}]}`, http.StatusBadRequest, "bad_request"},
		} {
			r = post(t, srv, "/v1/plugins/hello/faults", tc.body)
			if r.code != tc.wantCode || r.errorCode() != tc.wantErr {
				t.Errorf("POST faults %s with faults off = %d %s, want %d %s", tc.body, r.code, r.body, tc.wantCode, tc.wantErr)
			}
		}
		fp.mu.Lock()
		defer fp.mu.Unlock()
		if fp.faults != nil {
			t.Errorf("faults reached the plugin set with fault injection off: %v", fp.faults)
		}
	})

	srv, plugins := newServer(t, "s3cret") // newServer enables faults when a token is set
	tests := []struct {
		name     string
		path     string
		body     string
		wantCode int
		wantErr  string
		wantSet  []admin.Fault
	}{
		{"set delay and error", "/v1/plugins/hello/faults", `{"faults":[{"point":"ledger.commit","delay":"2s","error":"disk stalled"}]}`,
			http.StatusOK, "", []admin.Fault{{Point: "ledger.commit", Delay: 2 * time.Second, Error: "disk stalled"}}},
		{"unknown plugin", "/v1/plugins/nope/faults", `{"faults":[]}`, http.StatusNotFound, "not_found", nil},
		{"unknown field", "/v1/plugins/hello/faults", `{"faults":[],"x":1}`, http.StatusBadRequest, "bad_request", nil},
		{"missing point", "/v1/plugins/hello/faults", `{"faults":[{"delay":"1s"}]}`, http.StatusBadRequest, "bad_request", nil},
		{"bad delay", "/v1/plugins/hello/faults", `{"faults":[{"point":"p","delay":"soon"}]}`, http.StatusBadRequest, "bad_request", nil},
		{"neither delay nor error", "/v1/plugins/hello/faults", `{"faults":[{"point":"p"}]}`, http.StatusBadRequest, "bad_request", nil},
		{"sub-millisecond delay", "/v1/plugins/hello/faults", `{"faults":[{"point":"p","delay":"500us"}]}`, http.StatusBadRequest, "bad_request", nil},
		{"point the plugin does not declare", "/v1/plugins/hello/faults", `{"faults":[{"point":"misspelt","delay":"1s"}]}`, http.StatusBadRequest, "unknown_fault_point", nil},
		// None of these may reach the plugin, which would clear its faults.
		{"null", "/v1/plugins/hello/faults", `null`, http.StatusBadRequest, "bad_request", nil},
		{"no faults field", "/v1/plugins/hello/faults", `{}`, http.StatusBadRequest, "bad_request", nil},
		{"faults null", "/v1/plugins/hello/faults", `{"faults":null}`, http.StatusBadRequest, "bad_request", nil},
		{"trailing garbage", "/v1/plugins/hello/faults", `{"faults":[]} garbage`, http.StatusBadRequest, "bad_request", nil},
		{"two bodies", "/v1/plugins/hello/faults", `{"faults":[]}{"faults":[]}`, http.StatusBadRequest, "bad_request", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, srv, tt.path, tt.body)
			if r.code != tt.wantCode || r.errorCode() != tt.wantErr {
				t.Fatalf("POST %s %s = %d %s, want %d %q", tt.path, tt.body, r.code, r.body, tt.wantCode, tt.wantErr)
			}
			if tt.wantSet != nil {
				plugins.mu.Lock()
				got := plugins.faults
				plugins.mu.Unlock()
				if diff := cmp.Diff(tt.wantSet, got); diff != "" {
					t.Errorf("faults passed to the plugin set (-want +got):\n%s", diff)
				}
				if !strings.Contains(r.body, `"delay":"2s"`) {
					t.Errorf("response %s, want the delay echoed as \"2s\"", r.body)
				}
			}
		})
	}
	plugins.mu.Lock()
	if len(plugins.faults) != 1 {
		t.Errorf("after refused bodies the plugin holds faults %v, want the one set first", plugins.faults)
	}
	plugins.mu.Unlock()
	if r := do(t, srv, http.MethodDelete, "/v1/plugins/hello/faults", auth); r.code != http.StatusOK {
		t.Fatalf("DELETE faults = %d %s, want 200", r.code, r.body)
	}
	plugins.mu.Lock()
	defer plugins.mu.Unlock()
	if len(plugins.faults) != 0 {
		t.Errorf("after DELETE the plugin set holds faults %v, want none", plugins.faults)
	}
}

// TestHostHeader pins which Host headers the listener answers: IP
// literals, localhost and the names in Options.Hosts; any other name
// could be one an attacker rebinds to the listener's address.
func TestHostHeader(t *testing.T) {
	h := admin.New(prometheus.NewRegistry(), &fakePlugins{statuses: statuses}, admin.Options{Hosts: []string{"Admin.Example"}})
	t.Cleanup(h.Close)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	tests := []struct {
		host string
		want int
	}{
		{"127.0.0.1:9090", http.StatusOK},
		{"[::1]:9090", http.StatusOK},
		{"[fe80::1%25eth0]:9090", http.StatusOK},
		{"10.1.2.3", http.StatusOK},
		{"localhost:9090", http.StatusOK},
		{"LocalHost", http.StatusOK},
		{"admin.example:9090", http.StatusOK},
		{"ADMIN.EXAMPLE", http.StatusOK},
		{"rebind.attacker.example:9090", http.StatusMisdirectedRequest},
		{"localhost.attacker.example", http.StatusMisdirectedRequest},
		{"127.0.0.1.attacker.example:9090", http.StatusMisdirectedRequest},
		{"sub.admin.example", http.StatusMisdirectedRequest},
		{"2130706433:9090", http.StatusMisdirectedRequest},
	}
	for _, tt := range tests {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/v1/plugins", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = tt.host
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("GET /v1/plugins with Host %q = %d, want %d", tt.host, resp.StatusCode, tt.want)
		}
	}
}

// TestNonCanonicalPaths: paths ServeMux would redirect to a clean form,
// in HTML, are the JSON 404 of any unknown path.
func TestNonCanonicalPaths(t *testing.T) {
	srv, plugins := newServer(t, "")
	for _, tt := range []struct{ method, path string }{
		{"GET", "/v1"},
		{"GET", "/v1/plugins/../%3Cimg"},
		{"GET", "/v1/./plugins"},
		{"GET", "//v1/plugins"},
		{"GET", "/v1/plugins/"},
		{"POST", "/v1/plugins/hello/../hello/restart"},
	} {
		r := do(t, srv, tt.method, tt.path, "")
		if r.code != http.StatusNotFound || r.errorCode() != "not_found" || r.header.Get("Location") != "" {
			t.Errorf("%s %s = %d %s (Location %q), want 404 not_found", tt.method, tt.path, r.code, r.body, r.header.Get("Location"))
		}
	}
	if got := plugins.restarts(); len(got) != 0 {
		t.Errorf("restarts = %q, want none", got)
	}
}

// TestSetToken: another token replaces the one in force; turning the
// token on or off, or setting the same one, does nothing.
func TestSetToken(t *testing.T) {
	open := admin.New(prometheus.NewRegistry(), &fakePlugins{statuses: statuses}, admin.Options{})
	t.Cleanup(open.Close)
	if open.SetToken("x") {
		t.Errorf("SetToken on a server without a token = true, want false: turning it on takes a restart")
	}
	s := admin.New(prometheus.NewRegistry(), &fakePlugins{statuses: statuses}, admin.Options{Token: "a"})
	t.Cleanup(s.Close)
	for _, tt := range []struct {
		token string
		want  bool
	}{{"", false}, {"a", false}, {"b", true}, {"b", false}} {
		if got := s.SetToken(tt.token); got != tt.want {
			t.Errorf("SetToken(%q) = %t, want %t", tt.token, got, tt.want)
		}
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	for token, want := range map[string]int{"a": http.StatusUnauthorized, "b": http.StatusOK} {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/plugins", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET /v1/plugins with token %q = %d, want %d", token, resp.StatusCode, want)
		}
	}
}
