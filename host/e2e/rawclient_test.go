package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawClient is a wrk-style HTTP/1.1 client on one kept-alive connection,
// for a closed-loop load generator. It exists because the load generator
// shares the machine's two cores with the host and the plugin it
// measures, so every microsecond it spends is taken from them: net/http's
// client cost BenchmarkWalletTransfers about 80µs of CPU per transfer, and
// this one about 20µs. It builds a request once into a reused buffer,
// sends it with one Write and parses the answer from a bufio.Reader
// without allocating.
//
// It reads only what the host sends: HTTP/1.1 answers with a
// Content-Length body, or none for 204 and 304. It refuses any other
// (errUnsupportedResponse), and anything it cannot parse
// (errBadResponse); after any error, and after an answer with
// Connection: close, the next request dials again. It loads 127.0.0.1
// only and is not safe for concurrent use; call close when done.
type rawClient struct {
	addr string        // host:port, dialled and sent as Host
	conn net.Conn      // nil until dialled, and after an error or Connection: close
	br   *bufio.Reader // reads conn; kept across dials
	req  []byte        // the request do sends, from setGet or setPost
	body []byte        // the last answer's body; reused
}

// rawTimeout bounds a dial and each request, like the net/http client's
// Timeout that the load generators used before.
const rawTimeout = 10 * time.Second

// Limits on an answer, far above what the host sends.
const (
	maxRawHeaderLines = 100
	maxRawBody        = 1 << 20
)

var (
	// errBadResponse is an answer that is not HTTP/1.1.
	errBadResponse = errors.New("malformed HTTP response")
	// errUnsupportedResponse is a well-formed answer the raw client
	// does not read, such as a chunked body.
	errUnsupportedResponse = errors.New("HTTP response the raw client does not read")
)

// newRawClient returns a client for baseURL, which must be
// http://127.0.0.1:PORT. It dials on the first request.
func newRawClient(baseURL string) (*rawClient, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("raw client: %w", err)
	}
	if u.Scheme != "http" || u.Hostname() != "127.0.0.1" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("raw client: base URL %q: want http://127.0.0.1:PORT", baseURL)
	}
	return &rawClient{addr: u.Host}, nil
}

// setGet makes the request that do sends: a GET of path, which must not
// hold a line break, with no header but Host, as wrk sends.
func (c *rawClient) setGet(path string) {
	b := append(c.req[:0], "GET "...)
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.addr...)
	c.req = append(b, "\r\n\r\n"...)
}

// setPost makes the request that do sends: a POST of the JSON body to
// path with the Idempotency-Key key. Neither path nor key may hold a
// line break; the caller's buffers are copied and may be reused.
func (c *rawClient) setPost(path string, key, body []byte) {
	b := append(c.req[:0], "POST "...)
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.addr...)
	b = append(b, "\r\nContent-Type: application/json\r\nIdempotency-Key: "...)
	b = append(b, key...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	c.req = append(b, body...)
}

// do sends the request setGet or setPost made and returns the answer's
// status and body; the body is valid until the next call. It dials first
// when it has no connection, gives up after rawTimeout or at ctx's
// deadline, whichever is first, and checks ctx only before it starts.
// When a kept-alive connection turns out closed (the write fails, or it
// ends before any byte of the answer: the server closed it while idle),
// it sends the request once more on a new connection, as net/http's
// Transport does for a request it may repeat; the benchmarks' GETs, and
// POSTs with an Idempotency-Key, are such requests.
func (c *rawClient) do(ctx context.Context) (int, []byte, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	deadline := time.Now().Add(rawTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	reused := c.conn != nil
	r, err := c.try(ctx, deadline)
	if err != nil && reused && errors.Is(err, errIdleClosed) {
		r, err = c.try(ctx, deadline)
	}
	if err != nil {
		return 0, nil, err
	}
	c.body = r.body
	if r.close {
		c.close()
	}
	return r.status, r.body, nil
}

// errIdleClosed is a kept-alive connection found closed before the
// request could be answered on it.
var errIdleClosed = errors.New("connection closed before the answer began")

// try sends the request once, dialling first when there is no
// connection, and reads the answer.
func (c *rawClient) try(ctx context.Context, deadline time.Time) (rawResponse, error) {
	if c.conn == nil {
		d := net.Dialer{Deadline: deadline}
		conn, err := d.DialContext(ctx, "tcp", c.addr)
		if err != nil {
			return rawResponse{}, err
		}
		c.conn = conn
		if c.br == nil {
			c.br = bufio.NewReader(conn)
		} else {
			c.br.Reset(conn)
		}
	}
	if err := c.conn.SetDeadline(deadline); err != nil {
		c.close()
		return rawResponse{}, err
	}
	if _, err := c.conn.Write(c.req); err != nil {
		c.close()
		return rawResponse{}, fmt.Errorf("write request: %w: %w", errIdleClosed, err)
	}
	r, err := parseResponse(c.br, c.body)
	if err != nil {
		c.close()
		if err == io.EOF {
			err = fmt.Errorf("%w: %w", errIdleClosed, err)
		}
		return rawResponse{}, fmt.Errorf("read answer from %s: %w", c.addr, err)
	}
	return r, nil
}

// close closes the connection, if any; the next request dials again.
func (c *rawClient) close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
}

