// Package dataplane is the plugin's side of the data plane: it serves the
// HTTP requests the host sends over one data-plane connection (wire.Conn),
// many at once, with an http.Handler. It rebuilds each request from its
// head and Body frames, runs the handler in a worker goroutine, and sends
// the response back as a head and Body frames: whole once the handler
// returns on ordinary routes, as the handler flushes on streaming ones,
// within the credit the host grants (Window frames). A Cancel frame, the
// request's deadline or the end of the connection cancels the request's
// context.
//
// It knows nothing of gRPC, of the plugin's lifecycle or of draining; the
// sdk package wraps the handler for those. See "Data plane" in
// proto/pluginv1/plugin.proto for the frames.
package dataplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

// Options configure Serve.
type Options struct {
	// Handler serves every request.
	Handler http.Handler
	// Error writes the platform's JSON error body; Serve uses it for a
	// request it cannot rebuild (400) and for a handler that panicked
	// before its response was sent (500).
	Error func(w http.ResponseWriter, status int, code, message string)
	// Logger receives a record for each panic and each response that
	// could not be sent.
	Logger hclog.Logger
	// Inline, if set, reports whether the route the host matched
	// (RequestHead's pattern) runs its handler on the connection's
	// reader (sdk.Inline) rather than on a worker. A request with more
	// body to come or a streaming one goes to a worker whatever it says.
	Inline func(pattern string) bool
}

// Serve serves the requests arriving on c until the host closes it or it
// breaks, then cancels the requests still running and waits for their
// handlers. It returns nil when the host closed the connection cleanly,
// and the read error otherwise. ctx is the parent of every request's
// context. Serve does not close c.
func Serve(ctx context.Context, c *wire.Conn, opts Options) error {
	ctx, cancel := context.WithCancel(ctx)
	s := &server{
		c:       c,
		opts:    opts,
		calls:   map[uint64]*call{},
		work:    make(chan *call),
		maxIdle: maxIdleWorkers(),
	}
	defer func() {
		cancel()
		close(s.work)
		s.workers.Wait()
	}()
	for {
		s.flushHeld()
		f, err := c.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.dispatch(ctx, f); err != nil {
			return err
		}
	}
}

// workersPerCPU sizes the idle workers a connection keeps (maxIdleWorkers).
const workersPerCPU = 64

// maxIdleWorkers returns how many idle workers a connection keeps for its
// next requests; a worker that finishes a request when this many are idle
// exits. A fresh goroutine per request would grow its stack to a
// handler's depth again each time; a kept worker has grown it already.
// The host bounds how many requests are in flight, and so how many
// workers are busy.
func maxIdleWorkers() int64 { return int64(workersPerCPU * runtime.GOMAXPROCS(0)) }

// server is the state of one connection.
type server struct {
	c    *wire.Conn
	opts Options

	// sendMu orders senders; holding it across the write is its purpose.
	sendMu sync.Mutex
	// sending counts the goroutines sending or waiting to: a sender that
	// knows another follows leaves its frame in the connection's buffer
	// for that one to flush.
	sending atomic.Int32
	// held says the reader left an inline answer in the connection's
	// buffer, because another request waited in the read buffer. Only
	// the reader uses it.
	held bool

	mu    sync.Mutex
	calls map[uint64]*call // requests being served, by id

	// work hands a request to an idle worker; unbuffered, so a send
	// succeeds only when one is waiting.
	work    chan *call
	idle    atomic.Int64
	maxIdle int64
	workers sync.WaitGroup
}

// dispatch handles one frame from the host. An error ends the connection.
func (s *server) dispatch(ctx context.Context, f *pluginv1.Frame) error {
	id := f.GetId()
	switch k := f.GetKind().(type) {
	case *pluginv1.Frame_Request:
		return s.start(ctx, id, k.Request)
	case *pluginv1.Frame_Cancel:
		if c := s.lookup(id); c != nil {
			c.rctx.cancel()
		}
	case *pluginv1.Frame_Body:
		// A piece for a request that has finished is dropped: its
		// handler returned without reading the whole body.
		if c := s.lookup(id); c != nil && c.body != nil {
			c.body.push(k.Body.GetData(), k.Body.GetEnd())
		}
	case *pluginv1.Frame_Window:
		if c := s.lookup(id); c != nil {
			c.grant(int64(k.Window.GetBytes()))
		}
	}
	// Responses and aborts flow only from the plugin; the host sends none.
	return nil
}

func (s *server) lookup(id uint64) *call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[id]
}

