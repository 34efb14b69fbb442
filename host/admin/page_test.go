package admin_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/host/admin"
	"github.com/plughost/plughost/host/internal/testbin"
	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/host/supervisor"
)

const pageToken = "page-t0ken-7f3a"

// clock is a settable clock for admin.Options.Now.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

// page is an admin server for the status page's tests: the host's real
// metrics, a clock that moves only when told, and a log in a buffer.
type page struct {
	srv     *httptest.Server
	h       *admin.Server
	plugins *fakePlugins
	metrics *metrics.Host
	clock   *clock
	log     *testbin.SyncBuffer
}

func newPage(t *testing.T, token string, sts []supervisor.Status) *page {
	t.Helper()
	p := &page{
		plugins: &fakePlugins{statuses: sts},
		metrics: metrics.New(),
		clock:   &clock{},
		log:     &testbin.SyncBuffer{},
	}
	p.clock.ns.Store(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	p.h = admin.New(p.metrics.Registry, p.plugins, admin.Options{
		Token: token, Stats: p.metrics.Registry, Now: p.clock.now,
		SampleEvery: time.Hour, // the test takes the samples
		Logger:      hclog.New(&hclog.LoggerOptions{Output: p.log, Level: hclog.Trace}),
	})
	t.Cleanup(p.h.Close)
	p.srv = httptest.NewServer(p.h)
	t.Cleanup(p.srv.Close)
	return p
}

// send makes a request without following redirects; hdr may carry a
// cookie or an Origin.
func (p *page) send(t *testing.T, method, path string, form url.Values, hdr http.Header) response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(t.Context(), method, p.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	c := *p.srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

// login posts the token and returns the session's cookie header.
func (p *page) login(t *testing.T) http.Header {
	t.Helper()
	r := p.send(t, "POST", "/login", url.Values{"token": {pageToken}}, nil)
	if r.code != http.StatusSeeOther || r.header.Get("Location") != "/" {
		t.Fatalf("POST /login with the token = %d (Location %q), want 303 to /", r.code, r.header.Get("Location"))
	}
	return sessionCookie(t, r)
}

// sessionCookie checks the session cookie r sets and returns it as a
// request header.
func sessionCookie(t *testing.T, r response) http.Header {
	t.Helper()
	cookies, err := http.ParseSetCookie(r.header.Get("Set-Cookie"))
	if err != nil {
		t.Fatalf("Set-Cookie %q: %v", r.header.Get("Set-Cookie"), err)
	}
	if !cookies.HttpOnly || cookies.SameSite != http.SameSiteStrictMode || cookies.Value == "" || strings.Contains(cookies.Value, pageToken) {
		t.Errorf("session cookie = %+v, want HttpOnly, SameSite=Strict, a value that is not the token", cookies)
	}
	return http.Header{"Cookie": {cookies.Name + "=" + cookies.Value}}
}

func TestPageWithoutToken401(t *testing.T) {
	p := newPage(t, pageToken, statuses)
	for _, tt := range []struct {
		name   string
		method string
		path   string
		form   url.Values
		hdr    http.Header
	}{
		{"no session", "GET", "/", nil, nil},
		{"a wrong token in the query", "GET", "/?token=nope", nil, nil},
		{"a wrong token posted", "POST", "/login", url.Values{"token": {"nope"}}, nil},
		{"a made-up session", "GET", "/", nil, http.Header{"Cookie": {"plughost_admin=forged"}}},
		{"the token as a bearer header", "GET", "/", nil, http.Header{"Authorization": {"Bearer " + pageToken}}},
		{"a restart button", "POST", "/plugins/hello/restart", url.Values{}, nil},
		{"an upgrade button", "POST", "/plugins/hello/upgrade", url.Values{}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := p.send(t, tt.method, tt.path, tt.form, tt.hdr)
			if r.code != http.StatusUnauthorized {
				t.Errorf("%s %s = %d, want 401", tt.method, tt.path, r.code)
			}
			for _, name := range []string{"hello", "broken", "4242", "/hello"} {
				if strings.Contains(r.body, name) {
					t.Errorf("%s %s answered 401 with %q in its body:\n%s", tt.method, tt.path, name, r.body)
				}
			}
			if !strings.Contains(r.body, `name="token"`) {
				t.Errorf("%s %s body has no login form:\n%s", tt.method, tt.path, r.body)
			}
			if r.header.Get("Set-Cookie") != "" {
				t.Errorf("%s %s set a cookie: %q", tt.method, tt.path, r.header.Get("Set-Cookie"))
			}
		})
	}
	if got := p.plugins.restarts(); len(got) != 0 {
		t.Errorf("restarts after buttons pressed without a session = %q, want none", got)
	}
	r := p.send(t, "GET", "/v1/status", nil, nil)
	if r.code != http.StatusUnauthorized || strings.Contains(r.body, "hello") {
		t.Errorf("GET /v1/status without the token = %d %s, want 401 naming no plugin", r.code, r.body)
	}
}

func TestPageLogin(t *testing.T) {
	p := newPage(t, pageToken, statuses)

	// The query token is traded for a cookie, and the redirect drops it
	// from the address the browser keeps.
	r := p.send(t, "GET", "/?token="+pageToken, nil, nil)
	if r.code != http.StatusSeeOther || r.header.Get("Location") != "/" {
		t.Fatalf("GET /?token= = %d (Location %q), want 303 to /", r.code, r.header.Get("Location"))
	}
	for name, hdr := range map[string]http.Header{"query": sessionCookie(t, r), "form": p.login(t)} {
		r := p.send(t, "GET", "/", nil, hdr)
		if r.code != http.StatusOK {
			t.Fatalf("GET / with the %s login's cookie = %d, want 200:\n%s", name, r.code, r.body)
		}
		for _, want := range []string{`data-plugin="hello"`, `data-plugin="broken"`, "4242", "degraded", "start: plugin exited", `http-equiv="refresh"`} {
			if !strings.Contains(r.body, want) {
				t.Errorf("GET / with the %s login's cookie has no %q:\n%s", name, want, r.body)
			}
		}
		if strings.Contains(r.body, pageToken) {
			t.Errorf("the page shows the token:\n%s", r.body)
		}
		for k, want := range map[string]string{"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"} {
			if got := r.header.Get(k); got != want {
				t.Errorf("GET / %s = %q, want %q", k, got, want)
			}
		}
	}

	hdr := p.login(t)
	if r := p.send(t, "POST", "/logout", url.Values{}, hdr); r.code != http.StatusSeeOther {
		t.Fatalf("POST /logout = %d, want 303", r.code)
	}
	if r := p.send(t, "GET", "/", nil, hdr); r.code != http.StatusUnauthorized {
		t.Errorf("GET / with a logged-out session = %d, want 401", r.code)
	}
}

// TestPageButtons: a button posts a form that asks for the action as the
// API does; a post a browser marks as cross-origin is refused, however
// good its session.
func TestPageButtons(t *testing.T) {
	p := newPage(t, pageToken, statuses)
	hdr := p.login(t)
	with := func(k, v string) http.Header {
		h := hdr.Clone()
		h.Set(k, v)
		return h
	}
	for _, tt := range []struct {
		name string
		path string
		hdr  http.Header
	}{
		{"Sec-Fetch-Site cross-site", "/plugins/hello/restart", with("Sec-Fetch-Site", "cross-site")},
		{"Sec-Fetch-Site same-site", "/plugins/hello/restart", with("Sec-Fetch-Site", "same-site")},
		{"an Origin of another host", "/plugins/hello/upgrade", with("Origin", "http://evil.example")},
		{"a login from another origin", "/login", with("Sec-Fetch-Site", "cross-site")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := p.send(t, "POST", tt.path, url.Values{"token": {pageToken}}, tt.hdr)
			if r.code != http.StatusForbidden || r.errorCode() != "cross_origin" {
				t.Errorf("POST %s with %s = %d %s, want 403 cross_origin", tt.path, tt.name, r.code, r.body)
			}
		})
	}
	if got := p.plugins.restarts(); len(got) != 0 {
		t.Fatalf("restarts after cross-origin posts = %q, want none", got)
	}

	r := p.send(t, "POST", "/plugins/hello/restart", url.Values{}, with("Sec-Fetch-Site", "same-origin"))
	if r.code != http.StatusSeeOther || r.header.Get("Location") != "/" {
		t.Fatalf("POST /plugins/hello/restart = %d %s, want 303 to /", r.code, r.body)
	}
	r = p.send(t, "POST", "/plugins/broken/upgrade", url.Values{}, with("Origin", p.srv.URL))
	if r.code != http.StatusSeeOther {
		t.Fatalf("POST /plugins/broken/upgrade = %d %s, want 303", r.code, r.body)
	}
	if got, want := p.plugins.restarts(), []string{"hello"}; !slices.Equal(got, want) {
		t.Errorf("restarts = %q, want %q", got, want)
	}
	// The page shows the outcome of the last button once.
	page := p.send(t, "GET", "/", nil, hdr).body
	if !strings.Contains(page, "broken: upgrade refused: plugin binary does not match its sha256 pin") {
		t.Errorf("the page after a refused upgrade does not say why:\n%s", page)
	}
	if page := p.send(t, "GET", "/", nil, hdr).body; strings.Contains(page, "refused") {
		t.Errorf("the page shows the outcome again on the next load:\n%s", page)
	}
}

