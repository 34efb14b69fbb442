package ingress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ownAnswerHeads are requests net/http's server answers itself, without a
// handler: heads it cannot read, and an Expect it does not meet. Each has
// the platform's error code the front must answer it with, and the
// message when net/http's status line gives no reason.
var ownAnswerHeads = []struct {
	name, head, code, msg string
}{
	{"header line without a colon", "GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", "bad_request", "the request's head is malformed"},
	{"Content-Length not a number", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", "bad_request", "the request's head is malformed"},
	{"two Content-Lengths", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "bad_request", "the request's head is malformed"},
	{"no request line", "GARBAGE\r\n\r\n", "bad_request", "the request's head is malformed"},
	{"no Host", "GET / HTTP/1.1\r\n\r\n", "bad_request", ""},
	{"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "bad_request", "the request's head is malformed"},
	{"unsupported Transfer-Encoding", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported_transfer_encoding", "the request's Transfer-Encoding is not supported"},
	{"HTTP/9.1", "GET / HTTP/9.1\r\nHost: x\r\n\r\n", "unsupported_version", ""},
	{"head over MaxHeaderBytes", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\n\r\n", "head_too_large", "the request's head is larger than the server accepts"},
	{"Expect other than 100-continue", "POST / HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\nContent-Length: 2\r\n\r\nab", "expectation_failed", "the request's Expect is not supported: only 100-continue is"},
	{"Expect other than 100-continue, HTTP/1.0", "GET / HTTP/1.0\r\nExpect: teapot\r\n\r\n", "expectation_failed", "the request's Expect is not supported: only 100-continue is"},
}

// statusLine returns the first line of an exchanged head.
func statusLine(head string) string {
	line, _, _ := strings.Cut(head, "\r\n")
	return line
}

// ownAnswerServers serves h behind each kind of connection that answers
// net/http's own answers in JSON, with net/http's MaxHeaderBytes at 4
// KiB, and returns their addresses by name: "front", a Front's handed-over
// connections, and "listener", those of a listener with OwnAnswers.
func ownAnswerServers(t *testing.T, h http.Handler) map[string]string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := serveFront(t, ln, h, FrontOptions{}, &http.Server{Handler: h, MaxHeaderBytes: 4 << 10})
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	own := NewListener(raw, ListenerOptions{Name: "admin", MaxConns: 16, OwnAnswers: true})
	srv := &http.Server{Handler: h, MaxHeaderBytes: 4 << 10}
	HookServer(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(own) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})
	return map[string]string{"front": f.addr, "listener": raw.Addr().String()}
}

// dialAddr opens a connection to addr, closed when the test ends, with a
// deadline of 30 s, and a reader of it.
func dialAddr(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// TestOwnAnswersAreJSON sends each head of ownAnswerHeads to net/http's
// server alone, and through each kind of connection that answers its own
// answers in JSON to the same kind of server: the answer has net/http's
// status line, is the platform's JSON error with the head's code and
// net/http's reason as its message (or the code's own message when it
// gives none), states its length, and closes the connection, as
// net/http's does.
func TestOwnAnswersAreJSON(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	plain := httptest.NewUnstartedServer(h)
	plain.Config.MaxHeaderBytes = 4 << 10
	plain.Start()
	t.Cleanup(plain.Close)
	for name, addr := range ownAnswerServers(t, h) {
		for _, tc := range ownAnswerHeads {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				want := exchange(t, strings.TrimPrefix(plain.URL, "http://"), tc.head, "")
				if want.Status < 400 || strings.HasPrefix(want.Header.Get("Content-Type"), "application/json") {
					t.Fatalf("net/http answers %d %q %q; the case no longer shows an answer of its own", want.Status, want.Header.Get("Content-Type"), want.Body)
				}
				got := exchange(t, addr, tc.head, "")
				if statusLine(got.Head) != statusLine(want.Head) {
					t.Errorf("status line %q, want net/http's %q (%s)", statusLine(got.Head), statusLine(want.Head), got.BodyErr)
				}
				if ct := got.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q, want application/json (body %q)", ct, got.Body)
				}
				if got.Length != int64(len(got.Body)) {
					t.Errorf("Content-Length %d for a body of %d bytes", got.Length, len(got.Body))
				}
				if !strings.Contains(got.Head+"\r\n", "\r\nConnection: close\r\n") || !got.ClosedAfter {
					t.Errorf("head %q, closed after the answer %t; want Connection: close, and closed", got.Head, got.ClosedAfter)
				}
				wantMsg := tc.msg
				if _, reason, ok := strings.Cut(statusLine(want.Head), ": "); ok {
					wantMsg = reason
				}
				var e struct {
					Error struct{ Code, Message string }
				}
				if err := json.Unmarshal([]byte(got.Body), &e); err != nil || e.Error.Code != tc.code || e.Error.Message != wantMsg {
					t.Errorf("body %q (%v): want a JSON error of code %q and message %q", got.Body, err, tc.code, wantMsg)
				}
			})
		}
	}
}

