package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// upstream is a loopback HTTP/1.1 server that answers each request it
// reads with answer(n), n counting from 1 across connections, and closes
// the connection after the answer when close(n) says so. It counts the
// connections it accepted.
type upstream struct {
	ln     net.Listener
	dials  atomic.Int64
	reqs   atomic.Int64
	answer func(n int64) string
	close  func(n int64) bool
	closed chan struct{} // gets a value each time it closes a connection after an answer
	wg     sync.WaitGroup
}

func newUpstream(t *testing.T, answer func(n int64) string, closeAfter func(n int64) bool) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{ln: ln, answer: answer, close: closeAfter, closed: make(chan struct{}, 100)}
	if u.close == nil {
		u.close = func(int64) bool { return false }
	}
	var mu sync.Mutex
	var conns []net.Conn
	u.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.dials.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			u.wg.Go(func() { u.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		u.wg.Wait()
	})
	return u
}

func (u *upstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		n := u.reqs.Add(1)
		if _, err := io.WriteString(c, u.answer(n)); err != nil {
			return
		}
		if u.close(n) {
			c.Close()
			u.closed <- struct{}{}
			return
		}
	}
}

func (u *upstream) url() string { return "http://" + u.ln.Addr().String() }

func newClient(t *testing.T) *Client {
	c := &Client{Dial: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, MaxIdlePerHost: 8, IdleTimeout: time.Minute}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

const okAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// get sends method with body to url through c and returns the status
// and the body, read to its end.
func get(t *testing.T, c *Client, ctx context.Context, method, url string, body []byte) (int, string, error) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.RoundTrip(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestReuse: answers read to their end leave their connection to the
// next request, unless the answer says Connection: close.
func TestReuse(t *testing.T) {
	tests := []struct {
		name      string
		answer    string
		wantDials int64
	}{
		{"keep-alive", okAnswer, 1},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", 1},
		{"no body", "HTTP/1.1 204 No Content\r\n\r\n", 1},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpstream(t, func(int64) string { return tt.answer }, nil)
			c := newClient(t)
			for range 3 {
				if code, _, err := get(t, c, t.Context(), "GET", u.url()+"/x", nil); err != nil || code/100 != 2 {
					t.Fatalf("GET = %d, %v; want 2xx", code, err)
				}
			}
			if got := u.dials.Load(); got != tt.wantDials {
				t.Errorf("3 GETs answered %q dialled %d times, want %d", tt.answer, got, tt.wantDials)
			}
		})
	}
}

// TestBytesAfterAnswer: a connection with bytes after an answer is not
// reused, so that they are not read as the next request's answer: a 204
// that carries a body anyway, a body longer than its Content-Length.
func TestBytesAfterAnswer(t *testing.T) {
	for _, first := range []string{
		"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokhello",
		"HTTP/1.1 304 Not Modified\r\n\r\n" + strings.Repeat("x", 5000), // past the read buffer
	} {
		u := newUpstream(t, func(n int64) string {
			if n == 1 {
				return first
			}
			return okAnswer
		}, nil)
		c := newClient(t)
		if _, _, err := get(t, c, t.Context(), "POST", u.url()+"/x", []byte("{}")); err != nil {
			t.Fatalf("first POST, answered %q: %v", first, err)
		}
		if code, body, err := get(t, c, t.Context(), "POST", u.url()+"/x", []byte("{}")); err != nil || code != 200 || body != "ok" {
			t.Errorf("POST after an answer %q = %d %q, %v; want 200 ok on a new connection", first, code, body, err)
		}
	}
}

// TestBytesWhileIdle: a pooled connection on which the upstream sent
// bytes nobody asked for while it was idle is closed, not reused, before
// any request, replayable or not.
func TestBytesWhileIdle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pooled, sent := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		first := true
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					break
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(c, okAnswer)
				if first {
					first = false
					<-pooled
					// On loopback the bytes are in the client's socket
					// once this write returns.
					_, _ = io.WriteString(c, "hello")
					close(sent)
				}
			}
			c.Close()
		}
	})
	c := newClient(t)
	if _, _, err := get(t, c, t.Context(), "POST", "http://"+ln.Addr().String()+"/x", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	close(pooled)
	<-sent
	// A GET, which could be sent again if the connection were closed:
	// meeting bytes, it could not.
	if code, body, err := get(t, c, t.Context(), "GET", "http://"+ln.Addr().String()+"/x", nil); err != nil || code != 200 || body != "ok" {
		t.Errorf("GET after bytes on the idle connection = %d %q, %v; want 200 ok on a new connection", code, body, err)
	}
}

// TestBodyClosedEarly: a body closed before its end takes its connection
// with it, since the rest of the body would come before the next answer.
func TestBodyClosedEarly(t *testing.T) {
	u := newUpstream(t, func(int64) string { return "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789" }, nil)
	c := newClient(t)
	req, _ := http.NewRequestWithContext(t.Context(), "GET", u.url()+"/x", nil)
	resp, err := c.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	var b [3]byte
	if _, err := io.ReadFull(resp.Body, b[:]); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code, body, err := get(t, c, t.Context(), "GET", u.url()+"/x", nil); err != nil || body != "0123456789" {
		t.Fatalf("GET after a body closed early = %d %q, %v; want 200 0123456789", code, body, err)
	}
	if got := u.dials.Load(); got != 2 {
		t.Errorf("dials = %d, want 2", got)
	}
}

