//go:build unix

package dataplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	host "github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/sdk/internal/dataplane"
	"github.com/plughost/plughost/sdk/internal/wiretest"
	"github.com/plughost/plughost/sdk/wire"
)

// The tests here run both sides of the data plane together over a real
// socket pair: Serve on the plugin's end, host/dataplane's Transport on
// the host's. host/dataplane's own tests drive the host's side against a
// fake plugin for the protocol's edges.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitTime bounds every wait in these tests; it only keeps a broken data
// plane from hanging them.
const waitTime = 10 * time.Second

// plane is a handler served with Serve on one end of a socket pair and a
// host Transport on the other.
type plane struct {
	tr host.Transport
	// hostEnd and pluginEnd are the sockets under the two sides' Conns,
	// for tests that break them.
	hostEnd, pluginEnd net.Conn
	logs               *wiretest.SyncBuffer

	served   chan struct{} // closed when Serve has returned
	serveErr error
	// calls waits for the goroutines the test starts with goCall.
	calls sync.WaitGroup
}

// servePlane serves h as a plugin would, and returns the host's side.
// Cleanup closes the Transport, waits for Serve to return (which waits for
// the handlers) and for the test's calls.
func servePlane(t *testing.T, h http.Handler) *plane {
	t.Helper()
	return servePlaneInline(t, h, nil)
}

// servePlaneInline is servePlane with Options.Inline set to inline.
func servePlaneInline(t *testing.T, h http.Handler, inline func(pattern string) bool) *plane {
	t.Helper()
	hc, pc := wiretest.SocketPair(t)
	p := &plane{hostEnd: hc, pluginEnd: pc, logs: &wiretest.SyncBuffer{}, served: make(chan struct{})}
	opts := dataplane.Options{
		Handler: h,
		Error:   writeError,
		Logger:  hclog.New(&hclog.LoggerOptions{Output: p.logs, JSONFormat: true}),
		Inline:  inline,
	}
	conn := wire.NewConn(pc)
	go func() {
		defer close(p.served)
		p.serveErr = dataplane.Serve(context.Background(), conn, opts)
	}()
	p.tr = host.New([]*wire.Conn{wire.NewConn(hc)})
	t.Cleanup(func() {
		p.tr.Close()
		select {
		case <-p.served:
		case <-time.After(waitTime):
			t.Errorf("Serve did not return within %v of the host closing the connection", waitTime)
		}
		p.calls.Wait()
	})
	return p
}

// wait waits for Serve to return and returns its error.
func (p *plane) wait(t *testing.T) error {
	t.Helper()
	await(t, p.served, "Serve to return")
	return p.serveErr
}

// goCall runs fn in a goroutine that the cleanup waits for.
func (p *plane) goCall(fn func()) { p.calls.Go(fn) }

// reply is a whole response.
type reply struct {
	status int
	header http.Header
	size   int64
	pieces [][]byte
}

func (r *reply) body() []byte { return bytes.Join(r.pieces, nil) }

// do sends req and reads the whole response. A failure of the body comes
// back with what was read before it.
func (p *plane) do(ctx context.Context, req *host.Request) (*reply, error) {
	resp, err := p.tr.RoundTrip(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Close()
	r := &reply{status: resp.Status, header: resp.Header, size: resp.Size}
	for {
		b, err := resp.Next()
		if err == io.EOF {
			return r, nil
		}
		if err != nil {
			return r, err
		}
		r.pieces = append(r.pieces, b)
	}
}

// goDo runs do in a goroutine.
func (p *plane) goDo(ctx context.Context, req *host.Request) <-chan result {
	ch := make(chan result, 1)
	p.goCall(func() {
		r, err := p.do(ctx, req)
		ch <- result{r, err}
	})
	return ch
}

type result struct {
	reply *reply
	err   error
}

// await returns what ch receives, failing the test after waitTime.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTime):
		t.Fatalf("timed out after %v waiting for %s", waitTime, what)
		var zero T
		return zero
	}
}