// TestHandlerAnswersPassUnchanged has a handler answer with bytes that
// net/http's own answers are made of, each flushed in a write of its own:
// a body that ends in net/http's 400 and one that starts as its 417, and
// a 417 of the handler's own. Through each kind of connection that
// answers net/http's own answers in JSON, each reaches the client as the
// handler wrote it: only what net/http writes with no handler answering
// is rewritten.
func TestHandlerAnswersPassUnchanged(t *testing.T) {
	const err400 = "HTTP/1.1 400 Bad Request" + netHTTPErrorHeaders + "400 Bad Request"
	bodies := map[string]string{
		"/tail":  strings.Repeat("x", 5000) + err400,
		"/start": "HTTP/1.1" + expectationFailed + "Content-Length: 0\r\n\r\n",
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/417" {
			w.WriteHeader(http.StatusExpectationFailed)
			return
		}
		body := bodies[r.URL.Path]
		tail := body[strings.LastIndex(body, "HTTP/1.1"):]
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body[:len(body)-len(tail)])
		w.(http.Flusher).Flush()
		io.WriteString(w, tail)
		w.(http.Flusher).Flush()
	})
	for name, addr := range ownAnswerServers(t, h) {
		c, br := dialAddr(t, addr)
		// A POST goes to net/http through the front, which then serves
		// the rest of the connection.
		for _, path := range []string{"/tail", "/start", "/417", "/tail"} {
			if _, err := io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s: POST %s: %v", name, path, err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("%s: POST %s: read body: %v", name, path, err)
			}
			want, wantStatus := bodies[path], http.StatusOK
			if path == "/417" {
				wantStatus = http.StatusExpectationFailed
			}
			if resp.StatusCode != wantStatus || string(body) != want {
				t.Errorf("%s: POST %s = %d %.80q…, want %d and the handler's %d bytes", name, path, resp.StatusCode, body, wantStatus, len(want))
			}
		}
	}
}

// TestOwnAnswersAfterAnswers sends each head of ownAnswerHeads after a
// request a handler answered on the same connection, as the next request
// and pipelined behind it: the connection is no longer answering once the
// handler's answer is out, so net/http's answer to the head is the JSON
// error. (A head over MaxHeaderBytes is left out: on a kept-alive
// connection net/http reads up to 4 KiB more before it applies the limit.)
func TestOwnAnswersAfterAnswers(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	const first = "POST /first HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
	for name, addr := range ownAnswerServers(t, h) {
		for _, tc := range ownAnswerHeads {
			if tc.code == "head_too_large" {
				continue
			}
			for _, pipelined := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/pipelined=%t", name, tc.name, pipelined), func(t *testing.T) {
					c, br := dialAddr(t, addr)
					send := first
					if pipelined {
						send += tc.head
					}
					if _, err := io.WriteString(c, send); err != nil {
						t.Fatal(err)
					}
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatalf("first answer: %v", err)
					}
					if body, err := io.ReadAll(resp.Body); err != nil || resp.StatusCode != http.StatusOK || string(body) != "ok" {
						t.Fatalf("first answer = %d %q (%v), want 200 \"ok\"", resp.StatusCode, body, err)
					}
					if !pipelined {
						if _, err := io.WriteString(c, tc.head); err != nil {
							t.Fatal(err)
						}
					}
					resp, err = http.ReadResponse(br, nil)
					if err != nil {
						t.Fatalf("answer to the head: %v", err)
					}
					body, err := io.ReadAll(resp.Body)
					var e struct {
						Error struct{ Code string }
					}
					if err != nil || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &e) != nil || e.Error.Code != tc.code {
						t.Errorf("answer to the head = %d %q %q (%v), want the JSON error %q", resp.StatusCode, resp.Header.Get("Content-Type"), body, err, tc.code)
					}
				})
			}
		}
	}
}

