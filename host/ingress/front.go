package ingress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// frontBuffer is the read buffer of a connection on the front, and so the
// largest request head it serves itself; a longer head goes to net/http.
const frontBuffer = 4 << 10

// watchAfter is how long a request served by the front runs before its
// connection is watched for the client going away, which then cancels it
// as net/http would: most answers come sooner, and so cost no watcher.
const watchAfter = 50 * time.Millisecond

// FrontOptions configures a Front.
type FrontOptions struct {
	// ReadHeaderTimeout bounds the arrival of a request's head; IdleTimeout
	// the wait for the next request on a kept-alive connection;
	// WriteTimeout the writing of an answer, from the end of its request's
	// head unless the handler moves the deadline (http.ResponseController).
	// A head the front hands to net/http unfinished keeps its deadline as
	// the first read deadline net/http sets, which is the head's when the
	// http.Server has a ReadHeaderTimeout or ReadTimeout of its own (the
	// host sets both).
	ReadHeaderTimeout, IdleTimeout, WriteTimeout time.Duration
	// Direct reports whether a request the front parsed may be served
	// by it; the others go to net/http with their connection.
	Direct func(method, path string) bool
	Logger hclog.Logger
}

// Front is the ingress's HTTP/1.1 front door. It reads each request head
// on a connection, serves the plain requests most traffic is made of —
// GET and HEAD without a body, to routes that do not stream — by calling
// the handler itself with one write per answer, and hands the connection
// to net/http, with every byte it has read, at the first request it does
// not serve itself: net/http then serves that connection to its end. So
// the uncommon requests keep net/http's handling exactly (bodies, Expect,
// streams, refusals of malformed heads), and the common ones skip the
// per-request costs of a general server: a goroutine watching every
// request's connection, several deadline changes and a header copy per
// answer, and a write of the head apart from the body.
//
// Serve accepts connections; Listener is what the http.Server serves,
// once HookServer has hooked the server, so that net/http's own answers
// (to a head it cannot read, and its 417) are the platform's JSON errors
// too.
type Front struct {
	ln      net.Listener
	handler http.Handler
	opts    FrontOptions

	handoff  chan net.Conn
	done     chan struct{} // closed by Shutdown, Close or a failed Accept
	doneOnce sync.Once
	err      error // the failed Accept's, set before done is closed

	mu       sync.Mutex
	conns    map[*frontConn]struct{}
	draining atomic.Bool
	wg       sync.WaitGroup // the connections' goroutines

	// active are the connections serving a request, which the sweeper
	// looks at; it runs until quit is closed, once no connection is left
	// (or at Close), and closes swept.
	amu        sync.Mutex
	active     map[*frontConn]struct{}
	quit       chan struct{}
	quitOnce   sync.Once
	swept      chan struct{}
	sweepStart sync.Once

	date atomic.Pointer[dateLine]
}

// NewFront returns a Front that accepts on ln and serves h. Unlike
// net/http's, the requests the front serves on one connection share a
// context, which ends when the client goes away or the connection
// closes, not when h returns; and the front reuses each Request and
// ResponseWriter for the next request. h must leave neither, nor anything
// waiting on the context, behind when it returns, as the ingress does.
func NewFront(ln net.Listener, h http.Handler, opts FrontOptions) *Front {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	return &Front{
		ln: ln, handler: h, opts: opts,
		handoff: make(chan net.Conn),
		done:    make(chan struct{}),
		conns:   map[*frontConn]struct{}{},
		active:  map[*frontConn]struct{}{},
		quit:    make(chan struct{}),
		swept:   make(chan struct{}),
	}
}

// Listener returns the listener of the connections the front hands to
// net/http. Closing it closes the front's listener too.
func (f *Front) Listener() net.Listener { return (*handoffListener)(f) }

