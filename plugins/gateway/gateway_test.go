package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		// As in the wallet's tests: go-plugin's in-process Serve leaves
		// stdio copiers that end once the collector finalizes their pipes.
		runtime.GC()
		// The SDK's client of the host's Host service (Runtime.Host.Call,
		// through go-plugin's broker) is not closed when an in-process
		// harness stops; its gRPC serializers outlive the test. That is
		// the SDK's to fix, not the gateway's.
		if err := goleak.Find(goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: Errors on successful test run:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// start serves the gateway in-process with opts, and drains it when the
// test ends, before the harness stops, so that its workers and upstream
// connections do not outlive the test.
func start(t testing.TB, opts plugintest.Options) *plugintest.Harness {
	t.Helper()
	h := plugintest.New(t, definition(), opts)
	t.Cleanup(func() {
		if _, _, err := h.Drain(context.Background(), time.Now().Add(5*time.Second)); err != nil {
			t.Errorf("Drain = %v", err)
		}
	})
	return h
}

func sumHex(key string) string {
	s := sha(key)
	return hex.EncodeToString(s[:])
}

func sha(key string) [32]byte { return sha256.Sum256([]byte(key)) }

// newUpstreamServer serves h on loopback until the test ends and returns
// its URL.
func newUpstreamServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func optionsFor(config string) plugintest.Options { return plugintest.Options{Config: config} }

// plugintestOptions is optionsFor with the host's request_timeout.
func plugintestOptions(config string, timeout time.Duration) plugintest.Options {
	return plugintest.Options{Config: config, Limits: sdk.Limits{MaxBodyBytes: 1 << 20, RequestTimeout: timeout}}
}

// echo is an upstream that answers what it got, as JSON.
type echo struct {
	mu   sync.Mutex
	hits int
}

type echoed struct {
	Method  string      `json:"method"`
	Path    string      `json:"path"`
	Query   string      `json:"query"`
	Header  http.Header `json:"header"`
	Body    string      `json:"body"`
	Subject string      `json:"subject"`
}

func (e *echo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.hits++
	e.mu.Unlock()
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Upstream", "echo")
	_ = json.NewEncoder(w).Encode(echoed{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header, Body: string(b)})
}

func (e *echo) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hits
}

