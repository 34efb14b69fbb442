package ingress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// frontFixture is a Front on a loopback listener with net/http serving
// what it hands over, as the host runs them.
type frontFixture struct {
	front *Front
	srv   *http.Server
	addr  string
}

func startFront(t testing.TB, h http.Handler, opts FrontOptions) *frontFixture {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveFront(t, ln, h, opts, &http.Server{Handler: h})
}

// serveFront serves h on ln behind a Front, with srv serving what it
// hands over, until the test ends.
func serveFront(t testing.TB, ln net.Listener, h http.Handler, opts FrontOptions, srv *http.Server) *frontFixture {
	t.Helper()
	if opts.Direct == nil {
		opts.Direct = func(string, string) bool { return true }
	}
	f := &frontFixture{front: NewFront(ln, h, opts), srv: srv, addr: ln.Addr().String()}
	HookServer(srv)
	served := make(chan error, 2)
	go func() { served <- f.front.Serve() }()
	go func() { served <- f.srv.Serve(f.front.Listener()) }()
	t.Cleanup(func() {
		f.srv.Close()
		f.front.Close()
		for range 2 {
			<-served
		}
	})
	return f
}

// dial opens a connection to the fixture that ends with the test.
func (f *frontFixture) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// servedBy answers with which server served the request: net/http puts
// itself in the request's context, the front does not.
var servedBy = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	by := "front"
	if r.Context().Value(http.ServerContextKey) != nil {
		by = "net/http"
	}
	body, _ := io.ReadAll(r.Body)
	fmt.Fprintf(w, "%s %s %s %q", by, r.Method, r.URL.RequestURI(), body)
})

func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }

func readAnswer(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading an answer's body: %v", err)
	}
	return resp, string(body)
}

// TestFrontHandsOver sends, on one connection, requests the front serves
// and one it does not, pipelined: the front serves the first two, and
// net/http the rest of the connection from the first it hands over,
// every answer in order.
func TestFrontHandsOver(t *testing.T) {
	f := startFront(t, servedBy, FrontOptions{})
	c := f.dial(t)
	reqs := "GET /a HTTP/1.1\r\nHost: x\r\n\r\n" +
		"GET /b?q=1 HTTP/1.1\r\nHost: x\r\n\r\n" +
		"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi" +
		"GET /d HTTP/1.1\r\nHost: x\r\n\r\n"
	if _, err := io.WriteString(c, reqs); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for _, want := range []string{`front GET /a ""`, `front GET /b?q=1 ""`, `net/http POST /c "hi"`, `net/http GET /d ""`} {
		if resp, body := readAnswer(t, br, ""); resp.StatusCode != 200 || body != want {
			t.Fatalf("answer = %d %q, want 200 %q", resp.StatusCode, body, want)
		}
	}
}

// TestFrontLeavesOddHeadsToNetHTTP sends heads the front does not serve
// and checks that each gets net/http's own answer.
func TestFrontLeavesOddHeadsToNetHTTP(t *testing.T) {
	f := startFront(t, servedBy, FrontOptions{})
	plain := httptest.NewServer(servedBy)
	t.Cleanup(plain.Close)
	for _, tc := range heads {
		if tc.direct || !strings.Contains(tc.head, "\r\n\r\n") && !strings.Contains(tc.head, "\n\n") {
			continue
		}
		got, want := rawAnswer(t, f.addr, tc.head), rawAnswer(t, plain.Listener.Addr().String(), tc.head)
		if got != want {
			t.Errorf("%q: front answered %q; net/http alone answers %q", tc.head, got, want)
		}
	}
}

// rawAnswer sends head on a new connection, half-closes it, and returns
// the status line of the first answer, or what ended the connection.
func rawAnswer(t *testing.T, addr, head string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, head)
	c.(*net.TCPConn).CloseWrite()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "connection ended: " + strings.TrimSuffix(err.Error(), "\n")
	}
	return strings.TrimSpace(line)
}

