package plugintest_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
)

// TestHarnessRoutesAsTheHost checks that the harness answers as the host's
// ingress does, because it is the ingress: route timeouts over the default
// request timeout, 404 and 405 with the platform's JSON errors, path
// wildcards, the body cap, and a streaming route relayed as it flushes.
func TestHarnessRoutesAsTheHost(t *testing.T) {
	wait := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	mux := sdk.NewMux()
	mux.HandleFunc("GET /short", wait, sdk.Timeout(100*time.Millisecond))
	mux.HandleFunc("GET /default", wait)
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.PathValue("id")))
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		buf := make([]byte, 1024)
		for {
			n, err := r.Body.Read(buf)
			_, _ = w.Write(buf[:n])
			if err != nil {
				return
			}
		}
	})
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("data: 1\n\n"))
		w.(http.Flusher).Flush()
	}, sdk.Streaming())
	// A stream that never ends by itself: its route timeout ends it.
	mux.HandleFunc("GET /ticks", func(w http.ResponseWriter, r *http.Request) {
		for {
			_, _ = w.Write([]byte("data: tick\n\n"))
			w.(http.Flusher).Flush()
			select {
			case <-time.After(10 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	}, sdk.Streaming(), sdk.Timeout(200*time.Millisecond))
	h := plugintest.New(t, sdk.Plugin{Name: "routes", Version: "0.0.1", Routes: mux}, plugintest.Options{
		Limits: sdk.Limits{MaxBodyBytes: 4096, RequestTimeout: 600 * time.Millisecond},
	})

	tests := []struct {
		name, method, path, body string
		wantCode                 int
		wantErr                  string // the JSON error code, if any
		wantBody                 string
		atMost                   time.Duration
	}{
		{name: "route timeout", method: "GET", path: "/short", wantCode: http.StatusGatewayTimeout, wantErr: "timeout", atMost: 500 * time.Millisecond},
		{name: "default timeout", method: "GET", path: "/default", wantCode: http.StatusGatewayTimeout, wantErr: "timeout"},
		{name: "wildcard", method: "GET", path: "/items/42", wantCode: http.StatusOK, wantBody: "42"},
		{name: "unknown path", method: "GET", path: "/nope", wantCode: http.StatusNotFound, wantErr: "not_found"},
		{name: "wrong method", method: "DELETE", path: "/items/42", wantCode: http.StatusMethodNotAllowed, wantErr: "method_not_allowed"},
		{name: "body", method: "POST", path: "/echo", body: "hello", wantCode: http.StatusOK, wantBody: "hello"},
		{name: "body over the cap", method: "POST", path: "/echo", body: strings.Repeat("x", 4097), wantCode: http.StatusRequestEntityTooLarge, wantErr: "body_too_large"},
		{name: "stream", method: "GET", path: "/events", wantCode: http.StatusOK, wantBody: "data: 1\n\n"},
		{name: "stream ended by its timeout", method: "GET", path: "/ticks", wantCode: http.StatusOK, atMost: 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			start := time.Now()
			h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body)))
			took := time.Since(start)
			if rec.Code != tt.wantCode {
				t.Fatalf("%s %s = %d %s, want %d", tt.method, tt.path, rec.Code, rec.Body, tt.wantCode)
			}
			if tt.atMost > 0 && took > tt.atMost {
				t.Errorf("%s %s took %v, want the route's own timeout, not the default request timeout", tt.method, tt.path, took)
			}
			if tt.wantBody != "" && rec.Body.String() != tt.wantBody {
				t.Errorf("%s %s body = %q, want %q", tt.method, tt.path, rec.Body, tt.wantBody)
			}
			if tt.wantErr != "" {
				var e struct {
					Error struct{ Code string } `json:"error"`
				}
				if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Code != tt.wantErr {
					t.Errorf("%s %s body = %s, want the JSON error %q", tt.method, tt.path, rec.Body, tt.wantErr)
				}
			}
		})
	}
}

// unsized is a body whose length net/http does not know: it goes chunked.
type unsized struct{ io.Reader }

// TestHarnessNoBodyRoute checks that a route declared with sdk.NoBody
// refuses a request body with 413 before its handler runs, whether the
// body's length is declared or it comes chunked, and serves the request
// without one, while the plugin's other POST routes still take bodies.
func TestHarnessNoBodyRoute(t *testing.T) {
	var resets atomic.Int64
	mux := sdk.NewMux()
	mux.HandleFunc("POST /reset", func(w http.ResponseWriter, _ *http.Request) {
		resets.Add(1)
		_, _ = w.Write([]byte("reset"))
	}, sdk.NoBody())
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	})
	h := plugintest.New(t, sdk.Plugin{Name: "nobody", Version: "0.0.1", Routes: mux}, plugintest.Options{
		Limits: sdk.Limits{MaxBodyBytes: 4096, RequestTimeout: 5 * time.Second},
	})
	tests := []struct {
		name, path string
		body       io.Reader
		wantCode   int
		wantBody   string // a substring
	}{
		{"declared body", "/reset", strings.NewReader("x"), http.StatusRequestEntityTooLarge, `"body_too_large"`},
		{"chunked body", "/reset", unsized{strings.NewReader("x")}, http.StatusRequestEntityTooLarge, "POST /reset takes no body"},
		{"no body", "/reset", nil, http.StatusOK, "reset"},
		{"empty chunked body", "/reset", unsized{strings.NewReader("")}, http.StatusOK, "reset"},
		{"another route's body", "/echo", strings.NewReader("hello"), http.StatusOK, "hello"},
	}
	wantResets := int64(0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, tt.path, tt.body)
			if _, ok := tt.body.(unsized); ok {
				req.ContentLength = -1
			}
			h.ServeHTTP(rec, req)
			if rec.Code != tt.wantCode || !strings.Contains(rec.Body.String(), tt.wantBody) {
				t.Errorf("POST %s (%s) = %d %s, want %d with %q", tt.path, tt.name, rec.Code, rec.Body, tt.wantCode, tt.wantBody)
			}
			if tt.path == "/reset" && tt.wantCode == http.StatusOK {
				wantResets++
			}
			if got := resets.Load(); got != wantResets {
				t.Errorf("POST /reset handler ran %d times, want %d: a body refused never reaches it", got, wantResets)
			}
		})
	}
}