// send sends a request to the harness and returns the recorder.
func send(t *testing.T, h http.Handler, method, path string, hdr http.Header, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, bytes.NewReader(body)).WithContext(t.Context())
	for k, v := range hdr {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func decodeEcho(t *testing.T, rec *httptest.ResponseRecorder) echoed {
	t.Helper()
	var e echoed
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &e) != nil {
		t.Fatalf("answer = %d %s, want 200 with the echo", rec.Code, rec.Body)
	}
	return e
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// twoTenants is a config with tenants acme and the default in front of
// the url upstream "web" and the plugin upstream "wallet".
func twoTenants(url, extra string) string {
	return fmt.Sprintf(`
upstream "web" {
  url = %q
}
upstream "wallet" {
  plugin = "wallet"
}
route "/api/wallet/" {
  upstream     = "wallet"
  strip_prefix = true
}
route "/" {
  upstream = "web"
}
tenant "acme" {
  api_key_sha256 = %q
}
default_tenant {
  rate_per_s = 1000
  burst      = 1000
}
%s`, url, sumHex("acme-key"), extra)
}

func TestProxy(t *testing.T) {
	web, wallet := &echo{}, &echo{}
	srv := httptest.NewServer(web)
	t.Cleanup(srv.Close)
	h := start(t, plugintest.Options{
		Config:  twoTenants(srv.URL+"/base", ""),
		Plugins: map[string]http.Handler{"wallet": wallet},
	})
	acme := http.Header{"X-Api-Key": {"acme-key"}, "Idempotency-Key": {"k-1"}, "Content-Type": {"application/json"}}

	t.Run("url upstream", func(t *testing.T) {
		rec := send(t, h, "POST", "/items/7?x=1", acme, []byte(`{"a":1}`))
		e := decodeEcho(t, rec)
		if e.Path != "/base/items/7" || e.Query != "x=1" || e.Body != `{"a":1}` || e.Method != "POST" {
			t.Errorf("upstream got %s %s?%s %q, want POST /base/items/7?x=1 with the body", e.Method, e.Path, e.Query, e.Body)
		}
		if got := e.Header.Get("X-Gateway-Tenant"); got != "acme" {
			t.Errorf("X-Gateway-Tenant = %q, want acme", got)
		}
		if got := e.Header.Get("X-Api-Key"); got != "" {
			t.Errorf("the upstream got the tenant's X-Api-Key %q; the gateway must not pass it on", got)
		}
		if got := e.Header.Get("Idempotency-Key"); got != "k-1" {
			t.Errorf("Idempotency-Key = %q, want it passed through", got)
		}
		if got := rec.Header().Get("X-Upstream"); got != "echo" {
			t.Errorf("response header X-Upstream = %q, want the upstream's headers passed back", got)
		}
		if rec.Header().Get("RateLimit") == "" || rec.Header().Get("RateLimit-Policy") == "" {
			t.Errorf("response lacks RateLimit and RateLimit-Policy: %v", rec.Header())
		}
	})
	t.Run("plugin upstream with strip_prefix", func(t *testing.T) {
		e := decodeEcho(t, send(t, h, "POST", "/api/wallet/v1/transfer", acme, []byte(`{"amount":1}`)))
		if e.Path != "/v1/transfer" || e.Body != `{"amount":1}` || e.Header.Get("Idempotency-Key") != "k-1" {
			t.Errorf("wallet got %s %q key %q, want /v1/transfer with the body and the Idempotency-Key", e.Path, e.Body, e.Header.Get("Idempotency-Key"))
		}
	})
	t.Run("gzip body goes decoded", func(t *testing.T) {
		hdr := http.Header{"X-Api-Key": {"acme-key"}, "Content-Encoding": {"gzip"}}
		e := decodeEcho(t, send(t, h, "PUT", "/doc", hdr, gzipped(t, []byte("hello, gateway"))))
		if e.Body != "hello, gateway" || e.Header.Get("Content-Encoding") != "" {
			t.Errorf("upstream got %q with Content-Encoding %q, want the decoded body without it", e.Body, e.Header.Get("Content-Encoding"))
		}
	})
	t.Run("lookalikes with underscores are dropped", func(t *testing.T) {
		hdr := http.Header{"X-Api-Key": {"acme-key"}, "X_api_key": {"acme-key"}, "X_gateway_tenant": {"root"},
			"X_forwarded_for": {"10.0.0.1"}, "Transfer_encoding": {"chunked"}, "Content_encoding": {"gzip"}, "X_custom": {"kept"}}
		e := decodeEcho(t, send(t, h, "GET", "/x", hdr, nil))
		for _, name := range []string{"X_api_key", "X_gateway_tenant", "X_forwarded_for", "Transfer_encoding", "Content_encoding"} {
			if got, ok := e.Header[name]; ok {
				t.Errorf("the upstream got %s: %q; want it dropped, as the header it reads as", name, got)
			}
		}
		if got := e.Header.Get("X_custom"); got != "kept" {
			t.Errorf("X_custom = %q, want kept: only lookalikes of the gateway's headers go", got)
		}
		if got := e.Header["X-Gateway-Tenant"]; len(got) != 1 || got[0] != "acme" {
			t.Errorf("X-Gateway-Tenant = %q, want [acme]", got)
		}
	})
	t.Run("no key is the default tenant", func(t *testing.T) {
		e := decodeEcho(t, send(t, h, "GET", "/x", nil, nil))
		if got := e.Header.Get("X-Gateway-Tenant"); got != defaultTenantName {
			t.Errorf("X-Gateway-Tenant = %q, want %q", got, defaultTenantName)
		}
	})
}

func TestUnauthorized(t *testing.T) {
	web := &echo{}
	srv := httptest.NewServer(web)
	t.Cleanup(srv.Close)
	h := start(t, plugintest.Options{Config: fmt.Sprintf(`
upstream "web" {
  url = %q
}
route "/" {
  upstream = "web"
}
tenant "acme" {
  api_key_sha256 = %q
}
`, srv.URL, sumHex("acme-key"))})
	for _, keys := range [][]string{nil, {""}, {"wrong"}, {"acme-key", "acme-key"}, {strings.Repeat("k", maxKeyLen+1)}} {
		rec := send(t, h, "GET", "/x", http.Header{"X-Api-Key": keys}, nil)
		if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), `"code":"unauthorized"`) {
			t.Errorf("GET with X-Api-Key %q = %d %s, want 401 unauthorized", keys, rec.Code, rec.Body)
		}
	}
	if rec := send(t, h, "GET", "/x", http.Header{"X-Api-Key": {"acme-key"}}, nil); rec.Code != http.StatusOK {
		t.Errorf("GET with acme's key = %d %s, want 200", rec.Code, rec.Body)
	}
	if n := web.count(); n != 1 {
		t.Errorf("the upstream was called %d times, want once: a refused request is never sent", n)
	}
}