// Serve accepts connections until the listener fails or the front is shut
// down, and then returns the listener's error.
func (f *Front) Serve() error {
	go f.sweep()
	var backoff time.Duration
	for {
		c, err := f.ln.Accept()
		if err != nil {
			select {
			case <-f.done:
				return http.ErrServerClosed
			default:
			}
			// As net/http does: a temporary failure (out of descriptors)
			// is waited out, not fatal.
			if isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				f.opts.Logger.Warn("accept failed; retrying", "error", err, "in", backoff)
				select {
				case <-time.After(backoff):
				case <-f.done:
					return http.ErrServerClosed
				}
				continue
			}
			f.err = err
			f.stop()
			return err
		}
		backoff = 0
		fc := &frontConn{f: f, rwc: c, remote: c.RemoteAddr().String()}
		f.mu.Lock()
		if f.draining.Load() {
			f.mu.Unlock()
			c.Close()
			continue
		}
		f.conns[fc] = struct{}{}
		f.wg.Add(1)
		f.mu.Unlock()
		go fc.serve()
	}
}

// isTemporary reports whether accepting again may get past err: a
// timeout, or EMFILE, ENFILE or ECONNABORTED.
func isTemporary(err error) bool {
	var t interface {
		Timeout() bool
		Temporary() bool
	}
	return errors.As(err, &t) && (t.Timeout() || t.Temporary())
}

// stop ends Serve and the handoff listener.
func (f *Front) stop() {
	f.doneOnce.Do(func() {
		close(f.done)
		f.ln.Close()
	})
}

// Shutdown stops accepting, closes the connections waiting for a request,
// lets the others finish the request they are serving (its answer then
// says Connection: close) and waits for them, or for ctx to end, when it
// closes what is left. Connections handed to net/http are the
// http.Server's to shut down.
func (f *Front) Shutdown(ctx context.Context) error {
	f.stop()
	f.mu.Lock()
	f.draining.Store(true)
	for c := range f.conns {
		c.closeIfIdle()
	}
	f.mu.Unlock()
	waited := make(chan struct{})
	go func() {
		f.wg.Wait()
		close(waited)
	}()
	select {
	case <-waited:
		f.stopSweep()
		return nil
	case <-ctx.Done():
		f.Close()
		return ctx.Err()
	}
}

// stopSweep ends the sweeper and waits for it, if it ran.
func (f *Front) stopSweep() {
	f.quitOnce.Do(func() { close(f.quit) })
	started := true
	f.sweepStart.Do(func() { started = false; close(f.swept) })
	if started {
		<-f.swept
	}
}

// Close closes the listener and every connection the front still serves.
func (f *Front) Close() error {
	f.stop()
	f.mu.Lock()
	f.draining.Store(true)
	for c := range f.conns {
		c.rwc.Close()
	}
	f.mu.Unlock()
	f.stopSweep()
	return nil
}

// handoffListener is Front.Listener.
type handoffListener Front

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.handoff:
		return c, nil
	case <-l.done:
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	(*Front)(l).stop()
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.ln.Addr() }

// dateLine is the Date header of answers written within one second.
type dateLine struct {
	sec  int64
	line []byte // "Date: ...\r\n"
}

// dateHeader returns the Date header line for now.
func (f *Front) dateHeader(now time.Time) []byte {
	sec := now.Unix()
	if d := f.date.Load(); d != nil && d.sec == sec {
		return d.line
	}
	line := append([]byte("Date: "), now.UTC().AppendFormat(nil, http.TimeFormat)...)
	line = append(line, "\r\n"...)
	f.date.Store(&dateLine{sec: sec, line: line})
	return line
}

// frontConn is one connection the front serves.
type frontConn struct {
	f      *Front
	rwc    net.Conn
	remote string
	src    *prefixConn // rwc, after what a watcher read of it
	br     *bufio.Reader
	// Buffers of the answer being built, kept for the next: out the
	// bytes to write, fields the handler's header lines, body what is
	// held of the body until the head goes out.
	out, fields, body []byte
	// Memory of each request, reused for the next once it has been served:
	// the head's, the answer's writer and header map, and the Request.
	space  headSpace
	w      frontWriter
	header http.Header
	// ctx is the context of every request the front serves on the
	// connection, and end ends it: when the client goes away (watch) or
	// the connection closes. A request's context does not end when its
	// handler returns, as net/http's does; the front's handler, the
	// ingress, leaves nothing waiting on it once it returns, and one
	// context for the connection spares every request a context, its
	// channel and the Request WithContext makes. base is a Request with
	// only ctx set, and req the handler's, made anew from base for each
	// request, so that nothing a handler set on one (SetPathValue) is
	// seen by the next.
	ctx  context.Context
	end  context.CancelFunc
	base *http.Request
	req  *http.Request

	// headBy is when the head being read is due, zero if no deadline
	// runs for it (yet).
	headBy time.Time

	// mu guards state, and the watcher's fields below.
	// since is when the request being served began (monoNow), for the
	// sweeper.
	since atomic.Int64

	mu     sync.Mutex
	state  connState
	cancel context.CancelFunc // the request's
	// watching is closed by the watcher when it ends. A byte it read (of
	// a pipelined request) goes to the front of src, which the serving
	// goroutine reads once the watcher has ended.
	watching chan struct{}
}

