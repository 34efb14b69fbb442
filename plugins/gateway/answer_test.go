package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// rawUpstream is a loopback upstream that writes answer(req, body) as it
// is, bytes the net/http server would never send, for each request on a
// connection, and closes the connection after an answer when answer says
// so. It counts the requests and the connections it accepted.
type rawUpstream struct {
	srv   *httptest.Server
	hits  atomic.Int64
	dials atomic.Int64
}

func newRawUpstream(t *testing.T, answer func(r *http.Request, body string) (raw string, closeAfter bool)) *rawUpstream {
	t.Helper()
	u := &rawUpstream{}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The first request's body is read before the hijack, which
		// would leave it unread in rw.
		b, _ := io.ReadAll(r.Body)
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		for {
			u.hits.Add(1)
			raw, closeAfter := answer(r, string(b))
			if _, err := rw.WriteString(raw); err != nil || rw.Flush() != nil || closeAfter {
				return
			}
			if r, err = http.ReadRequest(rw.Reader); err != nil {
				return
			}
			b, _ = io.ReadAll(r.Body)
		}
	}))
	u.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			u.dials.Add(1)
		}
	}
	u.srv.Start()
	t.Cleanup(u.srv.Close)
	return u
}

func (u *rawUpstream) url() string { return u.srv.URL }

// TestCutShortAnswer: an upstream that says Content-Length 10, sends 5
// bytes and closes is a failed call: 502 upstream_error, not a 200 of 5
// bytes; a GET is retried as for any failure, and the failures count
// toward the breaker.
func TestCutShortAnswer(t *testing.T) {
	up := newRawUpstream(t, func(*http.Request, string) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", true
	})
	h := start(t, optionsFor(flakyConfig(up.url(), `retry {
  max_tries = 2
  backoff   = "1ms"
}
breaker {
  failures  = 3
  cool_down = "1m"
}`)))
	rec := send(t, h, "POST", "/x", nil, []byte("{}"))
	if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), `"code":"upstream_error"`) {
		t.Fatalf("POST to an upstream that cuts its answer short = %d %q, want 502 upstream_error", rec.Code, rec.Body)
	}
	if got := up.hits.Load(); got != 1 {
		t.Errorf("the POST reached the upstream %d times, want 1", got)
	}
	if rec := send(t, h, "GET", "/x", nil, nil); rec.Code != http.StatusBadGateway {
		t.Errorf("GET to an upstream that cuts its answer short = %d %q, want 502", rec.Code, rec.Body)
	}
	if got := up.hits.Load(); got != 3 {
		t.Errorf("after the GET the upstream had %d requests, want 3: the GET tried twice", got)
	}
	rec = send(t, h, "GET", "/x", nil, nil)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "breaker: open") {
		t.Errorf("GET after three cut-short answers = %d %q, want 503 with the breaker open", rec.Code, rec.Body)
	}
	if got := metric(t, h, `gateway_tenant_requests_total{outcome="unavailable",tenant="default"}`); got != 3 {
		t.Errorf("unavailable outcomes = %v, want 3", got)
	}
}

// TestBytesAfterAnswer: bytes an upstream sends after an answer (a 204
// with a body) do not become the next request's answer, nor an upstream
// failure: the connection they came on is not reused.
func TestBytesAfterAnswer(t *testing.T) {
	up := newRawUpstream(t, func(r *http.Request, _ string) (string, bool) {
		if r.URL.Path == "/nocontent" {
			return "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello", false
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	h := start(t, optionsFor(flakyConfig(up.url(), "")))
	if rec := send(t, h, "POST", "/nocontent", nil, []byte("{}")); rec.Code != http.StatusNoContent {
		t.Fatalf("POST /nocontent = %d %q, want the upstream's 204", rec.Code, rec.Body)
	}
	if rec := send(t, h, "POST", "/x", nil, []byte("{}")); rec.Code != http.StatusOK || rec.Body.String() != "ok" {
		t.Errorf("POST after a 204 with a body = %d %q, want 200 ok", rec.Code, rec.Body)
	}
	if got := up.dials.Load(); got != 2 {
		t.Errorf("the upstream accepted %d connections, want 2: the 204's is not reused", got)
	}
}

// TestUpstreamConnectionHeader: the headers an upstream's Connection
// names are its own, dropped from its answer; the gateway's RateLimit
// fields stay whatever it names.
func TestUpstreamConnectionHeader(t *testing.T) {
	up := newRawUpstream(t, func(*http.Request, string) (string, bool) {
		return "HTTP/1.1 200 OK\r\nConnection: RateLimit, RateLimit-Policy, X-Hop\r\nX-Hop: 1\r\nContent-Length: 2\r\n\r\nok", false
	})
	h := start(t, optionsFor(flakyConfig(up.url(), "")))
	rec := send(t, h, "GET", "/x", nil, nil)
	if rec.Code != http.StatusOK || rec.Header().Get("RateLimit") == "" || rec.Header().Get("RateLimit-Policy") == "" {
		t.Errorf("GET = %d with headers %v, want 200 with the gateway's RateLimit and RateLimit-Policy", rec.Code, rec.Header())
	}
	if got := rec.Header().Get("X-Hop"); got != "" {
		t.Errorf("X-Hop = %q, want it dropped: the upstream's Connection names it", got)
	}
}

// TestUnaskedUpgrade: an upstream's 101 Switching Protocols, which the
// client never asked for since the gateway does not pass Upgrade on, is
// 502 upstream_error at once, not relayed.
func TestUnaskedUpgrade(t *testing.T) {
	up := newRawUpstream(t, func(*http.Request, string) (string, bool) {
		return "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n", false
	})
	h := start(t, plugintestOptions(flakyConfig(up.url(), ""), 5*time.Second))
	hdr := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"h2c"}}
	if rec := send(t, h, "POST", "/x", hdr, []byte("{}")); rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), `"code":"upstream_error"`) {
		t.Errorf("POST answered 101 by the upstream = %d %q, want 502 upstream_error", rec.Code, rec.Body)
	}
}