// rawResponse is an answer parseResponse read.
type rawResponse struct {
	status int
	body   []byte // in the buffer given to parseResponse when it was large enough
	close  bool   // Connection: close; the server closes after this answer
}

// parseResponse reads one answer from br: the status line, the headers
// and exactly Content-Length bytes of body into buf, grown when too
// small, so that br is left at the next answer. It returns io.EOF when br
// ends before the answer starts, errBadResponse for what is not HTTP/1.1,
// and errUnsupportedResponse for a 1xx status, a Transfer-Encoding, a
// missing Content-Length or a body over maxRawBody.
func parseResponse(br *bufio.Reader, buf []byte) (rawResponse, error) {
	line, err := readLine(br)
	if err != nil {
		if err == io.EOF {
			return rawResponse{}, err // the server closed between answers
		}
		return rawResponse{}, fmt.Errorf("read status line: %w", err)
	}
	var r rawResponse
	if r.status, err = parseStatusLine(line); err != nil {
		return rawResponse{}, err
	}
	length := -1
	for n := 0; ; n++ {
		line, err := readLine(br)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return rawResponse{}, fmt.Errorf("read headers: %w", err)
		}
		if len(line) == 0 {
			break
		}
		if n == maxRawHeaderLines {
			return rawResponse{}, fmt.Errorf("%w: over %d header lines", errBadResponse, maxRawHeaderLines)
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 || line[0] == ' ' || line[0] == '\t' { // no name, or obsolete line folding
			return rawResponse{}, fmt.Errorf("%w: header line %q", errBadResponse, line)
		}
		name, value := line[:i], bytes.Trim(line[i+1:], " \t")
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, err := parseContentLength(value)
			if err != nil {
				return rawResponse{}, err
			}
			if length >= 0 && n != length {
				return rawResponse{}, fmt.Errorf("%w: Content-Length %d and %d", errBadResponse, length, n)
			}
			length = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return rawResponse{}, fmt.Errorf("%w: Transfer-Encoding %q; it reads only Content-Length bodies", errUnsupportedResponse, value)
		case bytes.EqualFold(name, []byte("Connection")):
			r.close = r.close || hasToken(value, "close")
		}
	}
	switch {
	case r.status == http.StatusNoContent || r.status == http.StatusNotModified:
		length = 0 // never a body, whatever the headers say
	case length < 0:
		return rawResponse{}, fmt.Errorf("%w: status %d without Content-Length; it reads only Content-Length bodies", errUnsupportedResponse, r.status)
	}
	if cap(buf) < length {
		buf = make([]byte, length)
	}
	r.body = buf[:length]
	if _, err := io.ReadFull(br, r.body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return rawResponse{}, fmt.Errorf("read %d-byte body: %w", length, err)
	}
	return r, nil
}