func TestGuardRefusesBeforeUpstream(t *testing.T) {
	web := &echo{}
	srv := httptest.NewServer(web)
	t.Cleanup(srv.Close)
	h := start(t, plugintest.Options{
		Config: twoTenants(srv.URL, `decode {
  abs_cap_bytes     = 4096
  ratio_after_bytes = 1024
}`),
		Limits: sdk.Limits{MaxBodyBytes: 1 << 20},
	})
	zeros := make([]byte, 1<<20)
	tests := []struct {
		name     string
		encoding string
		body     []byte
		code     int
		errCode  string
	}{
		{"ratio", "gzip", gzipped(t, zeros[:4000]), http.StatusRequestEntityTooLarge, reasonRatio},
		{"nested ratio", "gzip, gzip", gzipped(t, gzipped(t, zeros)), http.StatusRequestEntityTooLarge, reasonRatio},
		{"decoded size", "gzip", gzipped(t, noise(8000)), http.StatusRequestEntityTooLarge, reasonSize},
		{"plain size", "", noise(4097), http.StatusRequestEntityTooLarge, reasonBodySize},
		{"unknown encoding", "br", []byte("x"), http.StatusUnsupportedMediaType, "unsupported_encoding"},
		{"lying encoding", "gzip", []byte("not gzip at all"), http.StatusBadRequest, "bad_encoding"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hdr := http.Header{"X-Api-Key": {"acme-key"}}
			if tt.encoding != "" {
				hdr.Set("Content-Encoding", tt.encoding)
			}
			rec := send(t, h, "POST", "/upload", hdr, tt.body)
			if rec.Code != tt.code || !strings.Contains(rec.Body.String(), `"code":"`+tt.errCode+`"`) {
				t.Errorf("POST = %d %s, want %d %s", rec.Code, rec.Body, tt.code, tt.errCode)
			}
		})
	}
	if n := web.count(); n != 0 {
		t.Errorf("the upstream was called %d times; a refused body must never reach it", n)
	}
	m, err := h.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`rejected_total{reason="decoded-ratio"} 2`, `rejected_total{reason="decoded-size"} 1`, `rejected_total{reason="body-size"} 1`, `rejected_total{reason="unsupported-encoding"} 1`} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// noise is incompressible.