// TestHookServerKeepsHooks checks that HookServer keeps a server's own
// ConnContext and ConnState, and its handler.
func TestHookServerKeepsHooks(t *testing.T) {
	type key struct{}
	var mu sync.Mutex
	var states []http.ConnState
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			v, _ := r.Context().Value(key{}).(string)
			io.WriteString(w, v)
		}),
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, key{}, "from ConnContext")
		},
		ConnState: func(_ net.Conn, s http.ConnState) {
			mu.Lock()
			states = append(states, s)
			mu.Unlock()
		},
	}
	HookServer(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})
	got := exchange(t, ln.Addr().String(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "GET")
	if got.Status != http.StatusOK || got.Body != "from ConnContext" {
		t.Errorf("GET = %d %q, want 200 \"from ConnContext\": the handler sees the server's own ConnContext", got.Status, got.Body)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(states, http.StateNew) || !slices.Contains(states, http.StateActive) || !slices.Contains(states, http.StateIdle) {
		t.Errorf("the server's ConnState saw %v; want New, Active and Idle among them", states)
	}
}

// TestProtocolErrorOnlyRewritesNetHTTPs checks protocolError against what
// net/http writes for a handler's own plain-text errors and against near
// misses of its answers to heads it cannot read: none is rewritten.
func TestProtocolErrorOnlyRewritesNetHTTPs(t *testing.T) {
	// What net/http writes for http.Error(w, "400 Bad Request", 400) with
	// Connection: close, captured from a real server.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		http.Error(w, "400 Bad Request", http.StatusBadRequest)
	}))
	t.Cleanup(srv.Close)
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	handlerError, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append([]string{string(handlerError)}, protocolErrorMisses...) {
		if b, ok := protocolError([]byte(p)); ok {
			t.Errorf("protocolError(%q) = %q, true; want it left alone", p, b)
		}
	}
}

// protocolErrorMisses are near misses of net/http's answers to heads it
// cannot read.
var protocolErrorMisses = []string{
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 400 Bad Request" + netHTTPErrorHeaders + "400 Bad Request, and more",
	"HTTP/1.1 400 Bad Request" + netHTTPErrorHeaders + "something else",
	"HTTP/1.1 400 Not The Text" + netHTTPErrorHeaders + "400 Not The Text",
	"HTTP/1.1 400 Bad Requestx" + netHTTPErrorHeaders + "400 Bad Requestx",
	"HTTP/1.1 200 OK" + netHTTPErrorHeaders + "200 OK",
	"HTTP/1.1 4x0 Bad Request" + netHTTPErrorHeaders + "4x0 Bad Request",
	"HTTP/1.1 400 Bad Request" + netHTTPErrorHeaders[:20],
	"HTTP/1.0 400 Bad Request" + netHTTPErrorHeaders + "400 Bad Request",
	"HTTP/1.1 400 Bad Request: " + netHTTPErrorHeaders + "400 Bad Request: ",
	"HTTP/1.1 501 Not Implemented" + netHTTPErrorHeaders + "Unsupported",
	"HTTP/1.1 ",
	"",
}

// FuzzProtocolError checks that ownAnswer rewrites only net/http's own
// answers: those to heads it cannot read, exactly as net/http writes them
// (the status line repeated as the body, or its 501), and answers that
// start as its 417; and that what it writes instead is an answer with the
// same status and a JSON error body of the stated length.
func FuzzProtocolError(f *testing.F) {
	for _, s := range []string{"400 Bad Request", "431 Request Header Fields Too Large",
		"400 Bad Request: missing required Host header", "505 HTTP Version Not Supported: unsupported protocol version"} {
		f.Add([]byte("HTTP/1.1 " + s + netHTTPErrorHeaders + s))
	}
	f.Add([]byte("HTTP/1.1 501 Not Implemented" + netHTTPErrorHeaders + "Unsupported transfer encoding"))
	for _, s := range protocolErrorMisses {
		f.Add([]byte(s))
	}
	f.Add([]byte("HTTP/1.0" + expectationFailed + "Connection: close\r\nContent-Length: 0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, p []byte) {
		b, ok := ownAnswer(p)
		if !ok {
			return
		}
		proto, rest, _ := bytes.Cut(p, []byte(" "))
		status, _, _ := bytes.Cut(rest, []byte("\r\n"))
		asNetHTTP := "HTTP/1.1 " + string(status) + netHTTPErrorHeaders + string(status)
		is417 := (string(proto) == "HTTP/1.1" || string(proto) == "HTTP/1.0") && bytes.HasPrefix(rest, []byte(expectationFailed[1:]))
		if string(p) != asNetHTTP && string(p) != "HTTP/1.1 501 Not Implemented"+netHTTPErrorHeaders+"Unsupported transfer encoding" && !is417 {
			t.Fatalf("ownAnswer rewrote %q, which is not an answer net/http writes", p)
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(b)), nil)
		if err != nil {
			t.Fatalf("ownAnswer(%q) wrote %q: %v", p, b, err)
		}
		body, err := io.ReadAll(resp.Body)
		var e struct {
			Error struct{ Code, Message string }
		}
		if err != nil || resp.ContentLength != int64(len(body)) || json.Unmarshal(body, &e) != nil || e.Error.Code == "" || e.Error.Message == "" {
			t.Fatalf("ownAnswer(%q) wrote %q: want a JSON error of its stated length (%v)", p, b, err)
		}
		if !strings.HasPrefix(string(status), strconv.Itoa(resp.StatusCode)+" ") {
			t.Fatalf("ownAnswer(%q) answers %d", p, resp.StatusCode)
		}
	})
}