type connState int

const (
	// stateNew: waiting for its first request. Shutdown leaves it to
	// send one, as net/http does, within the head's timeout.
	stateNew  connState = iota
	stateIdle           // waiting for a later request
	stateActive
	stateClosed
)

// serve serves requests on c until it closes or goes to net/http.
func (c *frontConn) serve() {
	defer c.f.wg.Done()
	handed := false
	defer func() {
		c.f.mu.Lock()
		delete(c.f.conns, c)
		c.f.mu.Unlock()
		if !handed {
			c.rwc.Close()
		}
		if c.end != nil {
			c.end()
		}
	}()
	c.src = &prefixConn{Conn: c.rwc}
	c.br = bufio.NewReaderSize(c.src, frontBuffer)
	first := true
	for {
		req, n, ok, err := c.readHead(first)
		if err != nil {
			return
		}
		first = false
		if !ok || !c.f.opts.Direct(req.method, req.url.Path) {
			handed = c.handOff()
			return
		}
		c.br.Discard(n)
		if !c.serveOne(req) {
			return
		}
	}
}

// readHead waits for the next request's head and parses it, reading
// nothing past what the buffer holds. ok is false for a request the front
// does not serve itself; err is set when the connection is to be closed:
// it closed before a head began, or a head did not arrive in time, which
// net/http would not answer either.
func (c *frontConn) readHead(first bool) (r directRequest, n int, ok bool, err error) {
	timed := false // the head's deadline is set
	c.headBy = time.Time{}
	if c.br.Buffered() == 0 {
		wait := c.f.opts.ReadHeaderTimeout
		if !first && c.f.opts.IdleTimeout > 0 {
			wait = c.f.opts.IdleTimeout
		}
		at, armed := c.armRead(wait)
		if !armed {
			return r, 0, false, net.ErrClosed
		}
		// After an idle wait, the head gets its own deadline if it does
		// not arrive with its first bytes.
		timed = first || c.f.opts.IdleTimeout <= 0
		if timed {
			c.headBy = at
		}
		if _, err := c.br.Peek(1); err != nil {
			return r, 0, false, err
		}
	}
	if !c.setState(stateActive) {
		return r, 0, false, net.ErrClosed
	}
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		if bytes.Contains(buf, crlf2) {
			r, n, ok = parseHead(buf, &c.space)
			return r, n, ok, nil
		}
		if len(buf) == frontBuffer || !plainStart(buf) {
			return r, 0, false, nil
		}
		if !timed {
			timed = true
			if c.f.opts.ReadHeaderTimeout > 0 {
				c.headBy = time.Now().Add(c.f.opts.ReadHeaderTimeout)
				c.rwc.SetReadDeadline(c.headBy)
			} else {
				c.rwc.SetReadDeadline(time.Time{})
			}
		}
		if _, err := c.br.Peek(len(buf) + 1); err != nil {
			if err == io.EOF {
				// The client ended its side within a head: net/http
				// answers that 400, and so gets it.
				return r, 0, false, nil
			}
			return r, 0, false, err
		}
	}
}

// plainStart reports whether b, which holds no whole head, may still
// become one the front serves: it starts as a GET or HEAD request line
// does, with no bare CR or LF, and a request line already whole ends in
// HTTP/1.1. Anything else goes to net/http at once, which answers a
// malformed line, or an HTTP/0.9 one ("GET /x"), as soon as it has it,
// rather than after the head's timeout.
func plainStart(b []byte) bool {
	for i, ch := range b {
		if ch == '\n' && (i == 0 || b[i-1] != '\r') || ch == '\r' && i+1 < len(b) && b[i+1] != '\n' {
			return false
		}
	}
	if line, _, whole := bytes.Cut(b, []byte("\r\n")); whole && !bytes.HasSuffix(line, []byte(" HTTP/1.1")) {
		return false
	}
	for _, m := range []string{"GET ", "HEAD "} {
		k := min(len(b), len(m))
		if string(b[:k]) == m[:k] {
			return true
		}
	}
	return false
}