// readLine returns the next line of br without its LF or CRLF; the line
// is valid until the next read. A line that does not fit br's buffer is
// errBadResponse, and one cut short by the end of br io.ErrUnexpectedEOF.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, fmt.Errorf("%w: line over %d bytes", errBadResponse, br.Size())
	case err == io.EOF && len(line) > 0:
		return nil, io.ErrUnexpectedEOF
	case err != nil:
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// parseStatusLine returns the status of "HTTP/1.1 200 OK"; the reason
// phrase may be missing.
func parseStatusLine(line []byte) (int, error) {
	rest, ok := bytes.CutPrefix(line, []byte("HTTP/1.1 "))
	if !ok {
		if bytes.HasPrefix(line, []byte("HTTP/")) {
			return 0, fmt.Errorf("%w: status line %q; it speaks HTTP/1.1 only", errUnsupportedResponse, line)
		}
		return 0, fmt.Errorf("%w: status line %q", errBadResponse, line)
	}
	if len(rest) < 3 || (len(rest) > 3 && rest[3] != ' ') {
		return 0, fmt.Errorf("%w: status line %q", errBadResponse, line)
	}
	status := 0
	for _, d := range rest[:3] {
		if d < '0' || d > '9' {
			return 0, fmt.Errorf("%w: status line %q", errBadResponse, line)
		}
		status = status*10 + int(d-'0')
	}
	switch {
	case status < 100:
		return 0, fmt.Errorf("%w: status line %q", errBadResponse, line)
	case status < 200: // it never sends Expect, nor asks to switch protocols
		return 0, fmt.Errorf("%w: informational status %d", errUnsupportedResponse, status)
	}
	return status, nil
}

// parseContentLength parses a Content-Length value: decimal digits only,
// at most maxRawBody.
func parseContentLength(v []byte) (int, error) {
	if len(v) == 0 {
		return 0, fmt.Errorf("%w: empty Content-Length", errBadResponse)
	}
	n := 0
	for _, d := range v {
		if d < '0' || d > '9' {
			return 0, fmt.Errorf("%w: Content-Length %q", errBadResponse, v)
		}
		if n = n*10 + int(d-'0'); n > maxRawBody {
			return 0, fmt.Errorf("%w: Content-Length %q over %d bytes", errUnsupportedResponse, v, maxRawBody)
		}
	}
	return n, nil
}

// hasToken reports whether the comma-separated header value v lists
// token, in any case.
func hasToken(v []byte, token string) bool {
	for len(v) > 0 {
		var t []byte
		t, v, _ = bytes.Cut(v, []byte(","))
		if bytes.EqualFold(bytes.Trim(t, " \t"), []byte(token)) {
			return true
		}
	}
	return false
}