// TestClosedIdleConnection: when the upstream closes a kept-alive
// connection, the next request goes on a new one and succeeds, whatever
// its method, as it would through net/http's Transport.
func TestClosedIdleConnection(t *testing.T) {
	tests := []struct {
		method string
		body   []byte
	}{
		{"GET", nil},
		{"POST", []byte("payload")},
		{"PUT", []byte("payload")},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			// Every answer ends its connection, without saying so.
			u := newUpstream(t, func(int64) string { return okAnswer }, func(int64) bool { return true })
			c := newClient(t)
			for i := range 2 {
				if code, body, err := get(t, c, t.Context(), tt.method, u.url()+"/x", tt.body); err != nil || code != 200 || body != "ok" {
					t.Fatalf("%s #%d = %d %q, %v; want 200 ok", tt.method, i, code, body, err)
				}
				<-u.closed
			}
			if got := u.reqs.Load(); got != 2 {
				t.Errorf("the upstream served %d requests, want 2", got)
			}
		})
	}
}

// TestRetryable pins when a request that failed on a kept-alive
// connection goes again: only if the upstream got none of it, or read
// none of the answer and the request may be sent twice.
func TestRetryable(t *testing.T) {
	body := func() io.ReadCloser { return io.NopCloser(strings.NewReader("x")) }
	tests := []struct {
		name          string
		method        string
		idempotent    bool
		written, read int64
		err           error
		want          bool
	}{
		{"nothing written", "POST", false, 0, 0, io.EOF, true},
		{"GET, nothing read", "GET", false, 10, 0, io.EOF, true},
		{"GET, answer begun", "GET", false, 10, 1, io.ErrUnexpectedEOF, false},
		{"POST, nothing read", "POST", false, 10, 0, io.EOF, false},
		{"POST with Idempotency-Key", "POST", true, 10, 0, io.EOF, true},
		{"GET past its deadline", "GET", false, 10, 0, &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, false},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, "http://h/", nil)
		req.Body = body()
		req.GetBody = func() (io.ReadCloser, error) { return body(), nil }
		if tt.idempotent {
			req.Header.Set("Idempotency-Key", "1")
		}
		if got := retryable(req, &countedConn{written: tt.written, read: tt.read}, tt.err); got != tt.want {
			t.Errorf("%s: retryable = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestInformationalSkipped: 1xx answers before the final one are skipped.
func TestInformationalSkipped(t *testing.T) {
	u := newUpstream(t, func(int64) string {
		return "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" + okAnswer
	}, nil)
	c := newClient(t)
	if code, body, err := get(t, c, t.Context(), "POST", u.url()+"/x", []byte("b")); err != nil || code != 200 || body != "ok" {
		t.Fatalf("POST = %d %q, %v; want 200 ok", code, body, err)
	}
}

// TestHeadersBounded: an answer whose head never ends is an error, not a
// growing buffer.
func TestHeadersBounded(t *testing.T) {
	u := newUpstream(t, func(int64) string {
		return "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", maxHeaderBytes+1) + "\r\n\r\n"
	}, nil)
	c := newClient(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, _, err := get(t, c, ctx, "GET", u.url()+"/x", nil); !errors.Is(err, errHeaderTooLong) {
		t.Fatalf("GET of an answer with %d bytes of headers: err = %v, want %v", maxHeaderBytes+1, err, errHeaderTooLong)
	}
}

// TestContextEndsCall: a stalled upstream is left when the request's
// context is cancelled, with the context's error, and when its deadline
// passes, with a read timeout.
func TestContextEndsCall(t *testing.T) {
	stall := make(chan struct{})
	defer close(stall)
	u := newUpstream(t, func(int64) string { <-stall; return okAnswer }, nil)
	c := newClient(t)

	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, _, err := get(t, c, ctx, "GET", u.url()+"/x", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("GET cancelled while the upstream stalls: err = %v, want context.Canceled", err)
	}

	ctx, cancel = context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, _, err := get(t, c, ctx, "GET", u.url()+"/x", nil)
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "read" || !op.Timeout() {
		t.Errorf("GET past its deadline while the upstream stalls: err = %v, want a read timeout", err)
	}
}

// TestIdleTimeout: a connection idle for IdleTimeout is closed, and the
// next request dials.
func TestIdleTimeout(t *testing.T) {
	u := newUpstream(t, func(int64) string { return okAnswer }, nil)
	c := newClient(t)
	c.IdleTimeout = 10 * time.Millisecond
	if _, _, err := get(t, c, t.Context(), "GET", u.url()+"/x", nil); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		n := len(c.idle[u.ln.Addr().String()])
		c.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle connection was still pooled 5s after its idle timeout")
		}
	}
	if _, _, err := get(t, c, t.Context(), "GET", u.url()+"/x", nil); err != nil {
		t.Fatal(err)
	}
	if got := u.dials.Load(); got != 2 {
		t.Errorf("dials = %d, want 2", got)
	}
}