// TestPageEscapes: what a plugin controls (its last error, its health
// reason, its version) is shown as text, never as markup.
func TestPageEscapes(t *testing.T) {
	const hostile = `<script>alert("x")</script><img src=x onerror=alert(1)>`
	sts := []supervisor.Status{{Name: "hello", State: supervisor.StateReady, Health: "degraded",
		HealthReason: hostile, Pid: 7, Version: hostile, LastError: hostile, Mount: "/hello"}}
	p := newPage(t, "", sts)
	r := p.send(t, "GET", "/", nil, nil)
	if r.code != http.StatusOK {
		t.Fatalf("GET / with no token configured = %d, want 200", r.code)
	}
	for _, bad := range []string{"<script>", "<img", `"x")</script>`} {
		if strings.Contains(r.body, bad) {
			t.Errorf("GET / carries %q unescaped:\n%s", bad, r.body)
		}
	}
	if n := strings.Count(r.body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"); n != 3 {
		t.Errorf("GET / shows the hostile text escaped %d times, want 3 (last error, reason, version):\n%s", n, r.body)
	}
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy = %q, want default-src 'none': the page runs no script", csp)
	}
}

// TestStatusJSON: GET /v1/status is the page's data; its rates come from
// the host's own metrics sampled over the last minute.
func TestStatusJSON(t *testing.T) {
	p := newPage(t, pageToken, statuses)
	auth := http.Header{"Authorization": {"Bearer " + pageToken}}
	get := func() map[string]any {
		t.Helper()
		r := p.send(t, "GET", "/v1/status", nil, auth)
		if r.code != http.StatusOK || r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("GET /v1/status = %d (%s) %s, want 200 JSON", r.code, r.header.Get("Content-Type"), r.body)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(r.body), &v); err != nil {
			t.Fatalf("decode %s: %v", r.body, err)
		}
		return v
	}
	plugin := func(v map[string]any, name string) map[string]any {
		for _, p := range v["plugins"].([]any) {
			if p := p.(map[string]any); p["name"] == name {
				return p
			}
		}
		t.Fatalf("no plugin %q in %v", name, v)
		return nil
	}

	// One sample, taken by New at the clock's time: no rates yet.
	v := get()
	if v["window_seconds"] != 0.0 || plugin(v, "hello")["request_rate"] != nil {
		t.Errorf("GET /v1/status with one sample = %v, want window_seconds 0 and null rates", v)
	}
	for _, k := range []string{"name", "state", "health", "health_reason", "pid", "started", "restarts", "restarts_in_window", "version",
		"last_error", "uptime_seconds", "inflight", "queued", "request_rate", "error_rate", "p99_seconds"} {
		if _, ok := plugin(v, "hello")[k]; !ok && k != "health_reason" && k != "started" {
			t.Errorf("hello in GET /v1/status has no %q: %v", k, plugin(v, "hello"))
		}
	}

	// 30s on: 100 requests, 5 of them 503, 99 in 2.5–5ms and one of 2s;
	// one in flight, two held.
	p.clock.add(30 * time.Second)
	m := p.metrics
	m.Requests.WithLabelValues("hello", "200").Add(90)
	m.Requests.WithLabelValues("hello", "404").Add(5)
	m.Requests.WithLabelValues("hello", "503").Add(5)
	for range 99 {
		m.RequestDuration.WithLabelValues("hello").Observe(0.003)
	}
	m.RequestDuration.WithLabelValues("hello").Observe(2)
	m.Inflight.WithLabelValues("hello").Set(1)
	m.HeldRequests.WithLabelValues("hello").Set(2)
	v = get()
	h := plugin(v, "hello")
	want := map[string]any{"request_rate": 100 / 30.0, "error_rate": 5 / 30.0, "p99_seconds": 0.005, "inflight": 1.0, "queued": 2.0}
	for k, w := range want {
		if got, ok := h[k].(float64); !ok || !near(got, w.(float64)) {
			t.Errorf("hello's %s = %v, want %v", k, h[k], w)
		}
	}
	if v["window_seconds"] != 30.0 {
		t.Errorf("window_seconds = %v, want 30", v["window_seconds"])
	}
	if b := plugin(v, "broken"); b["request_rate"] != 0.0 || b["p99_seconds"] != nil {
		t.Errorf("broken, with no requests: request_rate %v, p99 %v, want 0 and null", b["request_rate"], b["p99_seconds"])
	}

	// 90s after the first sample, it has left the window: the rates are
	// over the minute since a sample taken at 30s.
	admin.Sample(p.h)
	p.clock.add(60 * time.Second)
	m.Requests.WithLabelValues("hello", "200").Add(60)
	v = get()
	if h := plugin(v, "hello"); v["window_seconds"] != 60.0 || !near(h["request_rate"].(float64), 1) || h["p99_seconds"] != nil {
		t.Errorf("a minute on: window %v, hello's request_rate %v, p99 %v; want the first sample left out: 60s, 1/s, null", v["window_seconds"], h["request_rate"], h["p99_seconds"])
	}
	// No sample within the last minute: no rates, not rates over hours.
	p.clock.add(time.Hour)
	if v := get(); v["window_seconds"] != 0.0 || plugin(v, "hello")["request_rate"] != nil {
		t.Errorf("an hour after the last sample: %v, want no rates", v)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// TestTokenNeverLogged: logins, refused logins and the buttons are
// logged, the token never, however it was sent.
func TestTokenNeverLogged(t *testing.T) {
	p := newPage(t, pageToken, statuses)
	p.send(t, "GET", "/?token="+pageToken, nil, nil)
	p.send(t, "GET", "/?token="+pageToken+"x", nil, nil)
	p.send(t, "POST", "/login", url.Values{"token": {pageToken + "y"}}, nil)
	hdr := p.login(t)
	p.send(t, "POST", "/plugins/hello/restart", url.Values{"token": {pageToken}}, hdr)
	p.send(t, "POST", "/plugins/hello/restart", url.Values{}, http.Header{"Cookie": hdr["Cookie"], "Sec-Fetch-Site": {"cross-site"}})
	p.send(t, "GET", "/v1/status", nil, http.Header{"Authorization": {"Bearer " + pageToken}})
	log := p.log.String()
	for _, want := range []string{"status page login:", "status page login refused", "operator action from the status page", "post from another origin refused"} {
		if !strings.Contains(log, want) {
			t.Errorf("log has no %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, pageToken) {
		t.Errorf("log shows the admin token:\n%s", log)
	}
	if strings.Contains(log, strings.TrimPrefix(hdr.Get("Cookie"), "plughost_admin=")) {
		t.Errorf("log shows a session cookie:\n%s", log)
	}
}

// TestPageButtonsWithoutToken: without a token there is no login, and
// the page still shows a button's outcome once, as it does with one.
func TestPageButtonsWithoutToken(t *testing.T) {
	p := newPage(t, "", statuses)
	same := http.Header{"Sec-Fetch-Site": {"same-origin"}}
	r := p.send(t, "POST", "/plugins/broken/upgrade", url.Values{}, same)
	if r.code != http.StatusSeeOther || r.header.Get("Location") != "/" {
		t.Fatalf("POST /plugins/broken/upgrade = %d %s, want 303 to /", r.code, r.body)
	}
	hdr := sessionCookie(t, r)
	hdr.Set("Sec-Fetch-Site", "same-origin")
	const refused = "broken: upgrade refused: plugin binary does not match its sha256 pin"
	if page := p.send(t, "GET", "/", nil, hdr).body; !strings.Contains(page, refused) {
		t.Errorf("the page after a refused upgrade does not say why:\n%s", page)
	}
	if page := p.send(t, "GET", "/", nil, hdr).body; strings.Contains(page, "refused") {
		t.Errorf("the page shows the outcome again on the next load:\n%s", page)
	}
	// The next button reuses the browser's session.
	r = p.send(t, "POST", "/plugins/hello/restart", url.Values{}, hdr)
	if r.code != http.StatusSeeOther || r.header.Get("Set-Cookie") != "" {
		t.Errorf("POST /plugins/hello/restart with a session = %d, Set-Cookie %q; want 303 and no new cookie", r.code, r.header.Get("Set-Cookie"))
	}
	if page := p.send(t, "GET", "/", nil, hdr).body; !strings.Contains(page, "hello: restart asked for.") {
		t.Errorf("the page after a restart does not say so:\n%s", page)
	}
}

// TestRatesAcrossReset: a reload that removes a plugin and adds it back
// starts its series from zero. Once the new counters have climbed past
// the old ones, the first and last samples of the window alone look
// continuous; the rates must still count from the reset, as
// Prometheus's rate() does, for the requests and the p99 alike.
func TestRatesAcrossReset(t *testing.T) {
	p := newPage(t, "", statuses)
	m := p.metrics
	observe := func(n int, secs float64) {
		m.Requests.WithLabelValues("hello", "200").Add(float64(n))
		for range n {
			m.RequestDuration.WithLabelValues("hello").Observe(secs)
		}
	}
	// The sample New took leaves the window; the next ones cover 50s.
	p.clock.add(40 * time.Second)
	observe(100, 2)
	admin.Sample(p.h) // 100 slow requests
	p.clock.add(10 * time.Second)
	m.Forget("hello") // a reload removes hello
	admin.Sample(p.h)
	p.clock.add(40 * time.Second)
	observe(150, 0.003) // hello is back, and 150 fast requests later
	r := p.send(t, "GET", "/v1/status", nil, nil)
	var v admin.Overview
	if err := json.Unmarshal([]byte(r.body), &v); err != nil {
		t.Fatalf("GET /v1/status = %d %s: %v", r.code, r.body, err)
	}
	if v.WindowSeconds != 50 {
		t.Fatalf("window_seconds = %v, want 50", v.WindowSeconds)
	}
	for _, pl := range v.Plugins {
		if pl.Name != "hello" {
			continue
		}
		if pl.RequestRate == nil || !near(*pl.RequestRate, 150/50.0) {
			t.Errorf("hello's request_rate = %v, want %v: 150 requests since the reset in 50s", deref(pl.RequestRate), 150/50.0)
		}
		// 150 requests in the 2.5–5ms bucket: the 148.5th of them.
		if want := 0.0025 + 0.0025*148.5/150; pl.P99Seconds == nil || !near(*pl.P99Seconds, want) {
			t.Errorf("hello's p99_seconds = %v, want %v", deref(pl.P99Seconds), want)
		}
		return
	}
	t.Fatalf("no hello in %s", r.body)
}

func deref(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}

// TestNoStoreNoSniff: no answer of the admin listener may be cached,
// the 303 that sets a session's cookie least of all, and none may be
// sniffed as another type.
func TestNoStoreNoSniff(t *testing.T) {
	p := newPage(t, pageToken, statuses)
	auth := http.Header{"Authorization": {"Bearer " + pageToken}}
	for _, tt := range []struct {
		method, path string
		hdr          http.Header
		want         int
	}{
		{"GET", "/v1/plugins", auth, http.StatusOK},
		{"GET", "/v1/status", auth, http.StatusOK},
		{"GET", "/v1/plugins", nil, http.StatusUnauthorized},
		{"GET", "/v1/nothing", auth, http.StatusNotFound},
		{"GET", "/nothing", nil, http.StatusNotFound},
		{"POST", "/v1/plugins/hello/restart", auth, http.StatusAccepted},
		{"GET", "/?token=" + pageToken, nil, http.StatusSeeOther},
		{"GET", "/", nil, http.StatusUnauthorized},
		{"GET", "/metrics", nil, http.StatusOK},
	} {
		r := p.send(t, tt.method, tt.path, nil, tt.hdr)
		if r.code != tt.want {
			t.Errorf("%s %s = %d, want %d", tt.method, tt.path, r.code, tt.want)
		}
		if got := r.header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("%s %s: Cache-Control %q, want no-store", tt.method, tt.path, got)
		}
		if got := r.header.Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s %s: X-Content-Type-Options %q, want nosniff", tt.method, tt.path, got)
		}
	}
}