// answerCases are handlers whose answers the front must write as
// net/http does.
var answerCases = map[string]http.HandlerFunc{
	"plain": func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"greeting":"hi"}`)
	},
	"typed with length": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "2")
		w.Header().Add("X-Multi", "1")
		w.Header().Add("X-Multi", "2")
		w.WriteHeader(201)
		io.WriteString(w, "{}")
	},
	"empty": func(w http.ResponseWriter, r *http.Request) {},
	"error": func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "nope", http.StatusTeapot)
	},
	"unknown status": func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(599)
	},
	"no content": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		w.WriteHeader(204)
		if _, err := io.WriteString(w, "hello"); !errors.Is(err, http.ErrBodyNotAllowed) {
			panic(fmt.Sprintf("Write after 204 = %v", err))
		}
	},
	"not modified": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		w.Header().Set("ETag", `"x"`)
		w.WriteHeader(304)
	},
	"headers changed after WriteHeader": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Before", "1")
		w.WriteHeader(200)
		w.Header().Set("X-After", "1")
		io.WriteString(w, "body")
	},
	"hostile header values": func(w http.ResponseWriter, r *http.Request) {
		w.Header()["X-Split"] = []string{"a\r\nSet-Cookie: evil=1", "  padded\t"}
		w.Header()["Bad Name"] = []string{"x"}
		io.WriteString(w, "ok")
	},
	"own date": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Date", "Thu, 01 Jan 1970 00:00:00 GMT")
		io.WriteString(w, "ok")
	},
	"encoded, not sniffed": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		io.WriteString(w, "<html>")
	},
	"no type, not sniffed": func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil // net/http's "send none, sniff none"
		io.WriteString(w, "<html><body>hi</body></html>")
	},
	"html sniffed": func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "<html><body>hi</body></html>")
	},
	"asks to close": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "bye")
	},
	"large, unknown length": func(w http.ResponseWriter, r *http.Request) {
		for i := range 100 {
			fmt.Fprintf(w, "%04d%s\n", i, strings.Repeat("x", 95))
		}
	},
	"large, known length": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000")
		for range 100 {
			io.WriteString(w, strings.Repeat("y", 1000))
		}
	},
	"flushed": func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first ")
		http.NewResponseController(w).Flush()
		io.WriteString(w, "second")
	},
	"short of its length": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		io.WriteString(w, "short")
	},
	"past its length": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "2")
		io.WriteString(w, "ok")
		if _, err := io.WriteString(w, "more"); !errors.Is(err, http.ErrContentLength) {
			panic(fmt.Sprintf("Write past Content-Length = %v", err))
		}
	},
	"not modified, typed": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Header().Set("Content-Length", "5")
		w.WriteHeader(304)
	},
	"early hints": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.Header().Set("Content-Length", "2")
		w.WriteHeader(103)
		io.WriteString(w, "ok")
	},
	"type set after WriteHeader": func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.Header().Set("Content-Type", "text/x")
		io.WriteString(w, "<html>")
	},
	"one large write": func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 100<<10))
	},
	"aborted": func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "partial")
		panic(http.ErrAbortHandler)
	},
}

// TestFrontAnswersAsNetHTTP runs each handler behind the front and behind
// net/http alone, for GET, HEAD and GET with Connection: close, and checks
// that a client reads the same answers, and that the heads of answers not
// sent chunked are the same bytes but for the Date.
func TestFrontAnswersAsNetHTTP(t *testing.T) {
	quiet := func(h http.Handler) *http.Server {
		return &http.Server{Handler: h, ErrorLog: discardLog()}
	}
	for name, h := range answerCases {
		t.Run(name, func(t *testing.T) {
			f := startFront(t, h, FrontOptions{})
			plain := httptest.NewUnstartedServer(h)
			plain.Config = quiet(h)
			plain.Start()
			t.Cleanup(plain.Close)
			for _, req := range []string{
				"GET /x HTTP/1.1\r\nHost: a\r\n\r\n",
				"HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n",
				"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
			} {
				method := strings.Fields(req)[0]
				got := exchange(t, f.addr, req, method)
				want := exchange(t, plain.Listener.Addr().String(), req, method)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%q:\nfront    %+v\nnet/http %+v", req, got, want)
				}
			}
		})
	}
}

// exchanged is what a client sees of one answer on a connection, and of
// the connection after it.
type exchanged struct {
	Head        string // the raw head without its Date, unless chunked
	Status      int
	Header      http.Header
	Body        string
	BodyErr     string
	Length      int64
	Chunked     bool
	ClosedAfter bool
}

func exchange(t *testing.T, addr, req, method string) exchanged {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	var raw strings.Builder
	br := bufio.NewReader(io.TeeReader(c, &raw))
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		return exchanged{BodyErr: "no answer: " + err.Error()}
	}
	var e exchanged
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		e.BodyErr = err.Error()
	}
	e.Status, e.Body, e.Length = resp.StatusCode, string(body), resp.ContentLength
	e.Chunked = len(resp.TransferEncoding) > 0
	resp.Header.Del("Date")
	e.Header = resp.Header
	if !e.Chunked {
		head, _, _ := strings.Cut(raw.String(), "\r\n\r\n")
		var lines []string
		for l := range strings.SplitSeq(head, "\r\n") {
			if !strings.HasPrefix(l, "Date: ") {
				lines = append(lines, l)
			}
		}
		e.Head = strings.Join(lines, "\r\n")
	}
	// A second request on the same connection tells whether it is kept.
	io.WriteString(c, "GET /again HTTP/1.1\r\nHost: a\r\n\r\n")
	_, err = http.ReadResponse(br, &http.Request{Method: "GET"})
	e.ClosedAfter = err != nil
	return e
}

// TestFrontCancelsWhenClientGoes checks that a request the front serves
// is cancelled when its client goes away while it runs, during a drain
// too.
func TestFrontCancelsWhenClientGoes(t *testing.T) {
	for _, drain := range []bool{false, true} {
		started, cancelled := make(chan struct{}), make(chan struct{})
		f := startFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(started)
			select {
			case <-r.Context().Done():
				close(cancelled)
			case <-time.After(time.Minute):
			}
		}), FrontOptions{})
		c := f.dial(t)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		<-started
		if drain {
			go f.front.Shutdown(context.Background())
			for !f.front.draining.Load() {
				time.Sleep(time.Millisecond)
			}
		}
		c.Close()
		select {
		case <-cancelled:
		case <-time.After(30 * time.Second):
			t.Fatalf("the request was not cancelled 30s after its client went away (during a drain: %v)", drain)
		}
	}
}

// TestFrontKeepsWatchedByte checks that a request pipelined behind one
// that runs long enough to be watched is served whole, whether the front
// serves it or hands it to net/http: the watcher reads its first byte,
// and the front does not lose it.
func TestFrontKeepsWatchedByte(t *testing.T) {
	for _, next := range []string{
		"GET /next HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /next HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbody",
	} {
		watching, read := make(chan struct{}), make(chan struct{})
		frontWatchHook = func(event string) {
			map[string]chan struct{}{"watching": watching, "read": read}[event] <- struct{}{}
		}
		t.Cleanup(func() { frontWatchHook = nil })
		f := startFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				select {
				case <-read:
				case <-r.Context().Done():
					return
				}
			}
			servedBy(w, r)
		}), FrontOptions{})
		c := f.dial(t)
		io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
		<-watching
		io.WriteString(c, next)
		br := bufio.NewReader(c)
		method := strings.Fields(next)[0]
		by := map[string]string{"GET": "front", "POST": "net/http"}[method]
		for _, want := range []string{`front GET /slow ""`, fmt.Sprintf("%s %s /next %q", by, method, map[string]string{"GET": "", "POST": "body"}[method])} {
			if resp, body := readAnswer(t, br, "GET"); resp.StatusCode != 200 || body != want {
				t.Fatalf("answer = %d %q, want 200 %q", resp.StatusCode, body, want)
			}
		}
	}
}

// TestFrontShutdown checks that Shutdown closes an idle connection at
// once, lets a request in progress finish with Connection: close, and
// returns once it has.
func TestFrontShutdown(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	f := startFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			close(started)
			<-release
		}
		io.WriteString(w, "done")
	}), FrontOptions{})
	idle := f.dial(t)
	io.WriteString(idle, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	idleBr := bufio.NewReader(idle)
	readAnswer(t, idleBr, "GET")
	busy := f.dial(t)
	io.WriteString(busy, "GET /hold HTTP/1.1\r\nHost: a\r\n\r\n")
	<-started

	shut := make(chan error, 1)
	go func() { shut <- f.front.Shutdown(context.Background()) }()
	if _, err := idleBr.ReadByte(); err == nil {
		t.Fatal("the idle connection stayed open after Shutdown")
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a request in progress", err)
	default:
	}
	close(release)
	resp, body := readAnswer(t, bufio.NewReader(busy), "GET")
	if body != "done" || !resp.Close {
		t.Errorf("answer during Shutdown = %q, Connection: close %v; want done, true", body, resp.Close)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown = %v", err)
	}
	if _, err := net.Dial("tcp", f.addr); err == nil {
		t.Error("the front accepted a connection after Shutdown")
	}
}

// TestFrontHeadTimeout checks that a connection whose head does not
// arrive within ReadHeaderTimeout is closed.
func TestFrontHeadTimeout(t *testing.T) {
	f := startFront(t, servedBy, FrontOptions{ReadHeaderTimeout: 50 * time.Millisecond})
	c := f.dial(t)
	io.WriteString(c, "GET / HTTP/1.1\r\nHo")
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("reading the connection after a partial head: %v, want it closed", err)
	}
}

// TestFrontHeadTimeoutAcrossHandOff checks that a head the front began
// to read and handed to net/http unfinished (longer than the front's
// buffer) is due when it was due at the front, not a new timeout later:
// net/http here would wait an hour for it.
func TestFrontHeadTimeoutAcrossHandOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := serveFront(t, ln, servedBy, FrontOptions{ReadHeaderTimeout: time.Second}, &http.Server{Handler: servedBy, ReadHeaderTimeout: time.Hour})
	c := f.dial(t)
	// A GET head the front would serve, but longer than its buffer: it
	// goes to net/http once the buffer is full, and never ends.
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\nX-Long: "+strings.Repeat("x", frontBuffer)+"\r\n")
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("reading the connection after a head left unfinished: %v, want it closed at the front's head timeout", err)
	}
}

// TestFrontHeadCutShort checks that a head the client ends its side
// within is answered as net/http answers it, a 400, on a first request
// and on one after another on the same connection.
func TestFrontHeadCutShort(t *testing.T) {
	f := startFront(t, servedBy, FrontOptions{})
	for _, before := range []string{"", "GET / HTTP/1.1\r\nHost: a\r\n\r\n"} {
		c := f.dial(t)
		io.WriteString(c, before+"GET / HTTP/1.1\r\nHo")
		c.(*net.TCPConn).CloseWrite()
		br := bufio.NewReader(c)
		if before != "" {
			if _, body := readAnswer(t, br, "GET"); !strings.HasPrefix(body, "front ") {
				t.Fatalf("first answer %q, want the front's", body)
			}
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("after a head cut short (following %q): %v, want a 400", before, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("after a head cut short (following %q): %s, want 400", before, resp.Status)
		}
	}
}

// finConn is an accepted connection whose client ends its side just as
// the front stops the connection's watcher (the read deadline in the
// past), and which waits for the watcher to see it.
type finConn struct {
	net.Conn
	once sync.Once
	fin  func()
}

func (c *finConn) SetReadDeadline(t time.Time) error {
	if t.Equal(aLongTimeAgo) {
		c.once.Do(c.fin)
	}
	return c.Conn.SetReadDeadline(t)
}

type finListener struct {
	net.Listener
	fin func()
}

func (l finListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &finConn{Conn: c, fin: l.fin}, nil
}

// TestFrontEndedContextServesNoMore checks that a request buffered behind
// one whose client went away as its answer was written is not served
// with the connection's ended context: the connection closes instead.
func TestFrontEndedContextServesNoMore(t *testing.T) {
	watching := make(chan struct{}, 1)
	frontWatchHook = func(event string) {
		if event == "watching" {
			watching <- struct{}{}
		}
	}
	t.Cleanup(func() { frontWatchHook = nil })
	client := make(chan *net.TCPConn, 1)
	slowCtx := make(chan context.Context, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The client's end reaches the watcher, which cancels the context,
	// before the front goes on.
	fin := func() {
		(<-client).CloseWrite()
		select {
		case ctx := <-slowCtx:
			<-ctx.Done()
		case <-time.After(time.Minute):
		}
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			slowCtx <- r.Context()
			<-watching
		}
		fmt.Fprintf(w, "%s %v", r.URL.Path, r.Context().Err())
	})
	f := serveFront(t, finListener{Listener: ln, fin: fin}, h, FrontOptions{}, &http.Server{Handler: h})
	c := f.dial(t)
	client <- c.(*net.TCPConn)
	io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n")
	br := bufio.NewReader(c)
	if _, body := readAnswer(t, br, "GET"); body != "/slow <nil>" {
		t.Fatalf("first answer %q, want /slow served", body)
	}
	if resp, err := http.ReadResponse(br, nil); err == nil {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("the request after the client went away was served: %q; want the connection closed", b)
	}
}

// TestFrontRequestsStartClean checks that what a handler sets on one
// request (a path value, a field) is not seen by the next on the same
// connection, whose Request the front makes from the same memory.
func TestFrontRequestsStartClean(t *testing.T) {
	f := startFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%q %q %q %d", r.PathValue("x"), r.Pattern, r.Form.Get("y"), r.ContentLength)
		r.SetPathValue("x", "set")
		r.Pattern, r.Form, r.ContentLength = "/set", url.Values{"y": {"set"}}, 5
	}), FrontOptions{})
	c := f.dial(t)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
	br := bufio.NewReader(c)
	for i := range 2 {
		if _, body := readAnswer(t, br, "GET"); body != `"" "" "" 0` {
			t.Fatalf("request %d saw %s, want nothing the first set", i+1, body)
		}
	}
}

// TestFrontDropsInvalidLength checks that a handler's Content-Length that
// is not a length is left out, and the answer framed by its real one.
func TestFrontDropsInvalidLength(t *testing.T) {
	f := startFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "-1")
		io.WriteString(w, "ok")
	}), FrontOptions{})
	c := f.dial(t)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
	br := bufio.NewReader(c)
	for range 2 {
		if resp, body := readAnswer(t, br, "GET"); resp.ContentLength != 2 || body != "ok" {
			t.Fatalf("answer = Content-Length %d %q, want 2 ok", resp.ContentLength, body)
		}
	}
}

// BenchmarkFront sends GETs one after another on one kept-alive
// connection to a handler behind the front and behind net/http alone,
// from the same raw client; -benchmem gives each server's allocations
// per request (the client's are the same in both).
func BenchmarkFront(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"greeting":"hi"}`)
	})
	const req = "GET /hello/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
	run := func(b *testing.B, addr string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, 4096)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := io.WriteString(c, req); err != nil {
				b.Fatal(err)
			}
			// Every answer here is one read's worth, ending in its body.
			n, err := c.Read(buf)
			if err != nil || !strings.HasSuffix(string(buf[:n]), `"hi"}`) {
				b.Fatalf("answer %q, %v", buf[:n], err)
			}
		}
	}
	b.Run("front", func(b *testing.B) {
		f := startFront(b, h, FrontOptions{ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute, WriteTimeout: time.Minute})
		run(b, f.addr)
	})
	b.Run("net/http", func(b *testing.B) {
		srv := httptest.NewUnstartedServer(h)
		srv.Config.ReadTimeout, srv.Config.WriteTimeout, srv.Config.IdleTimeout = time.Minute, time.Minute, time.Minute
		srv.Start()
		b.Cleanup(srv.Close)
		run(b, srv.Listener.Addr().String())
	})
}