// parseCases are answers as the host sends them, and what parseResponse
// must make of each; they seed FuzzParseResponse too.
var parseCases = []struct {
	name   string
	in     string
	status int
	body   string
	close  bool
	err    error // errors.Is
}{
	{name: "200", in: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"seq\":42}\n",
		status: 200, body: "{\"seq\":42}\n"},
	{name: "no reason phrase", in: "HTTP/1.1 503\r\nContent-Length: 0\r\n\r\n", status: 503, body: ""},
	{name: "LF only", in: "HTTP/1.1 429 Too Many Requests\nContent-Length: 4\n\nbusy", status: 429, body: "busy"},
	{name: "header case and spaces", in: "HTTP/1.1 200 OK\r\ncontent-LENGTH:\t 2 \r\n\r\nok", status: 200, body: "ok"},
	{name: "same length twice", in: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", status: 200, body: "ok"},
	{name: "close", in: "HTTP/1.1 503 Service Unavailable\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n",
		status: 503, body: "", close: true},
	{name: "204 without length", in: "HTTP/1.1 204 No Content\r\n\r\n", status: 204, body: ""},
	{name: "empty", in: "", err: io.EOF},
	{name: "cut in status line", in: "HTTP/1.1 200", err: io.ErrUnexpectedEOF},
	{name: "cut in headers", in: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", err: io.ErrUnexpectedEOF},
	{name: "cut in body", in: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nok", err: io.ErrUnexpectedEOF},
	{name: "chunked", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", err: errUnsupportedResponse},
	{name: "no length", in: "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nok", err: errUnsupportedResponse},
	{name: "body too large", in: "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n", err: errUnsupportedResponse},
	{name: "HTTP/1.0", in: "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", err: errUnsupportedResponse},
	{name: "1xx", in: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", err: errUnsupportedResponse},
	{name: "not HTTP", in: "SSH-2.0-OpenSSH_9.6\r\n", err: errBadResponse},
	{name: "letters in status", in: "HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n", err: errBadResponse},
	{name: "four-digit status", in: "HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n", err: errBadResponse},
	{name: "status below 100", in: "HTTP/1.1 099 OK\r\nContent-Length: 0\r\n\r\n", err: errBadResponse},
	{name: "signed length", in: "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", err: errBadResponse},
	{name: "empty length", in: "HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n", err: errBadResponse},
	{name: "two lengths", in: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nokk", err: errBadResponse},
	{name: "folded header", in: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n 3\r\n\r\nok", err: errBadResponse},
	{name: "no colon", in: "HTTP/1.1 200 OK\r\nContent-Length 2\r\n\r\nok", err: errBadResponse},
	{name: "long line", in: "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 5000) + "\r\nContent-Length: 0\r\n\r\n", err: errBadResponse},
	{name: "too many headers", in: "HTTP/1.1 200 OK\r\n" + strings.Repeat("X: y\r\n", maxRawHeaderLines+1) + "Content-Length: 0\r\n\r\n",
		err: errBadResponse},
}

func TestParseResponse(t *testing.T) {
	for _, tc := range parseCases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseResponse(bufio.NewReader(strings.NewReader(tc.in)), nil)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("parseResponse(%.80q) = %d %q, %v; want error %v", tc.in, r.status, r.body, err, tc.err)
				}
				return
			}
			if err != nil || r.status != tc.status || string(r.body) != tc.body || r.close != tc.close {
				t.Fatalf("parseResponse(%.80q) = %d %q close=%t, %v; want %d %q close=%t", tc.in,
					r.status, r.body, r.close, err, tc.status, tc.body, tc.close)
			}
		})
	}
}

// TestParseResponseKeepAlive checks that answers on one connection are
// read one after another, each to exactly its end, into one reused
// buffer without allocating.
func TestParseResponseKeepAlive(t *testing.T) {
	answers := []struct {
		status int
		body   string
	}{{200, `{"seq":1}`}, {429, ""}, {204, ""}, {200, `{"seq":2,"more":true}`}}
	var in strings.Builder
	for _, a := range answers {
		if a.status == http.StatusNoContent {
			fmt.Fprintf(&in, "HTTP/1.1 %d %s\r\n\r\n", a.status, http.StatusText(a.status))
			continue
		}
		fmt.Fprintf(&in, "HTTP/1.1 %d %s\r\nContent-Length: %d\r\n\r\n%s", a.status, http.StatusText(a.status), len(a.body), a.body)
	}
	rd := strings.NewReader(in.String())
	br := bufio.NewReader(rd)
	buf := make([]byte, 0, 64)
	for _, a := range answers {
		r, err := parseResponse(br, buf)
		if err != nil || r.status != a.status || string(r.body) != a.body {
			t.Fatalf("parseResponse = %d %q, %v; want %d %q", r.status, r.body, err, a.status, a.body)
		}
	}
	if r, err := parseResponse(br, buf); err != io.EOF {
		t.Fatalf("parseResponse after the last answer = %d %q, %v; want io.EOF", r.status, r.body, err)
	}

	allocs := testing.AllocsPerRun(100, func() {
		rd.Reset(in.String())
		br.Reset(rd)
		for range answers {
			if _, err := parseResponse(br, buf); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("parseResponse of %d answers into a large enough buffer: %v allocations, want 0", len(answers), allocs)
	}
}

// FuzzParseResponse checks that parseResponse never panics on what a
// connection may send, and that whatever it accepts, net/http reads
// alike: same status, same body. It may refuse more than net/http does.
func FuzzParseResponse(f *testing.F) {
	for _, tc := range parseCases {
		f.Add([]byte(tc.in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := parseResponse(bufio.NewReader(bytes.NewReader(in)), nil)
		if err != nil {
			if !errors.Is(err, errBadResponse) && !errors.Is(err, errUnsupportedResponse) &&
				!errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("parseResponse(%q) = %v, want one of its documented errors", in, err)
			}
			return
		}
		if r.status < 200 || r.status > 999 || len(r.body) > maxRawBody {
			t.Fatalf("parseResponse(%q) = status %d, %d-byte body; want 200 to 999, at most %d bytes", in, r.status, len(r.body), maxRawBody)
		}
		want, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(in)), nil)
		if err != nil {
			return
		}
		body, err := io.ReadAll(want.Body)
		if err != nil {
			return
		}
		if r.status != want.StatusCode || !bytes.Equal(r.body, body) {
			t.Fatalf("parseResponse(%q) = %d %q; net/http reads %d %q", in, r.status, r.body, want.StatusCode, body)
		}
	})
}

// clientFor returns a raw client for baseURL, closed when the test ends.
func clientFor(t *testing.T, baseURL string) *rawClient {
	t.Helper()
	c, err := newRawClient(baseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return c
}

// TestRawClient sends the benchmark's transfer request through a real
// net/http server, which must read the same method, path, headers and
// body that net/http's client sent; and checks that the client keeps its
// connection, dials again after Connection: close and after an answer it
// refuses, and refuses a chunked one.
func TestRawClient(t *testing.T) {
	const from, to, nonce = "bench-from-0007", "bench-to-0007", uint64(12345)
	wantKey := fmt.Sprintf("%s-%d", from, nonce)
	wantBody := fmt.Sprintf(`{"from":%q,"to":%q,"amount":1,"nonce":%d}`, from, to, nonce)

	var mu sync.Mutex
	var remotes []string // of each request, in order
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		remotes = append(remotes, r.RemoteAddr)
		mu.Unlock()
		body, err := io.ReadAll(r.Body)
		if err != nil || r.Method != http.MethodPost || r.URL.Path != transferPath ||
			r.Header.Get("Idempotency-Key") != wantKey || r.Header.Get("Content-Type") != "application/json" ||
			r.ContentLength != int64(len(wantBody)) || string(body) != wantBody {
			http.Error(w, fmt.Sprintf("got %s %s key %q type %q length %d body %q (%v)", r.Method, r.URL.Path,
				r.Header.Get("Idempotency-Key"), r.Header.Get("Content-Type"), r.ContentLength, body, err), http.StatusBadRequest)
			return
		}
		switch r.URL.Query().Get("answer") {
		case "close":
			w.Header().Set("Connection", "close")
			http.Error(w, "draining", http.StatusServiceUnavailable)
		case "chunked":
			_, _ = io.WriteString(w, "part")
			w.(http.Flusher).Flush()
		default:
			_, _ = io.WriteString(w, `{"seq":1}`)
		}
	}))
	t.Cleanup(srv.Close)
	c := clientFor(t, srv.URL)

	send := func(query string) (int, string, error) {
		t.Helper()
		c.setPost(transferPath+query, appendTransferKey(nil, from, nonce), appendTransferBody(nil, from, to, nonce))
		code, body, err := c.do(t.Context())
		return code, string(body), err
	}
	steps := []struct {
		query  string
		status int
		body   string
		err    error
		redial bool // the next request comes from a new connection
	}{
		{query: "", status: 200, body: `{"seq":1}`},
		{query: "", status: 200, body: `{"seq":1}`},
		{query: "?answer=close", status: 503, body: "draining\n", redial: true},
		{query: "", status: 200, body: `{"seq":1}`},
		{query: "?answer=chunked", err: errUnsupportedResponse, redial: true},
		{query: "", status: 200, body: `{"seq":1}`},
	}
	for i, s := range steps {
		code, body, err := send(s.query)
		if s.err != nil {
			if !errors.Is(err, s.err) {
				t.Fatalf("step %d: POST %s = %d %q, %v; want error %v", i, s.query, code, body, err, s.err)
			}
		} else if err != nil || code != s.status || body != s.body {
			t.Fatalf("step %d: POST %s = %d %q, %v; want %d %q", i, s.query, code, body, err, s.status, s.body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(remotes); i++ {
		if redial := remotes[i] != remotes[i-1]; redial != steps[i-1].redial {
			t.Errorf("request %d came from %s after %s; want a new connection: %t", i, remotes[i], remotes[i-1], steps[i-1].redial)
		}
	}
}

func TestRawClientRefusesAddresses(t *testing.T) {
	for _, u := range []string{"http://localhost:8080", "https://127.0.0.1:8443", "http://127.0.0.1", "http://10.0.0.1:80",
		"http://127.0.0.1:80/api", "http://[::1]:80"} {
		if _, err := newRawClient(u); err == nil {
			t.Errorf("newRawClient(%q) = nil error, want one: it loads http://127.0.0.1:PORT only", u)
		}
	}
}

// TestRawClientGet sends setGet's request through a real net/http
// server, which must read a GET of the path and query with the Host the
// client dialled and no body, several times on one connection.
func TestRawClientGet(t *testing.T) {
	var mu sync.Mutex
	var remotes []string
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		remotes = append(remotes, r.RemoteAddr)
		mu.Unlock()
		body, err := io.ReadAll(r.Body)
		if err != nil || r.Method != http.MethodGet || r.URL.RequestURI() != "/hello/?q=1" ||
			r.Host != strings.TrimPrefix(srv.URL, "http://") || r.ContentLength != 0 || len(body) != 0 {
			http.Error(w, fmt.Sprintf("got %s %s host %q length %d body %q (%v)", r.Method, r.URL.RequestURI(),
				r.Host, r.ContentLength, body, err), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "hello")
	}))
	t.Cleanup(srv.Close)
	c := clientFor(t, srv.URL)
	c.setGet("/hello/?q=1")
	for i := range 3 {
		code, body, err := c.do(t.Context())
		if err != nil || code != http.StatusOK || string(body) != "hello" {
			t.Fatalf("GET %d = %d %q, %v; want 200 \"hello\"", i, code, body, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(remotes) != 3 || remotes[1] != remotes[0] || remotes[2] != remotes[0] {
		t.Errorf("requests came from %v; want three from one connection", remotes)
	}
}

// TestLoader runs the benchmarks' loader against a real server for a
// short round: every answer 200 is a measured request, and any other
// status is an error, not a measurement.
func TestLoader(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ok" {
			http.Error(w, "no", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		path string
		ok   bool
	}{{"/ok", true}, {"/bad", false}} {
		l := newLoader(t, srv.URL+tc.path, 4)
		var r loadResult
		l.run(t.Context(), 50*time.Millisecond, &r)
		l.close()
		if tc.ok && (r.n() == 0 || r.errors != 0 || r.elapsed <= 0) {
			t.Errorf("GET %s: %d measured, %d errors (first %v), elapsed %v; want some measured and none failed",
				tc.path, r.n(), r.errors, r.firstErr, r.elapsed)
		}
		if !tc.ok && (r.n() != 0 || r.errors == 0 || r.firstErr == nil || !strings.Contains(r.firstErr.Error(), "status 500")) {
			t.Errorf("GET %s: %d measured, %d errors (first %v); want none measured and status 500 errors",
				tc.path, r.n(), r.errors, r.firstErr)
		}
	}
}

// TestRawClientRedialsClosedIdle checks that a request on a kept-alive
// connection the server has closed goes once more on a new connection,
// and that one on a new connection that ends unanswered is not sent
// again.
func TestRawClientRedialsClosedIdle(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(srv.Close)
	c := clientFor(t, srv.URL)
	c.setGet("/")
	for i := range 2 {
		if code, body, err := c.do(t.Context()); err != nil || code != http.StatusOK || string(body) != "ok" {
			t.Fatalf("GET %d = %d %q, %v; want 200 \"ok\"", i, code, body, err)
		}
		// The server closes the connection the client keeps.
		srv.CloseClientConnections()
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan int)
	go func() {
		n := 0
		for {
			conn, err := ln.Accept()
			if err != nil {
				accepted <- n
				return
			}
			n++
			conn.Close()
		}
	}()
	c2 := clientFor(t, "http://"+ln.Addr().String())
	c2.setGet("/")
	if code, _, err := c2.do(t.Context()); err == nil {
		t.Errorf("GET from a server that closes at once = %d, nil error; want an error", code)
	}
	ln.Close()
	if n := <-accepted; n != 1 {
		t.Errorf("the client dialled %d times for one request on a new connection; want 1", n)
	}
}