func noise(n int) []byte {
	b := make([]byte, n)
	x := uint32(7)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// TestConfigRefused: each refusal names the path of what it blames, so
// that the host points at it in the operator's file.
func TestConfigRefused(t *testing.T) {
	valid := func(extra string) string {
		return `
upstream "web" {
  url = "http://127.0.0.1:1"
}
` + extra
	}
	tenant := func(name, sum string) string {
		return fmt.Sprintf("tenant %q {\n  api_key_sha256 = %q\n}\n", name, sum)
	}
	tests := []struct {
		name   string
		config string
		attr   string // "" for a schema error before Configure
		msg    string
	}{
		{"unknown upstream", valid("route \"/a/\" {\n upstream = \"nope\"\n}"), `route["/a/"].upstream`, `upstream "nope" is not declared`},
		{"short key hash", valid(tenant("acme", "abc123")), `tenant["acme"].api_key_sha256`, "64 hex digits"},
		{"key hash not hex", valid(tenant("acme", strings.Repeat("zz", 32))), `tenant["acme"].api_key_sha256`, "64 hex digits"},
		{"duplicate key", valid(tenant("acme", sumHex("a")) + tenant("beta", sumHex("a"))), `tenant["beta"].api_key_sha256`, `also tenant "acme"`},
		{"reserved tenant name", valid(tenant("default", sumHex("a"))), `tenant["default"]`, "reserved"},
		{"empty tenant name", valid(tenant("", sumHex("a"))), `tenant[""]`, "must not be empty"},
		{"tenant burst", valid("tenant \"acme\" {\n api_key_sha256 = \"" + sumHex("a") + "\"\n burst = 0.5\n}"), `tenant["acme"].burst`, "whole number"},
		{"upstream with both", "upstream \"u\" {\n plugin = \"x\"\n url = \"http://a\"\n}", `upstream["u"]`, "exactly one"},
		{"upstream with neither", "upstream \"u\" {\n}", `upstream["u"]`, "exactly one"},
		{"empty upstream name", "upstream \"\" {\n url = \"http://a\"\n}", `upstream[""]`, "must not be empty"},
		{"empty plugin", "upstream \"u\" {\n plugin = \"\"\n}", `upstream["u"].plugin`, "must not be empty"},
		{"bad url", "upstream \"u\" {\n url = \"ftp://a\"\n}", `upstream["u"].url`, "http://"},
		{"prefix without slash", valid("route \"a\" {\n upstream = \"web\"\n}"), `route["a"]`, "start with /"},
		{"route cost", valid("route \"/\" {\n upstream = \"web\"\n cost = 0\n}"), `route["/"].cost`, "whole number from 1"},
		{"fractional workers", "workers = 1.5", "workers", "whole number"},
		{"negative reserved_workers", "reserved_workers = -1", "reserved_workers", "whole number from 0"},
		{"zero work_queue", "work_queue = 0", "work_queue", "whole number"},
		{"zero rate", "default_tenant {\n rate_per_s = 0\n}", "default_tenant.rate_per_s", "above 0"},
		{"ratio below 1", "decode {\n ratio_max = 0.5\n}", "decode.ratio_max", "from 1"},
		{"cap below backoff", "retry {\n backoff = \"1s\"\n cap = \"10ms\"\n}", "retry.cap", "from 1s"},
		{"failure rate", "breaker {\n failure_rate = 2\n}", "breaker.failure_rate", "at most 1"},
		{"unknown attribute", "wokers = 2", "", ""},
		{"tenant without hash", "tenant \"a\" {\n}", "", ""},
		{"bad duration", "retry {\n backoff = \"soon\"\n}", "", ""},
		{"duplicate upstream", valid("upstream \"web\" {\n plugin = \"x\"\n}"), "", ""},
		{"duplicate tenant", valid(tenant("acme", sumHex("a")) + tenant("acme", sumHex("b"))), "", ""},
		{"duplicate route", valid("route \"/\" {\n upstream = \"web\"\n}\nroute \"/\" {\n upstream = \"web\"\n}"), "", ""},
		{"name as an argument", "upstream {\n name = \"u\"\n url = \"http://a\"\n}", "", ""},
		{"prefix as an argument", valid("route {\n prefix = \"/\"\n upstream = \"web\"\n}"), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ce := plugintest.Refused(t, definition(), plugintest.Options{Config: tt.config}, tt.attr)
			if ce != nil && !strings.Contains(ce.Message, tt.msg) {
				t.Errorf("Start(%s) = %v, want a ConfigError saying %q", tt.config, ce, tt.msg)
			}
		})
	}
}

func TestEmptyConfigServes404(t *testing.T) {
	h := start(t, plugintest.Options{})
	rec := send(t, h, "GET", "/anything", nil, nil)
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), `"code":"not_found"`) {
		t.Fatalf("GET with no routes = %d %s, want 404 not_found", rec.Code, rec.Body)
	}
	if hl, err := h.Health(context.Background()); err != nil || hl.Status != sdk.StatusReady {
		t.Fatalf("Health = %v, %v; want ready", hl, err)
	}
}