// TestFrontWriteTimeout checks that an answer to a client that does not
// read fails once WriteTimeout has passed since the request's head,
// rather than block its handler.
func TestFrontWriteTimeout(t *testing.T) {
	failed := make(chan error, 1)
	f := startFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		piece := make([]byte, 64<<10)
		for range 1024 { // 64 MiB: more than the socket buffers hold
			if _, err := w.Write(piece); err != nil {
				failed <- err
				return
			}
		}
		failed <- nil
	}), FrontOptions{WriteTimeout: 100 * time.Millisecond})
	c := f.dial(t)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	select {
	case err := <-failed:
		if err == nil {
			t.Fatal("64 MiB went to a client that reads nothing")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's writes to a client that reads nothing still block 30s on")
	}
}

// TestFrontKeepsNoHandlerSlice checks that the front keeps none of the
// slices a handler writes: a handler may reuse its buffer once Write
// returns, and the next answer on the connection must not be built in it.
func TestFrontKeepsNoHandlerSlice(t *testing.T) {
	var mine []byte
	f := startFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/mine" {
			w.Write(make([]byte, 40<<10)) // the head goes out with it
			mine = make([]byte, 8<<10)
			w.Write(mine)
			return
		}
		io.WriteString(w, "next")
	}), FrontOptions{})
	c := f.dial(t)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /mine HTTP/1.1\r\nHost: a\r\n\r\n")
	readAnswer(t, br, "GET")
	io.WriteString(c, "GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
	readAnswer(t, br, "GET")
	if !bytes.Equal(mine, make([]byte, 8<<10)) {
		t.Fatalf("the handler's buffer was written into after its Write: %q...", mine[:40])
	}
}