// handOff gives the connection, with what it has read of it, to net/http.
func (c *frontConn) handOff() bool {
	// From now on the connection is net/http's: Close leaves it alone.
	c.f.mu.Lock()
	delete(c.f.conns, c)
	c.f.mu.Unlock()
	c.rwc.SetReadDeadline(time.Time{})
	pending, _ := c.br.Peek(c.br.Buffered())
	// The bytes a watcher read come after those buffered.
	hc := &prefixConn{Conn: c.rwc, pending: append(append([]byte(nil), pending...), c.src.pending...), headBy: c.headBy}
	select {
	case c.f.handoff <- hc:
		return true
	case <-c.f.done:
		return false
	}
}

// setState moves the connection to s, and reports false if it was closed
// meanwhile (by Shutdown).
func (c *frontConn) setState(s connState) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == stateClosed || s == stateIdle && c.f.draining.Load() {
		c.state = stateClosed
		return false
	}
	c.state = s
	return true
}

// armRead sets the read deadline d from now (none if d is 0) for the
// wait for a request, and returns it, unless Shutdown has closed the
// connection: under the lock, so that closeIfIdle's deadline is never
// overwritten.
func (c *frontConn) armRead(d time.Duration) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == stateClosed {
		return time.Time{}, false
	}
	var t time.Time
	if d > 0 {
		t = time.Now().Add(d)
	}
	c.rwc.SetReadDeadline(t)
	return t, true
}

// closeIfIdle closes the connection if it waits for a request.
func (c *frontConn) closeIfIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == stateIdle {
		c.state = stateClosed
		c.rwc.SetReadDeadline(time.Now())
	}
}

// serveOne calls the handler for r and writes its answer; it reports
// whether the connection serves another request.
func (c *frontConn) serveOne(r directRequest) (keep bool) {
	if c.ctx == nil {
		c.ctx, c.end = context.WithCancel(context.Background())
		c.base = new(http.Request).WithContext(c.ctx)
		c.req = new(http.Request)
	}
	req := c.req
	*req = *c.base
	req.Method, req.URL, req.Header, req.Body = r.method, r.url, r.header, http.NoBody
	req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/1.1", 1, 1
	req.Host, req.RemoteAddr, req.RequestURI, req.Close = r.host, c.remote, r.target, r.close
	if c.header == nil {
		c.header = make(http.Header, 4)
	}
	w := &c.w
	*w = frontWriter{c: c, head: r.method == http.MethodHead, header: c.header, cl: -1, closeAfter: r.close,
		fields: c.fields[:0], body: c.body[:0]}
	c.mu.Lock()
	c.cancel = c.end
	c.mu.Unlock()
	c.since.Store(int64(monoNow()))
	c.f.amu.Lock()
	c.f.active[c] = struct{}{}
	c.f.amu.Unlock()
	if c.f.opts.WriteTimeout > 0 {
		// As net/http's: from the end of the head, unless the handler
		// moves it (http.ResponseController).
		c.rwc.SetWriteDeadline(time.Now().Add(c.f.opts.WriteTimeout))
	}
	defer func() {
		c.f.amu.Lock()
		delete(c.f.active, c)
		c.f.amu.Unlock()
		c.endWatch()
		c.clearRequest()
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				c.f.opts.Logger.Error("panic serving a request", "remote", c.remote, "panic", p, "stack", string(debug.Stack()))
			}
			keep = false
		}
	}()
	c.f.handler.ServeHTTP(w, req)
	ok := w.finish()
	// The buffers are kept before the connection goes idle, so that
	// whoever sees it idle (under c.mu) sees them settled.
	if cap(w.fields) <= frontKeep {
		c.fields = w.fields[:0]
	}
	if cap(w.body) <= frontKeep {
		c.body = w.body[:0]
	}
	// The watcher stops before the context is looked at: one that saw the
	// client go away after the look would leave the next request, already
	// buffered, to be served with an ended context.
	c.endWatch()
	if !ok || w.closeAfter || c.ctx.Err() != nil {
		// Written in vain, or to a client that has gone away.
		return false
	}
	return c.setState(stateIdle)
}