// writeError writes an error body of the platform's shape, as the sdk's
// does.
func writeError(w http.ResponseWriter, code int, errCode, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"error":{"code":%q,"message":%q}}`+"\n", errCode, msg)
}

// errorCode returns the code of a JSON error body.
func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", body, err)
	}
	return e.Error.Code
}

// pattern returns n bytes of a pattern that shows where a piece went
// astray.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// readReport is what bodyHandler found in a request body.
type readReport struct {
	Len           int
	Intact        bool
	MaxRead       int
	Reads         int
	ContentLength int64
}

// bodyHandler reads the request body in reads of up to two pieces, reports
// what it found in the X-Report header, and answers with respLen bytes of
// pattern.
func bodyHandler(respLen int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rep := readReport{ContentLength: r.ContentLength}
		var got []byte
		buf := make([]byte, 2*wire.PieceBytes)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				rep.Reads++
				rep.MaxRead = max(rep.MaxRead, n)
				got = append(got, buf[:n]...)
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		rep.Len = len(got)
		rep.Intact = bytes.Equal(got, pattern(len(got)))
		b, _ := json.Marshal(rep)
		w.Header().Set("X-Report", string(b))
		w.Write(pattern(respLen))
	})
}

func TestUnary(t *testing.T) {
	const large = 3<<20 + 3 // several MiB, not a multiple of a piece
	tests := []struct {
		name      string
		reqLen    int
		reqHeader http.Header
		respLen   int
		// want is what the handler finds; MaxRead and Reads are checked
		// separately.
		want readReport
	}{
		{name: "empty both ways", want: readReport{Intact: true}},
		{name: "small both ways", reqLen: 100, respLen: 100, want: readReport{Len: 100, Intact: true, ContentLength: 100}},
		{name: "a piece both ways", reqLen: wire.PieceBytes, respLen: wire.PieceBytes,
			want: readReport{Len: wire.PieceBytes, Intact: true, ContentLength: wire.PieceBytes}},
		{name: "large request body", reqLen: large, respLen: 10,
			want: readReport{Len: large, Intact: true, ContentLength: -1}},
		{name: "large request body with its length", reqLen: large, reqHeader: http.Header{"Content-Length": {strconv.Itoa(large)}}, respLen: 10,
			want: readReport{Len: large, Intact: true, ContentLength: large}},
		{name: "large response body", reqLen: 10, respLen: large, want: readReport{Len: 10, Intact: true, ContentLength: 10}},
		{name: "large both ways", reqLen: large, respLen: large, want: readReport{Len: large, Intact: true, ContentLength: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := servePlane(t, bodyHandler(tt.respLen))
			r, err := p.do(t.Context(), &host.Request{Method: "POST", Path: "/", Header: tt.reqHeader, Body: [][]byte{pattern(tt.reqLen)}})
			if err != nil {
				t.Fatalf("do(%d-byte body) = %v", tt.reqLen, err)
			}
			if r.status != http.StatusOK {
				t.Errorf("status = %d, want 200; body %q", r.status, r.body())
			}
			var got readReport
			if err := json.Unmarshal([]byte(r.header.Get("X-Report")), &got); err != nil {
				t.Fatalf("X-Report %q: %v", r.header.Get("X-Report"), err)
			}
			// The body comes as it travels: in pieces, none larger
			// than wire.PieceBytes.
			if got.MaxRead > wire.PieceBytes || got.Reads < tt.reqLen/wire.PieceBytes {
				t.Errorf("handler read the body in %d reads of at most %d bytes, want at least %d of at most %d",
					got.Reads, got.MaxRead, tt.reqLen/wire.PieceBytes, wire.PieceBytes)
			}
			got.MaxRead, got.Reads = 0, 0
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("request body seen by the handler mismatch (-want +got):\n%s", diff)
			}
			if r.size != int64(tt.respLen) {
				t.Errorf("Response.Size = %d, want %d: an ordinary route's length is known", r.size, tt.respLen)
			}
			for i, b := range r.pieces {
				if len(b) > wire.PieceBytes {
					t.Errorf("piece %d has %d bytes, want at most %d", i, len(b), wire.PieceBytes)
				}
			}
			if body := r.body(); !bytes.Equal(body, pattern(tt.respLen)) {
				t.Errorf("response body has %d bytes, want the %d written, intact", len(body), tt.respLen)
			}
		})
	}
}

func TestStreamingFlush(t *testing.T) {
	flushed := wiretest.NewGate(t)
	finished := make(chan struct{})
	p := servePlane(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(finished)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		flushed.Wait(r) // the host must see "first" before we go on
		io.WriteString(w, "second\n")
		w.(http.Flusher).Flush()
		io.WriteString(w, "third\n")
	}))
	ctx, cancel := context.WithTimeout(t.Context(), waitTime)
	defer cancel()
	resp, err := p.tr.RoundTrip(ctx, &host.Request{Method: "GET", Path: "/events", Streaming: true})
	if err != nil {
		t.Fatalf("RoundTrip() = %v", err)
	}
	defer resp.Close()
	first, err := resp.Next()
	if err != nil {
		t.Fatalf("first Next() = %v", err)
	}
	select {
	case <-finished:
		t.Fatal("handler finished before the host got the first piece")
	default:
	}
	if resp.Status != http.StatusAccepted || string(first) != "first\n" || resp.Size != -1 {
		t.Errorf("first piece = status %d size %d data %q, want status %d size -1 data %q", resp.Status, resp.Size, first, http.StatusAccepted, "first\n")
	}
	if diff := cmp.Diff(http.Header{"Content-Type": {"text/event-stream"}}, resp.Header); diff != "" {
		t.Errorf("headers mismatch (-want +got):\n%s", diff)
	}
	flushed.Open()
	var rest []string
	for {
		b, err := resp.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Next() = %v, want the rest of the stream", err)
		}
		rest = append(rest, string(b))
	}
	if diff := cmp.Diff([]string{"second\n", "third\n"}, rest); diff != "" {
		t.Errorf("pieces after the first mismatch (-want +got):\n%s", diff)
	}
	await(t, finished, "the handler to finish")
}

func TestPanic(t *testing.T) {
	tests := []struct {
		name      string
		streaming bool
		handler   http.HandlerFunc
		// wantStatus is 0 when RoundTrip fails.
		wantStatus int
		wantBody   string // "internal" checks the JSON error code
		wantErr    error
		wantLog    bool
	}{
		{
			name:       "before writing",
			handler:    func(http.ResponseWriter, *http.Request) { panic("boom") },
			wantStatus: 500, wantBody: "internal", wantLog: true,
		},
		{
			// An ordinary route sends nothing before the handler
			// returns, Flush or not: all of it is replaced.
			name: "after flushing on an ordinary route",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Partial", "yes")
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic("boom")
			},
			wantStatus: 500, wantBody: "internal", wantLog: true,
		},
		{
			name:      "after writing on a streaming route, before flushing",
			streaming: true,
			handler: func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, "partial")
				panic("boom")
			},
			wantStatus: 500, wantBody: "internal", wantLog: true,
		},
		{
			name:      "after flushing on a streaming route",
			streaming: true,
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic("boom")
			},
			wantStatus: 202, wantBody: "partial", wantErr: host.ErrAborted, wantLog: true,
		},
		{
			name: "http.ErrAbortHandler on an ordinary route",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, "half")
				panic(http.ErrAbortHandler)
			},
			wantErr: host.ErrAborted,
		},
		{
			name:      "http.ErrAbortHandler after flushing",
			streaming: true,
			handler: func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			},
			wantStatus: 200, wantBody: "partial", wantErr: host.ErrAborted,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := servePlane(t, tt.handler)
			r, err := p.do(t.Context(), &host.Request{Method: "GET", Path: "/", Streaming: tt.streaming})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("do() = %v, want %v", err, tt.wantErr)
			}
			switch {
			case tt.wantStatus == 0:
				if r != nil {
					t.Errorf("do() = status %d, want no response", r.status)
				}
			case r == nil:
				t.Errorf("do() = no response, want status %d", tt.wantStatus)
			default:
				if r.status != tt.wantStatus {
					t.Errorf("status = %d, want %d", r.status, tt.wantStatus)
				}
				if tt.wantBody == "internal" {
					if got := errorCode(t, r.body()); got != "internal" {
						t.Errorf("error code = %q, want internal", got)
					}
					if r.header.Get("X-Partial") != "" {
						t.Errorf("headers = %v, want the handler's dropped", r.header)
					}
				} else if string(r.body()) != tt.wantBody {
					t.Errorf("body = %q, want %q", r.body(), tt.wantBody)
				}
			}
			// The handler's panic is logged before its response is sent.
			if got := strings.Contains(p.logs.String(), "handler panicked"); got != tt.wantLog {
				t.Errorf("log has a %q record: %t, want %t; log:\n%s", "handler panicked", got, tt.wantLog, p.logs)
			}
			p.tr.Close()
			if err := p.wait(t); err != nil {
				t.Errorf("Serve() = %v, want nil once the host closes", err)
			}
		})
	}
}

func TestBadRequest(t *testing.T) {
	p := servePlane(t, bodyHandler(0))
	r, err := p.do(t.Context(), &host.Request{Method: "BAD METHOD", Path: "/"})
	if err != nil {
		t.Fatalf("do(BAD METHOD) = %v", err)
	}
	if r.status != http.StatusBadRequest || errorCode(t, r.body()) != "bad_request" {
		t.Errorf("do(BAD METHOD) = %d %q, want 400 bad_request", r.status, r.body())
	}
}

// TestUnencodableResponse checks that a response the plugin cannot encode
// (a header value that is not UTF-8) is aborted at once rather than left
// for the host's deadline.
func TestUnencodableResponse(t *testing.T) {
	p := servePlane(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Name", "caf\xe9")
		io.WriteString(w, "body")
	}))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err := p.do(ctx, &host.Request{Method: "GET", Path: "/"})
	if !errors.Is(err, host.ErrAborted) {
		t.Errorf("do() = %v, want host.ErrAborted", err)
	}
	if took := time.Since(start); took > waitTime {
		t.Errorf("do() took %v, want an answer at once", took)
	}
	if !strings.Contains(p.logs.String(), "cannot send a response frame") {
		t.Errorf("plugin log lacks the failed frame:\n%s", p.logs)
	}
}

// TestFlowControl checks that a handler streaming to a host that does not
// read stalls once it has spent its credit, and goes on when the host
// reads.
func TestFlowControl(t *testing.T) {
	const total = 4 << 20
	const write = 16 << 10
	var written atomic.Int64
	finished := make(chan error, 1)
	p := servePlane(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := pattern(total)
		for len(b) > 0 {
			n, err := w.Write(b[:write])
			written.Add(int64(n))
			if err != nil {
				finished <- err
				return
			}
			b = b[write:]
		}
		finished <- nil
	}))
	resp, err := p.tr.RoundTrip(t.Context(), &host.Request{Method: "GET", Path: "/", Streaming: true})
	if err != nil {
		t.Fatalf("RoundTrip() = %v", err)
	}
	defer resp.Close()

	// The handler gets as far as its window and one piece in its buffer,
	// then stops: written stays put for a while, below the bound.
	const bound = wire.ResponseWindow + wire.PieceBytes
	const still = 200 * time.Millisecond
	last, since := written.Load(), time.Now()
	for end := time.Now().Add(waitTime); ; {
		time.Sleep(5 * time.Millisecond)
		n := written.Load()
		if n > bound {
			t.Fatalf("handler wrote %d bytes to a host that reads nothing, want it stalled by %d", n, bound)
		}
		if n != last {
			last, since = n, time.Now()
		}
		if n >= wire.ResponseWindow && time.Since(since) >= still {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("handler wrote %d bytes, still moving or below the %d-byte window after %v", n, wire.ResponseWindow, waitTime)
		}
	}
	select {
	case err := <-finished:
		t.Fatalf("handler finished (%v) with %d of %d bytes written", err, written.Load(), total)
	default:
	}

	readIntact(t, resp, total, finished)
}

// TestFlowControlUnevenChunks checks that a handler never has more of its
// response sent than its window while the host grants none of it back,
// when the pieces it flushes do not divide the window: the last piece
// that fits leaves some credit, too little for the next, which must wait
// for more rather than overrun the window.
func TestFlowControlUnevenChunks(t *testing.T) {
	const (
		// window is below wire.ResponseWindow, all that the host holds
		// a plugin to whatever window the request named, so that an
		// overrun is the plugin's count's to catch rather than a breach
		// the host cancels the request for.
		window = 64 << 10
		chunk  = 3000 // 21 fit in the window, leaving 2,536 bytes of credit
		total  = 100 * chunk
		fits   = window / chunk * chunk
	)
	var sent atomic.Int64 // the bytes of the Flushes that have returned
	writers := make(chan http.ResponseWriter, 1)
	finished := make(chan error, 1)
	p := servePlane(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writers <- w
		b := pattern(total)
		for len(b) > 0 {
			if _, err := w.Write(b[:chunk]); err != nil {
				finished <- err
				return
			}
			w.(http.Flusher).Flush()
			sent.Add(chunk)
			b = b[chunk:]
		}
		finished <- nil
	}))
	resp, err := p.tr.RoundTrip(t.Context(), &host.Request{Method: "GET", Path: "/", Streaming: true, Window: window})
	if err != nil {
		t.Fatalf("RoundTrip() = %v", err)
	}
	defer resp.Close()
	w := await(t, writers, "the handler to start")

	// The host reads nothing, so it grants nothing: once the handler has
	// waited for credit, it waits for good, and what it sent before is
	// all it sends.
	for deadline := time.Now().Add(waitTime); !dataplane.WaitedForCredit(w); time.Sleep(time.Millisecond) {
		select {
		case err := <-finished:
			t.Fatalf("handler finished (%v) having sent %d bytes to a host that reads nothing, want it stalled by its %d-byte window",
				err, sent.Load(), window)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("handler sent %d bytes in %d-byte chunks and did not wait for credit within %v, want it stalled by its %d-byte window",
				sent.Load(), chunk, waitTime, window)
		}
	}
	if n := sent.Load(); n > window {
		t.Fatalf("plugin sent %d bytes with none granted back, want at most its %d-byte window", n, window)
	} else if n != fits {
		t.Errorf("plugin sent %d bytes before it waited for credit, want the %d of the %d-byte chunks its %d-byte window holds",
			n, fits, chunk, window)
	}

	readIntact(t, resp, total, finished)
}

// readIntact reads resp to its end as the host does once it grants
// credit again, checks it holds the pattern(total) the handler wrote, and
// waits for the handler to report on finished that its writes succeeded.
func readIntact(t *testing.T, resp *host.Response, total int, finished <-chan error) {
	t.Helper()
	var got []byte
	for {
		b, err := resp.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Next() after %d bytes = %v", len(got), err)
		}
		got = append(got, b...)
	}
	if !bytes.Equal(got, pattern(total)) {
		t.Errorf("host read %d bytes, want the %d written, intact", len(got), total)
	}
	if err := await(t, finished, "the handler to finish"); err != nil {
		t.Errorf("handler's Write() = %v once the host read, want nil", err)
	}
}

// streamUntilFail is a handler that streams until a write fails, as one
// that ignores its context would, and reports the write's error and its
// context's once that has ended. It gives up after waitTime, so that a broken data plane fails
// the test rather than hanging it.
func streamUntilFail(started chan<- struct{}, ended chan<- [2]error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		close(started)
		for end := time.Now().Add(waitTime); time.Now().Before(end); {
			if _, err := io.WriteString(w, "tick\n"); err != nil {
				// A write may fail for a broken connection before
				// Serve has noticed and ended the context.
				select {
				case <-r.Context().Done():
				case <-time.After(waitTime):
				}
				ended <- [2]error{r.Context().Err(), err}
				return
			}
			w.(http.Flusher).Flush()
		}
		ended <- [2]error{r.Context().Err(), nil}
	})
}

func TestGiveUpMidStream(t *testing.T) {
	tests := []struct {
		name    string
		giveUp  func(cancel context.CancelFunc, resp *host.Response) error
		wantErr error
	}{
		{
			name: "context cancelled",
			giveUp: func(cancel context.CancelFunc, resp *host.Response) error {
				cancel()
				// The transport notices when the caller next reads.
				for {
					if _, err := resp.Next(); err != nil {
						return err
					}
				}
			},
			wantErr: context.Canceled,
		},
		{
			name:   "response closed",
			giveUp: func(_ context.CancelFunc, resp *host.Response) error { resp.Close(); return nil },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			started := make(chan struct{})
			ended := make(chan [2]error, 1)
			p := servePlane(t, streamUntilFail(started, ended))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			resp, err := p.tr.RoundTrip(ctx, &host.Request{Method: "GET", Path: "/", Streaming: true})
			if err != nil {
				t.Fatalf("RoundTrip() = %v", err)
			}
			if b, err := resp.Next(); err != nil || string(b) != "first\n" {
				t.Fatalf("first Next() = %q, %v", b, err)
			}
			await(t, started, "the handler to stream")
			if err := tt.giveUp(cancel, resp); !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("giving up = %v, want %v", err, tt.wantErr)
			}
			got := await(t, ended, "the handler to stop")
			if !errors.Is(got[0], context.Canceled) {
				t.Errorf("handler's r.Context().Err() = %v, want %v", got[0], context.Canceled)
			}
			if got[1] == nil {
				t.Errorf("handler's Write() = nil for %v after the host gave up, want an error", waitTime)
			}
		})
	}
}

func TestDeadline(t *testing.T) {
	deadlines := make(chan time.Time, 1)
	ended := make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/deadline", func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		if !ok {
			dl = time.Time{}
		}
		deadlines <- dl
	})
	mux.HandleFunc("/block", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		ended <- r.Context().Err()
	})
	p := servePlane(t, mux)

	t.Run("travels", func(t *testing.T) {
		want := time.Now().Add(time.Hour)
		ctx, cancel := context.WithDeadline(t.Context(), want)
		defer cancel()
		if _, err := p.do(ctx, &host.Request{Method: "GET", Path: "/deadline"}); err != nil {
			t.Fatalf("do() = %v", err)
		}
		if got := await(t, deadlines, "the handler"); !got.Equal(want) {
			t.Errorf("r.Context().Deadline() = %v, want %v", got, want)
		}
	})
	t.Run("none", func(t *testing.T) {
		if _, err := p.do(t.Context(), &host.Request{Method: "GET", Path: "/deadline"}); err != nil {
			t.Fatalf("do() = %v", err)
		}
		if got := await(t, deadlines, "the handler"); !got.IsZero() {
			t.Errorf("r.Context().Deadline() = %v, want none", got)
		}
	})
	t.Run("passes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		if _, err := p.do(ctx, &host.Request{Method: "GET", Path: "/block"}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("do() past its deadline = %v, want %v", err, context.DeadlineExceeded)
		}
		// The handler's own deadline and the host's cancel race to end
		// its context.
		if err := await(t, ended, "the handler to end"); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Errorf("handler's r.Context().Err() = %v, want it ended", err)
		}
	})
}

func TestBrokenConnection(t *testing.T) {
	tests := []struct {
		name string
		// host says which end to close.
		host bool
		// wantServeErr says Serve must fail.
		wantServeErr bool
	}{
		{name: "host's end closed", host: true},
		{name: "plugin's end closed", wantServeErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			started := make(chan struct{})
			ended := make(chan [2]error, 1)
			p := servePlane(t, streamUntilFail(started, ended))
			resp, err := p.tr.RoundTrip(t.Context(), &host.Request{Method: "GET", Path: "/", Streaming: true})
			if err != nil {
				t.Fatalf("RoundTrip() = %v", err)
			}
			defer resp.Close()
			await(t, started, "the handler to stream")
			end := p.pluginEnd
			if tt.host {
				end = p.hostEnd
			}
			_ = end.Close()
			var err2 error
			for err2 == nil {
				_, err2 = resp.Next()
			}
			if !errors.Is(err2, host.ErrUnavailable) {
				t.Errorf("Next() after the connection broke = %v, want %v", err2, host.ErrUnavailable)
			}
			got := await(t, ended, "the handler to stop")
			if !errors.Is(got[0], context.Canceled) || got[1] == nil {
				t.Errorf("handler ended with context error %v, write error %v; want %v and an error", got[0], got[1], context.Canceled)
			}
			// Serve ends either way; with the host's end closed on unread
			// frames the plugin may read a reset rather than the end.
			if err := p.wait(t); tt.wantServeErr && err == nil {
				t.Errorf("Serve() = nil with its own end closed, want the read error")
			}
			await(t, p.tr.Done(), "the transport's Done")
		})
	}
}

// TestUnreadBody checks that a handler that does not read its large
// request body holds up no other request on its connection.
func TestUnreadBody(t *testing.T) {
	started := make(chan struct{})
	release := wiretest.NewGate(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		release.Wait(r)
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n, err)
	})
	mux.HandleFunc("/fast", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "fast") })
	p := servePlane(t, mux)

	const size = 8 << 20
	slow := p.goDo(t.Context(), &host.Request{Method: "POST", Path: "/slow", Body: [][]byte{pattern(size)}})
	await(t, started, "the slow handler to start")
	for i := range 3 {
		r, err := p.do(t.Context(), &host.Request{Method: "POST", Path: "/fast", Body: [][]byte{pattern(2 * wire.PieceBytes)}})
		if err != nil || string(r.body()) != "fast" {
			t.Fatalf("do(/fast) #%d while /slow leaves its body unread = %v, %v, want fast", i, r, err)
		}
	}
	select {
	case res := <-slow:
		t.Fatalf("/slow answered (%v, %v) before it was released", res.reply, res.err)
	default:
	}
	release.Open()
	res := await(t, slow, "/slow")
	if want := fmt.Sprint(size, nil); res.err != nil || string(res.reply.body()) != want {
		t.Errorf("do(/slow) = %v, want %q", res.err, want)
	}
}

// TestConcurrent runs many requests at once on one connection, ordinary
// and streaming, each echoed; run it with the race detector.
func TestConcurrent(t *testing.T) {
	const n = 64
	p := servePlane(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Path", r.URL.Path)
		if _, err := io.Copy(w, r.Body); err != nil {
			panic(err)
		}
	}))
	var results [n]<-chan result
	for i := range n {
		req := &host.Request{Method: "POST", Path: fmt.Sprint("/", i), Body: [][]byte{pattern(i * 13 << 10)}, Streaming: i%2 == 1}
		results[i] = p.goDo(t.Context(), req)
	}
	for i, ch := range results {
		res := await(t, ch, fmt.Sprint("request ", i))
		if res.err != nil {
			t.Errorf("do(/%d) = %v", i, res.err)
			continue
		}
		if got, want := res.reply.header.Get("X-Path"), fmt.Sprint("/", i); got != want {
			t.Errorf("do(/%d) answered by the handler of %s", i, got)
		}
		if got, want := res.reply.body(), pattern(i*13<<10); !bytes.Equal(got, want) {
			t.Errorf("do(/%d) body has %d bytes, want the %d sent, intact", i, len(got), len(want))
		}
	}
}
