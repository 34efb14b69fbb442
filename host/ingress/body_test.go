package ingress_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plughost/plughost/host/ingress"
)

// dialRaw opens a connection to the fixture's server, closed when the
// test ends.
func (f *fixture) dialRaw(t *testing.T) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", f.srv.Listener.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// readResponse reads one answer from conn.
func readResponse(t *testing.T, conn net.Conn) response {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer's body: %v", err)
	}
	return response{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

func TestNoBodyOnGet(t *testing.T) {
	f := newFixture(t, defaultLimits, hello())
	tests := []struct {
		method string
		body   io.Reader
	}{
		{http.MethodGet, strings.NewReader("x")},
		{http.MethodGet, chunked{strings.NewReader("x")}},
		{http.MethodHead, strings.NewReader("x")},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %T", tt.method, tt.body), func(t *testing.T) {
			r := f.request(t, tt.method, "/hello/", tt.body)
			if r.code != http.StatusRequestEntityTooLarge {
				t.Errorf("%s /hello/ with a body = %d %s, want 413", tt.method, r.code, r.body)
			}
			if tt.method == http.MethodGet && r.errorCode() != "body_too_large" {
				t.Errorf("%s /hello/ with a body: error code = %q, want body_too_large", tt.method, r.errorCode())
			}
		})
	}
	if r := f.get(t, "/hello/"); r.code != http.StatusOK {
		t.Errorf("GET /hello/ without a body = %d %s, want 200", r.code, r.body)
	}
	if r := f.request(t, http.MethodGet, "/hello/", chunked{strings.NewReader("")}); r.code != http.StatusOK {
		t.Errorf("GET /hello/ with an empty chunked body = %d %s, want 200", r.code, r.body)
	}
}

// TestSlowBody checks that a body still arriving holds no in-flight slot,
// and gets 408 at body_timeout.
func TestSlowBody(t *testing.T) {
	const bodyTimeout = time.Second
	fs := faulty()
	fs.maxInflight = 1
	f := newFixture(t, ingress.Limits{MaxBodyBytes: 1 << 20, RequestTimeout: 30 * time.Second, BodyTimeout: bodyTimeout}, fs)

	conn := f.dialRaw(t)
	start := time.Now()
	if _, err := fmt.Fprintf(conn, "POST /faulty/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nslow"); err != nil {
		t.Fatal(err)
	}
	// The slot is free while the slow body arrives: the only one there is.
	for range 3 {
		if r := f.request(t, http.MethodPost, "/faulty/echo", strings.NewReader("ping")); r.code != http.StatusOK || r.body != "ping" {
			t.Errorf("POST /faulty/echo while a slow body arrives = %d %q, want 200 ping", r.code, r.body)
		}
	}
	r := readResponse(t, conn)
	took := time.Since(start)
	if r.code != http.StatusRequestTimeout || r.errorCode() != "body_timeout" {
		t.Errorf("slow POST /faulty/echo = %d %s, want 408 body_timeout", r.code, r.body)
	}
	if took < bodyTimeout || took > bodyTimeout+5*time.Second {
		t.Errorf("slow POST /faulty/echo answered after %v, want about body_timeout (%v)", took, bodyTimeout)
	}
	if got := testutil.ToFloat64(f.m.BusyRejections.WithLabelValues("faulty")); got != 0 {
		t.Errorf("plughost_busy_rejections_total{plugin=faulty} = %v, want 0", got)
	}
}

// TestBodyBudget checks that bodies still arriving are bounded by
// max_inflight × max_body_bytes per plugin, the figure docs/config.md
// states.
func TestBodyBudget(t *testing.T) {
	const maxBody = 16 << 10
	fs := faulty()
	fs.maxInflight = 1 // the budget: 1 × 16 KiB
	f := newFixture(t, ingress.Limits{MaxBodyBytes: maxBody, RequestTimeout: 30 * time.Second, BodyTimeout: 30 * time.Second}, fs)

	// A body that has sent more than half its declared length holds a
	// buffer of the whole of it: the whole budget.
	conn := f.dialRaw(t)
	if _, err := fmt.Fprintf(conn, "POST /faulty/echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", maxBody, bytes.Repeat([]byte("a"), maxBody/2+1)); err != nil {
		t.Fatal(err)
	}
	var r response
	waitFor(t, 30*time.Second, "a second body to find the budget spent", func() bool {
		r = f.request(t, http.MethodPost, "/faulty/echo", strings.NewReader(strings.Repeat("b", 5000)))
		return r.code == http.StatusTooManyRequests
	})
	if r.errorCode() != "busy" || !strings.Contains(r.body, fmt.Sprint(maxBody)) || r.header.Get("Retry-After") == "" {
		t.Errorf("POST /faulty/echo with the body budget spent = %d %s (Retry-After %q), want 429 busy naming %d bytes with Retry-After",
			r.code, r.body, r.header.Get("Retry-After"), maxBody)
	}
	// The rest of the slow body arrives: it is answered, and frees the
	// budget.
	if _, err := conn.Write(bytes.Repeat([]byte("a"), maxBody/2-1)); err != nil {
		t.Fatal(err)
	}
	if r := readResponse(t, conn); r.code != http.StatusOK || len(r.body) != maxBody {
		t.Errorf("the slow POST /faulty/echo = %d with %d bytes, want 200 with %d", r.code, len(r.body), maxBody)
	}
	// The handler gives the budget back when it returns, a moment after
	// the client has read its answer.
	waitFor(t, 10*time.Second, "POST /faulty/echo to be served once the budget is free", func() bool {
		return f.request(t, http.MethodPost, "/faulty/echo", strings.NewReader(strings.Repeat("b", 5000))).code == http.StatusOK
	})
}