// TestHeadContentLength: the answer to HEAD keeps the upstream's
// Content-Length, the length of the GET's body, not that of the empty
// body the gateway writes.
func TestHeadContentLength(t *testing.T) {
	up := newRawUpstream(t, func(r *http.Request, _ string) (string, bool) {
		if r.Method == http.MethodHead {
			return "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 42\r\n\r\n", false
		}
		return "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok", false
	})
	h := start(t, optionsFor(flakyConfig(up.url(), "")))
	rec := send(t, h, "HEAD", "/x", nil, nil)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Length") != "42" || rec.Body.Len() != 0 {
		t.Errorf("HEAD = %d, Content-Length %q, %d body bytes; want 200 with the upstream's 42 and no body", rec.Code, rec.Header().Get("Content-Length"), rec.Body.Len())
	}
	if rec := send(t, h, "GET", "/x", nil, nil); rec.Code != http.StatusOK || rec.Body.String() != "ok" {
		t.Errorf("GET after the HEAD = %d %q, want 200 ok", rec.Code, rec.Body)
	}
}

// TestNoContentTypeInvented: an upstream's answer without Content-Type
// reaches the client without one, through the SDK's data plane and a
// net/http server, which sniffs a type for an answer that says nothing
// about it.
func TestNoContentTypeInvented(t *testing.T) {
	const page = "<!DOCTYPE html><html><body>hi</body></html>"
	up := newRawUpstream(t, func(*http.Request, string) (string, bool) {
		return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(page), page), false
	})
	front := httptest.NewServer(start(t, optionsFor(flakyConfig(up.url(), ""))))
	t.Cleanup(front.Close)
	req, err := http.NewRequestWithContext(t.Context(), "GET", front.URL+"/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if got, ok := resp.Header["Content-Type"]; resp.StatusCode != http.StatusOK || string(b) != page || ok {
		t.Errorf("GET = %d %q with Content-Type %q; want 200 with the page and no Content-Type", resp.StatusCode, b, got)
	}
}

// TestEventStreamRefused: an upstream's event stream, which the gateway
// cannot relay since it reads each answer whole, is 502 upstream_stream
// at once, not a 504 at the request's deadline; it is not retried, nor
// counted against the upstream.
func TestEventStreamRefused(t *testing.T) {
	up := newRawUpstream(t, func(*http.Request, string) (string, bool) {
		// The stream's first event, and no end.
		return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n", false
	})
	h := start(t, plugintestOptions(flakyConfig(up.url(), `breaker {
  failures  = 1
  cool_down = "1m"
}`), 30*time.Second))
	for range 2 {
		begin := time.Now()
		rec := send(t, h, "GET", "/events", nil, nil)
		if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), `"code":"upstream_stream"`) {
			t.Fatalf("GET /events = %d %q, want 502 upstream_stream", rec.Code, rec.Body)
		}
		if took := time.Since(begin); took > 5*time.Second {
			t.Errorf("GET /events took %v against a 30s deadline, want the 502 at once", took)
		}
	}
	if got := up.hits.Load(); got != 2 {
		t.Errorf("two GETs reached the upstream %d times, want 2: no retries, and no open breaker", got)
	}
}