// call is one request being served.
type call struct {
	id        uint64
	ctx       context.Context
	rctx      requestContext // ctx; cancel it once the request ends
	req       *pluginv1.HTTPRequest
	streaming bool
	body      *pipe // the rest of the body, when it comes in pieces
	// whole is the body when it came whole in the head, and url the
	// request's URL: parts of the call so that they cost no allocations
	// of their own.
	whole wholeBody
	url   url.URL
	// piece is the most body a response frame carries: wire.PieceBytes,
	// or the request's window when that is smaller, so that a piece never
	// waits for more credit than the window holds.
	piece int

	// w is the handler's ResponseWriter, a part of the call so that it
	// costs no allocation of its own.
	w writer
	// inline says the handler runs on the connection's reader, which
	// cannot read the Window frames a wait for credit needs: a response
	// larger than its credit is handed to a worker (handle).
	inline bool
	// onReader says the handler's answer is being sent by the reader
	// (the one goroutine that reads and writes it).
	onReader bool

	mu     sync.Mutex
	credit int64 // response bytes the plugin may still send
	// more is signalled when credit grows; made by the first spend that
	// has to wait, which most responses never do.
	more chan struct{}
}

// grant adds credit from a Window frame.
func (c *call) grant(n int64) {
	c.mu.Lock()
	c.credit += n
	more := c.more
	c.mu.Unlock()
	if more != nil {
		select {
		case more <- struct{}{}:
		default:
		}
	}
}

// covers reports whether c's credit covers n more bytes of response.
func (c *call) covers(n int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.credit >= n
}

// spend waits until n bytes of credit are available, or the request's
// context ends, and takes them.
func (c *call) spend(n int64) error {
	for {
		c.mu.Lock()
		if c.credit >= n {
			c.credit -= n
			c.mu.Unlock()
			return nil
		}
		if c.more == nil {
			c.more = make(chan struct{}, 1)
		}
		more := c.more
		c.mu.Unlock()
		select {
		case <-more:
		case <-c.ctx.Done():
			return c.ctx.Err()
		}
	}
}

// start registers a request and hands it to a worker: an idle one, or a
// new one.
func (s *server) start(ctx context.Context, id uint64, head *pluginv1.RequestHead) error {
	var deadline time.Time
	if d := head.GetDeadlineUnixNano(); d > 0 {
		deadline = time.Unix(0, d)
	}
	window := int64(wire.ResponseWindow)
	if w := head.GetWindow(); w > 0 {
		window = int64(w)
	}
	c := &call{
		id: id, rctx: requestContext{parent: ctx, deadline: deadline}, req: head.GetRequest(), streaming: head.GetStreaming(),
		credit: window, piece: int(min(window, wire.PieceBytes)),
	}
	c.ctx = &c.rctx
	if head.GetMore() {
		c.body = newPipe(c.ctx, c.req.GetBody())
	}
	s.mu.Lock()
	if _, dup := s.calls[id]; dup {
		s.mu.Unlock()
		c.rctx.cancel()
		// The host never reuses an id on a connection; ending the
		// connection makes such a bug loud rather than leaving a caller
		// waiting.
		return fmt.Errorf("request id %d is already in flight on this connection", id)
	}
	s.calls[id] = c
	s.mu.Unlock()
	if c.body == nil && !c.streaming && s.opts.Inline != nil && s.opts.Inline(c.req.GetPattern()) {
		// No frame of this request is still to come that the reader
		// would have to read while the handler runs.
		c.inline, c.onReader = true, true
		s.handle(c)
		return nil
	}
	select {
	case s.work <- c:
	default:
		s.workers.Go(func() { s.worker(c) })
	}
	return nil
}

// worker serves c, then further requests until the connection ends or
// enough other workers are idle.
func (s *server) worker(c *call) {
	for {
		s.handle(c)
		if s.idle.Add(1) > s.maxIdle {
			s.idle.Add(-1)
			return
		}
		next, ok := <-s.work
		s.idle.Add(-1)
		if !ok {
			return
		}
		c = next
	}
}

// handle runs the handler for c and sends its response.
func (s *server) handle(c *call) {
	w := &c.w
	handedOff := false
	defer func() {
		if !handedOff {
			s.done(c)
		}
	}()
	*w = writer{s: s, c: c, header: http.Header{}, status: http.StatusOK}
	w.buf = *bytes.NewBuffer(w.small[:0])
	r, err := newRequest(c)
	if err != nil {
		s.opts.Error(w, http.StatusBadRequest, "bad_request", err.Error())
		w.finish()
		return
	}
	if !s.run(w, r) {
		w.abort()
		return
	}
	if w.refused && !w.wroteHeader {
		w.refuse()
		return
	}
	if c.inline && !c.covers(int64(w.buf.Len())) {
		// The response needs more credit than it has, and the Window
		// frames that bring it are read by this goroutine: a worker
		// sends it while this one goes back to reading.
		handedOff = true
		c.onReader = false
		s.workers.Go(func() {
			defer s.done(c)
			w.finish()
		})
		return
	}
	w.finish()
}

// done ends c once its response has been sent or given up.
func (s *server) done(c *call) {
	s.mu.Lock()
	delete(s.calls, c.id)
	s.mu.Unlock()
	c.rctx.cancel()
	c.w.release()
}