// TestLingeringClose checks that a client that sends a body over the cap
// reads the 413, whether it reads while it sends (net/http's client) or
// only once it has sent everything (the raw socket).
func TestLingeringClose(t *testing.T) {
	const limit = 1 << 20
	f := newFixture(t, ingress.Limits{MaxBodyBytes: limit, RequestTimeout: 30 * time.Second, BodyTimeout: 30 * time.Second}, faulty())
	big := bytes.Repeat([]byte("z"), 8<<20)
	tests := []struct {
		name, path string
		chunked    bool
		want       int
		wantErr    string
	}{
		{name: "declared length over the cap", path: "/faulty/echo", want: 413, wantErr: "body_too_large"},
		{name: "chunked over the cap", path: "/faulty/echo", chunked: true, want: 413, wantErr: "body_too_large"},
		{name: "no such route", path: "/faulty/nope", want: 404, wantErr: "not_found"},
		{name: "no such mount", path: "/nope", want: 404, wantErr: "not_found"},
	}
	for _, tt := range tests {
		t.Run("raw/"+tt.name, func(t *testing.T) {
			conn := f.dialRaw(t)
			var req bytes.Buffer
			fmt.Fprintf(&req, "POST %s HTTP/1.1\r\nHost: x\r\n", tt.path)
			if tt.chunked {
				fmt.Fprintf(&req, "Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(big), big)
			} else {
				fmt.Fprintf(&req, "Content-Length: %d\r\n\r\n%s", len(big), big)
			}
			if _, err := conn.Write(req.Bytes()); err != nil {
				t.Fatalf("send %d bytes before reading: %v", req.Len(), err)
			}
			if r := readResponse(t, conn); r.code != tt.want || r.errorCode() != tt.wantErr {
				t.Errorf("POST %s with 8 MiB, read after sending = %d %s, want %d %s", tt.path, r.code, r.body, tt.want, tt.wantErr)
			}
		})
		t.Run("net/http/"+tt.name, func(t *testing.T) {
			var body io.Reader = bytes.NewReader(big)
			if tt.chunked {
				body = chunked{body}
			}
			r := f.request(t, http.MethodPost, tt.path, body)
			if r.code != tt.want || r.errorCode() != tt.wantErr {
				t.Errorf("POST %s with 8 MiB = %d %s, want %d %s", tt.path, r.code, r.body, tt.want, tt.wantErr)
			}
		})
	}
}

// TestEarlyAnswerToASlowBody checks that an answer the ingress gives
// before reading a body (a route the plugin lacks, a malformed request, no
// plugin at the path) reaches a client that sends its body slowly at once,
// not after the client's read deadline: net/http would first try to read
// up to 256 KiB of the body.
func TestEarlyAnswerToASlowBody(t *testing.T) {
	f := newFixture(t, ingress.Limits{MaxBodyBytes: 1 << 20, RequestTimeout: 30 * time.Second, BodyTimeout: 30 * time.Second}, hello())
	for _, tt := range []struct {
		name, target string
		want         int
	}{
		{"no such route", "/hello/nope", http.StatusNotFound},
		{"no plugin at the path", "/nobody", http.StatusNotFound},
		{"wrong method", "/hello/sleep", http.StatusMethodNotAllowed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn := f.dialRaw(t)
			if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789", tt.target); err != nil {
				t.Fatal(err)
			}
			// The other 990 bytes never come.
			start := time.Now()
			if err := conn.SetReadDeadline(start.Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			r := readResponse(t, conn)
			if r.code != tt.want {
				t.Errorf("POST %s with a body still arriving = %d %s, want %d", tt.target, r.code, r.body, tt.want)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("the answer took %v, want it at once", took)
			}
		})
	}
}