// clearRequest lets go of what the request served last referred to, so
// that an idle connection holds none of it, and keeps the maps for the
// next unless they grew large.
func (c *frontConn) clearRequest() {
	*c.req = http.Request{}
	c.w = frontWriter{}
	c.space.reset()
	c.header = keepHeader(c.header)
}

// watch starts the goroutine that reads from the connection while its
// request is served, if the request has run for watchAfter and none
// runs yet: it cancels the request if the client goes away, as net/http
// does, and keeps a byte it reads as the start of the next request. The
// front's sweeper calls it, so an answer within watchAfter costs nothing.
func (c *frontConn) watch(now time.Duration) {
	if now-time.Duration(c.since.Load()) < watchAfter {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != stateActive || c.cancel == nil || c.watching != nil {
		return
	}
	done := make(chan struct{})
	c.watching = done
	cancel := c.cancel
	// The head's deadline must not end the watch; endWatch sets its own.
	c.rwc.SetReadDeadline(time.Time{})
	go func() {
		defer close(done)
		if frontWatchHook != nil {
			frontWatchHook("watching")
		}
		var b [1]byte
		n, err := c.rwc.Read(b[:])
		if n > 0 {
			c.src.pending = append(c.src.pending, b[0])
			if frontWatchHook != nil {
				frontWatchHook("read")
			}
			return
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return // endWatch
		}
		cancel() // the client went away
	}()
}

// endWatch stops the connection's watcher, if one runs, and keeps what it
// read.
func (c *frontConn) endWatch() {
	c.mu.Lock()
	c.cancel = nil
	done := c.watching
	c.watching = nil
	c.mu.Unlock()
	if done == nil {
		return
	}
	c.rwc.SetReadDeadline(aLongTimeAgo)
	<-done
	c.rwc.SetReadDeadline(time.Time{})
}

// sweep starts the watchers of requests that have run for watchAfter,
// until stopSweep: through a drain too, so that a client leaving then
// still cancels its request.
func (f *Front) sweep() {
	run := false
	f.sweepStart.Do(func() { run = true })
	if !run {
		return
	}
	defer close(f.swept)
	t := time.NewTicker(watchAfter / 2)
	defer t.Stop()
	for {
		select {
		case <-f.quit:
			return
		case <-t.C:
			now := monoNow()
			f.amu.Lock()
			for c := range f.active {
				c.watch(now)
			}
			f.amu.Unlock()
		}
	}
}

// monoEpoch and monoNow give the front's times on the monotonic clock.
var monoEpoch = time.Now()

func monoNow() time.Duration { return time.Since(monoEpoch) }

var aLongTimeAgo = time.Unix(1, 0)

// frontWatchHook, if set, is called when a watcher starts ("watching")
// and when it has read a byte of the next request ("read"): a hook for
// tests.
var frontWatchHook func(event string)

// prefixConn is a connection with bytes read of it to be read again
// first: those the front hands to net/http with it, or the byte a watcher
// read.
type prefixConn struct {
	net.Conn
	// answering is whether a handler of the server the connection was
	// handed to answers a request on it (HookServer): while none does,
	// what the server writes is its own answer (Write).
	answering atomic.Bool
	pending   []byte
	// headBy is when the head the front began to read is due, zero if
	// none is: net/http's first read deadline, the one for that head, is
	// kept no later, so that a head read partly by the front and partly
	// by net/http gets one read_timeout in all, not one each.
	headBy time.Time
}

func (c *prefixConn) SetReadDeadline(t time.Time) error {
	if by := c.headBy; !by.IsZero() {
		c.headBy = time.Time{}
		if t.IsZero() || t.After(by) {
			t = by
		}
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite shuts down the sending side, as net/http does before closing
// a connection whose request it did not read whole.
func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errNotTCP
}

// NetConn returns the connection the listener accepted.
func (c *prefixConn) NetConn() net.Conn { return c.Conn }
