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

// dialFrom opens a connection to the fixture's server from the loopback
// address local (Linux routes all of 127/8 to lo), closed when the test
// ends.
func (f *fixture) dialFrom(t *testing.T, local string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	conn, err := d.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// postFrom sends POST path with body from the loopback address local
// and reads the answer.
func (f *fixture) postFrom(t *testing.T, local, path string, body []byte) response {
	t.Helper()
	conn := f.dialFrom(t, local)
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body); err != nil {
		t.Fatal(err)
	}
	return readResponse(t, conn)
}

// startSlowBody sends the head of POST /faulty/echo declaring a body of
// declared bytes, and sent bytes of it, from local; the rest never comes
// unless the test sends it.
func (f *fixture) startSlowBody(t *testing.T, local string, declared, sent int) net.Conn {
	t.Helper()
	conn := f.dialFrom(t, local)
	if _, err := fmt.Fprintf(conn, "POST /faulty/echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", declared, bytes.Repeat([]byte("a"), sent)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// bodyBytes is plughost_request_body_bytes for plugin.
func (f *fixture) bodyBytes(plugin string) int {
	return int(testutil.ToFloat64(f.m.BodyBytes.WithLabelValues(plugin)))
}

// TestBodyBudget checks that bodies still arriving are bounded by
// max_inflight × max_body_bytes per plugin, the figure docs/config.md
// states, and that a body is charged by the bytes it has sent, in
// pieces, not by the length it claims.
func TestBodyBudget(t *testing.T) {
	const maxBody = 64 << 10
	// The ingress cuts a request off at its request timeout, which so
	// bounds each wait below for one to end.
	const requestTimeout = 30 * time.Second
	fs := faulty()
	fs.maxInflight = 1 // the budget: 1 × 64 KiB
	f := newFixture(t, ingress.Limits{MaxBodyBytes: maxBody, RequestTimeout: requestTimeout, BodyTimeout: 30 * time.Second}, fs)

	// 10 KiB of a declared 64 KiB arrive: pieces of 4, 4 and 8 KiB, the
	// last partly filled, hold 16 KiB.
	conn := f.startSlowBody(t, "127.0.0.1", maxBody, 10<<10)
	waitFor(t, 10*time.Second, "the slow body's pieces to be charged", func() bool { return f.bodyBytes("faulty") == 16<<10 })
	// A request gives its slot and its body's charge back when it ends,
	// which may be after its client has read the whole answer: each
	// check below starts once the requests before it have ended, so that
	// the slow body alone holds the budget.
	slowBodyAlone := func(after string) {
		t.Helper()
		waitFor(t, requestTimeout, "the budget to hold only the slow body's 16 KiB after "+after, func() bool {
			return f.inflight("faulty") == 0 && f.bodyBytes("faulty") == 16<<10
		})
	}

	// Another client's 40 KiB fits beside it (16 + 40 <= 64 KiB).
	other := bytes.Repeat([]byte("b"), 40<<10)
	if r := f.postFrom(t, "127.0.0.2", "/faulty/echo", other); r.code != http.StatusOK || r.body != string(other) {
		t.Errorf("POST /faulty/echo with 40 KiB beside a slow body holding 16 KiB = %d %.100s, want 200 and its body", r.code, r.body)
	}
	slowBodyAlone("the 40 KiB request")
	// 50 KiB does not.
	r := f.postFrom(t, "127.0.0.2", "/faulty/echo", bytes.Repeat([]byte("b"), 50<<10))
	if r.code != http.StatusTooManyRequests || r.errorCode() != "busy" || !strings.Contains(r.body, fmt.Sprint(maxBody)) || r.header.Get("Retry-After") == "" {
		t.Errorf("POST /faulty/echo with 50 KiB beside a slow body holding 16 KiB = %d %s (Retry-After %q), want 429 busy naming %d bytes with Retry-After",
			r.code, r.body, r.header.Get("Retry-After"), maxBody)
	}
	slowBodyAlone("the refused 50 KiB request")
	// The rest of the slow body arrives: it is answered, and frees the
	// budget.
	if _, err := conn.Write(bytes.Repeat([]byte("a"), maxBody-10<<10)); err != nil {
		t.Fatal(err)
	}
	if r := readResponse(t, conn); r.code != http.StatusOK || len(r.body) != maxBody {
		t.Errorf("the slow POST /faulty/echo = %d with %d bytes, want 200 with %d", r.code, len(r.body), maxBody)
	}
	waitFor(t, requestTimeout, "the slow request to end and give the budget back", func() bool {
		return f.inflight("faulty") == 0 && f.bodyBytes("faulty") == 0
	})
	if r := f.postFrom(t, "127.0.0.2", "/faulty/echo", bytes.Repeat([]byte("b"), 50<<10)); r.code != http.StatusOK {
		t.Errorf("POST /faulty/echo with 50 KiB once the budget is free = %d %s, want 200", r.code, r.body)
	}
}

// TestBodyClientShare checks that one client address holds at most its
// share of a plugin's body budget (a quarter, and at least one body of
// max_body_bytes), so that other clients' bodies still fit.
func TestBodyClientShare(t *testing.T) {
	const maxBody = 64 << 10
	// The ingress cuts a request off at its request timeout, which so
	// bounds each wait below for one to end.
	const requestTimeout = 30 * time.Second
	fs := faulty()
	fs.maxInflight = 8 // the budget: 8 × 64 KiB = 512 KiB; a client's share 128 KiB
	f := newFixture(t, ingress.Limits{MaxBodyBytes: maxBody, RequestTimeout: requestTimeout, BodyTimeout: 30 * time.Second}, fs)

	// Two slow bodies from 127.0.0.1 that have sent 48 KiB each hold
	// pieces of 4 + 4 + 8 + 16 + 32 = 64 KiB each: the share.
	for range 2 {
		f.startSlowBody(t, "127.0.0.1", maxBody, 48<<10)
	}
	waitFor(t, 10*time.Second, "the slow bodies' pieces to be charged", func() bool { return f.bodyBytes("faulty") == 2*maxBody })

	r := f.postFrom(t, "127.0.0.1", "/faulty/echo", bytes.Repeat([]byte("c"), 10<<10))
	if r.code != http.StatusTooManyRequests || r.errorCode() != "busy" || !strings.Contains(r.body, "this client") || !strings.Contains(r.body, fmt.Sprint(2*maxBody)) {
		t.Errorf("POST /faulty/echo from the client holding its share = %d %s, want 429 busy naming this client's share of %d bytes", r.code, r.body, 2*maxBody)
	}
	// Another address still has room: most of the budget is free. Each
	// body from it is checked once the one before it has ended and given
	// back its charge (a request may end after its client has read the
	// answer), so that the slow bodies alone hold the budget.
	for range 3 {
		waitFor(t, requestTimeout, "the budget to hold only the slow bodies", func() bool { return f.bodyBytes("faulty") == 2*maxBody })
		body := bytes.Repeat([]byte("d"), 60<<10)
		if r := f.postFrom(t, "127.0.0.2", "/faulty/echo", body); r.code != http.StatusOK || r.body != string(body) {
			t.Errorf("POST /faulty/echo with 60 KiB from another address = %d %.100s, want 200 and its body", r.code, r.body)
		}
	}
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