func TestDotSegment(t *testing.T) {
	tests := []struct {
		path string // decoded, as r.URL.Path holds it
		want bool
	}{
		{"/echo/items/7", false},
		{"/v1.2/file.tar.gz", false},
		{"/a/...", false},
		{"/a/..b;c", false},
		{"/a%25b", false},
		{"/echo/../secret", true},
		{"/echo/./secret", true},
		{"/echo/..", true},
		{"/echo/..;/..;/secret", true},
		{"/echo/..;jsessionid=1/secret", true},
		{"/echo/.;/secret", true},
		{"/echo/..\\secret", true},
		{"/echo/a\\b", true},
		{"/echo/%2e%2e;/secret", true}, // %252e%252e; on the wire
		{"/echo/%2E%2E/secret", true},
		{"/echo/..%5csecret", true},
	}
	for _, tt := range tests {
		if got := dotSegment(tt.path); got != tt.want {
			t.Errorf("dotSegment(%q) = %v, want %v", tt.path, got, tt.want)
		}
	}
}

// TestDotSegmentRefused: a path whose segment an upstream would read as
// ".." is 400 bad_path, and never reaches the upstream.
func TestDotSegmentRefused(t *testing.T) {
	web := &echo{}
	h := start(t, optionsFor(twoTenants(newUpstreamServer(t, web)+"/base", "")))
	for _, target := range []string{"/echo/..;/..;/secret", "/echo/%2e%2e;/secret", "/echo/..%5c..%5csecret"} {
		rec := send(t, h, "GET", target, nil, nil)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `"code":"bad_path"`) {
			t.Errorf("GET %s = %d %q, want 400 bad_path", target, rec.Code, rec.Body)
		}
	}
	if n := web.count(); n != 0 {
		t.Errorf("the upstream got %d requests, want none", n)
	}
}

// TestRoutePrefixBoundary: a route prefix matches on a segment boundary,
// so that route "/s" with strip_prefix never turns /secret into /ecret,
// while a prefix written with a trailing '/' matches what starts with it.
func TestRoutePrefixBoundary(t *testing.T) {
	web := &echo{}
	url := newUpstreamServer(t, web)
	h := start(t, optionsFor(fmt.Sprintf(`
upstream "web" {
  url = %q
}
upstream "wallet" {
  url = %q
}
route "/s" {
  upstream     = "web"
  strip_prefix = true
}
route "/w/" {
  upstream     = "wallet"
  strip_prefix = true
}
default_tenant {
  rate_per_s = 1000
  burst      = 1000
}`, url+"/base", url+"/wallet")))
	tests := []struct {
		path string
		want string // the path upstream, "" for 404
	}{
		{"/s", "/base/"},
		{"/s/", "/base/"},
		{"/s/x", "/base/x"},
		{"/secret", ""},
		{"/s.json", ""},
		{"/w/v1/supply", "/wallet/v1/supply"},
		{"/wv1/supply", ""},
		{"/w", ""},
	}
	for _, tt := range tests {
		rec := send(t, h, "GET", tt.path, nil, nil)
		if tt.want == "" {
			if rec.Code != http.StatusNotFound {
				t.Errorf("GET %s = %d %s, want 404: no route prefix ends on a segment boundary there", tt.path, rec.Code, rec.Body)
			}
			continue
		}
		if e := decodeEcho(t, rec); e.Path != tt.want {
			t.Errorf("GET %s reached the upstream as %s, want %s", tt.path, e.Path, tt.want)
		}
	}
}

// TestConnectAndTraceRefused: CONNECT and TRACE are 405 with Allow, and
// never reach the upstream.
func TestConnectAndTraceRefused(t *testing.T) {
	web := &echo{}
	h := start(t, optionsFor(twoTenants(newUpstreamServer(t, web), "")))
	for _, method := range []string{http.MethodConnect, http.MethodTrace} {
		rec := send(t, h, method, "/x", nil, nil)
		if rec.Code != http.StatusMethodNotAllowed || !strings.Contains(rec.Body.String(), `"code":"method_not_allowed"`) || rec.Header().Get("Allow") != allowedMethods {
			t.Errorf("%s /x = %d %q, Allow %q; want 405 method_not_allowed with Allow %q", method, rec.Code, rec.Body, rec.Header().Get("Allow"), allowedMethods)
		}
	}
	if n := web.count(); n != 0 {
		t.Errorf("the upstream got %d requests, want none", n)
	}
}