// run calls the handler and reports whether its response may be sent:
// false when the handler aborted it (http.ErrAbortHandler) or panicked
// after part of it was sent. A handler that panicked earlier gets its
// response replaced by a 500.
func (s *server) run(w *writer, r *http.Request) (ok bool) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		ok = false
		if v == http.ErrAbortHandler {
			return
		}
		s.opts.Logger.Error("handler panicked", "method", r.Method, "path", r.URL.Path,
			"request_id", w.c.req.GetRequestId(), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		if w.reset() {
			s.opts.Error(w, http.StatusInternalServerError, "internal", "the plugin failed while handling the request")
			ok = true
		}
	}()
	s.opts.Handler.ServeHTTP(w, r)
	return true
}

// send encodes f and writes it. Only the last of several goroutines
// sending at once flushes the connection's buffer; the others leave their
// frames in it. It reports false when f could not be sent: the connection
// is broken (the receive loop then ends too), or f cannot be encoded (a
// header value that is not UTF-8, say), in which case the request is
// aborted so that the host answers at once rather than at its deadline.
func (s *server) send(f *pluginv1.Frame) bool { return s.sendFrom(f, false) }

// sendFrom is send; onReader says the reader sends f, so that it may hold
// f back while another request waits in the read buffer: the answers to
// requests that arrived together go out in one write (see flushHeld).
func (s *server) sendFrom(f *pluginv1.Frame, onReader bool) bool {
	fr, err := s.c.Encode(f)
	if err != nil {
		s.opts.Logger.Error("cannot send a response frame; aborting the response", "id", f.GetId(), "error", err)
		fr, err = s.c.Encode(&pluginv1.Frame{Id: f.GetId(), Kind: &pluginv1.Frame_Abort{Abort: &pluginv1.Abort{}}})
		if err == nil {
			s.write(fr, false)
		}
		return false
	}
	return s.write(fr, onReader)
}

// write writes an encoded frame; see send.
func (s *server) write(fr wire.Frame, onReader bool) bool {
	s.sending.Add(1)
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	// Every goroutine counted in sending takes the lock after this one;
	// the last of them flushes.
	flush := s.sending.Add(-1) == 0
	if flush && onReader && s.c.FrameBuffered() {
		flush, s.held = false, true
	}
	return s.c.Send(fr, flush) == nil
}

// flushHeld writes out the answers the reader held back, once no whole
// frame waits in the read buffer: the reader never blocks on a read with
// an answer of its own unsent. A failed write is no reason to stop, as in
// write: the next read tells how the connection ended, which may be the
// host closing it cleanly.
func (s *server) flushHeld() {
	if !s.held || s.c.FrameBuffered() {
		return
	}
	s.held = false
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	_ = s.c.Flush()
}

// newRequest builds the handler's request from the host's, as
// http.NewRequestWithContext with an empty URL would, its path and query
// then set directly rather than formatted into a URL only to be parsed
// again. It fills the Request itself, the URL a part of c, so that the
// only allocations are the Request WithContext makes and its Header.
func newRequest(c *call) (*http.Request, error) {
	req := c.req
	method, err := requestMethod(req.GetMethod())
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	if strings.ContainsFunc(req.GetRawQuery(), isCTL) {
		// What url.Parse refuses; net/http refuses such a request line.
		return nil, errors.New("build request: invalid control character in query")
	}
	c.url = url.URL{Path: req.GetPath(), RawQuery: req.GetRawQuery()}
	r := http.Request{
		Method:     method,
		URL:        &c.url,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     make(http.Header, len(req.GetHeaders())),
		Host:       req.GetHost(),
		RemoteAddr: req.GetRemoteAddr(),
		RequestURI: c.url.RequestURI(),
	}
	// The frame is the call's alone: its headers' values need no copy.
	wire.AdoptHeaders(r.Header, req.GetHeaders())
	switch body := req.GetBody(); {
	case c.body != nil:
		r.Body = c.body
		r.ContentLength = -1
		if v := r.Header.Get("Content-Length"); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				r.ContentLength = n
			}
		}
	case len(body) > 0:
		c.whole.r.Reset(body)
		r.Body = &c.whole
		r.ContentLength = int64(len(body))
	default:
		r.Body = http.NoBody
	}
	return r.WithContext(c.ctx), nil
}

// requestMethod returns the method http.NewRequestWithContext gives a
// request for method, or its error: GET for none, and an error for one
// that is not a token.
func requestMethod(method string) (string, error) {
	switch method {
	case "":
		return http.MethodGet, nil
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method, nil
	}
	// Rare enough that net/http's own check, and its allocations, do.
	if _, err := http.NewRequest(method, "", nil); err != nil {
		return "", err
	}
	return method, nil
}

// wholeBody is a request body that came whole in the request's head: what
// io.NopCloser makes of a bytes.Reader, without allocations of its own.
type wholeBody struct{ r bytes.Reader }

func (b *wholeBody) Read(p []byte) (int, error)         { return b.r.Read(p) }
func (b *wholeBody) WriteTo(w io.Writer) (int64, error) { return b.r.WriteTo(w) }
func (b *wholeBody) Close() error                       { return nil }

// isCTL reports an ASCII control character.
func isCTL(r rune) bool { return r < ' ' || r == 0x7f }
