package ingress

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// malformedHeads are requests net/http's server cannot read, each with
// the platform's error code the front must answer it with.
var malformedHeads = []struct {
	name, head, code string
}{
	{"header line without a colon", "GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", "bad_request"},
	{"Content-Length not a number", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", "bad_request"},
	{"two Content-Lengths", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "bad_request"},
	{"no request line", "GARBAGE\r\n\r\n", "bad_request"},
	{"no Host", "GET / HTTP/1.1\r\n\r\n", "bad_request"},
	{"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "bad_request"},
	{"unsupported Transfer-Encoding", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported_transfer_encoding"},
	{"HTTP/9.1", "GET / HTTP/9.1\r\nHost: x\r\n\r\n", "unsupported_version"},
	{"head over MaxHeaderBytes", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\n\r\n", "head_too_large"},
}

// TestProtocolErrorsAreJSON sends each malformed head to net/http's server
// alone and through a Front to the same kind of server: the front's answer
// has net/http's status, is the platform's JSON error with the head's code,
// states its length, and closes the connection, as net/http's does.
func TestProtocolErrorsAreJSON(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	plain := httptest.NewUnstartedServer(h)
	plain.Config.MaxHeaderBytes = 4 << 10
	plain.Start()
	t.Cleanup(plain.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := serveFront(t, ln, h, FrontOptions{}, &http.Server{Handler: h, MaxHeaderBytes: 4 << 10})

	for _, tc := range malformedHeads {
		t.Run(tc.name, func(t *testing.T) {
			want := exchange(t, strings.TrimPrefix(plain.URL, "http://"), tc.head, "")
			if want.Status < 400 || want.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
				t.Fatalf("net/http answers %d %q %q; the case no longer shows its plain-text error", want.Status, want.Header.Get("Content-Type"), want.Body)
			}
			got := exchange(t, f.addr, tc.head, "")
			if got.Status != want.Status {
				t.Errorf("status %d, want net/http's %d (%s)", got.Status, want.Status, got.BodyErr)
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
			var e struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal([]byte(got.Body), &e); err != nil || e.Error.Code != tc.code || e.Error.Message == "" {
				t.Errorf("body %q (%v): want a JSON error of code %q with a message", got.Body, err, tc.code)
			}
		})
	}
}

// TestProtocolErrorOnlyRewritesNetHTTPs checks protocolError against what
// net/http writes for a handler's own plain-text errors and against near
// misses of its protocol errors: none is rewritten.
func TestProtocolErrorOnlyRewritesNetHTTPs(t *testing.T) {
	// What net/http writes for http.Error(w, "bad", 400) with Connection:
	// close, captured from a real server.
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
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	handlerError, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}

	for _, p := range []string{
		string(handlerError),
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
	} {
		if b, ok := protocolError([]byte(p)); ok {
			t.Errorf("protocolError(%q) = %q, true; want it left alone", p, b)
		}
	}
}