// TestFrontIdleConnHoldsLittle checks that a connection idle after a large
// answer keeps at most frontKeep of each of its buffers.
func TestFrontIdleConnHoldsLittle(t *testing.T) {
	f := startFront(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Big", strings.Repeat("h", 20<<10))
		io.WriteString(w, strings.Repeat("b", 30<<10))
	}), FrontOptions{})
	c := f.dial(t)
	br := bufio.NewReader(c)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	readAnswer(t, br, "GET")
	// The answer is read, so the connection has gone idle or is about to.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var held []int
		f.front.mu.Lock()
		for fc := range f.front.conns {
			fc.mu.Lock()
			if fc.state == stateIdle {
				// Its buffers settle before it goes idle.
				held = []int{cap(fc.out), cap(fc.fields), cap(fc.body)}
			}
			fc.mu.Unlock()
		}
		f.front.mu.Unlock()
		if held != nil {
			for _, n := range held {
				if n > frontKeep {
					t.Fatalf("an idle connection holds buffers of %v bytes, want each at most %d", held, frontKeep)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection did not go idle within 10s of its answer")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFrontShutdownClosesEveryIdleConn checks that Shutdown closes every
// idle connection, including those going idle as it runs, and returns.
func TestFrontShutdownClosesEveryIdleConn(t *testing.T) {
	f := startFront(t, servedBy, FrontOptions{IdleTimeout: time.Hour, ReadHeaderTimeout: time.Hour})
	var conns []*bufio.Reader
	for range 100 {
		c := f.dial(t)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		conns = append(conns, bufio.NewReader(c))
	}
	// Every connection has been accepted and answered (a connection the
	// listener had not accepted would be reset when it closes); some are
	// still on their way to idle.
	for _, br := range conns {
		readAnswer(t, br, "GET")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.front.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown = %v, want every idle connection closed well before the idle timeout", err)
	}
	for i, br := range conns {
		if _, err := br.ReadByte(); err == nil {
			t.Fatalf("connection %d is still open after Shutdown", i)
		}
	}
}
