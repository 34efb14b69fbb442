// Package dataplane carries HTTP requests from the host to one plugin
// process over the process's data-plane connections: Unix socket pairs the
// host made when it started the process (see "Data plane" in
// proto/pluginv1/plugin.proto). Each connection carries many requests at
// once. A request goes as a head frame, with its body whole or in pieces;
// its response comes back as a head and the body whole or in pieces, within
// a credit window the host replenishes as its caller consumes the body, so
// one slow reader holds up nothing but its own response.
//
// The Transport interface is all the rest of the host sees: no sockets,
// frames or protobuf. It neither routes nor maps failures to HTTP answers
// (the ingress does both), and it never starts or stops plugins (the
// supervisor does).
package dataplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

// ErrUnavailable is the error of a request whose connection broke or was
// closed before its answer was complete, or that found no connection
// left: the plugin process is gone or misbehaving.
var ErrUnavailable = errors.New("plugin data plane is unavailable")

// ErrAborted is the error of a request whose handler aborted its response
// (or panicked after sending part of it), or that the plugin answered in
// breach of the protocol.
var ErrAborted = errors.New("plugin aborted the response")

// ErrRefused is the error of a request the plugin refused without running
// a handler, because it had begun to drain: nothing happened, and the
// request may be sent to another instance of the plugin.
var ErrRefused = errors.New("plugin refused the request: it is draining")

// Request is a request for a plugin: the parts of an HTTP request it sees.
type Request struct {
	Method string
	// Path is relative to the plugin's mount point and starts with "/".
	Path     string
	RawQuery string
	// Header is sent as it is; the caller leaves out what the plugin must
	// not see.
	Header http.Header
	// Body is the request body in any number of pieces, sent as they
	// are, each cut into frames of at most wire.PieceBytes: the ingress
	// passes the pieces a body arrived in, so it is never copied whole.
	Body       [][]byte
	RemoteAddr string
	Host       string
	// Pattern is the route the host matched, relative to the mount.
	Pattern   string
	RequestID string
	// Streaming routes get their response as the handler flushes it.
	Streaming bool
	// Window is the response credit the plugin starts with, in bytes: what
	// the host buffers at most for a caller that reads the body slowly.
	// 0 means wire.ResponseWindow.
	Window uint32
	// ResponseHeader, if set, receives the response's headers and is its
	// Response.Header, sparing a map: the ingress passes its
	// ResponseWriter's.
	ResponseHeader http.Header
	// Deadline, if not zero, is a deadline for the request beside ctx's,
	// the earlier of the two applying: it travels to the plugin as ctx's
	// does, and once it passes the request fails with
	// context.DeadlineExceeded and the plugin is told to cancel it. The
	// transport checks it every sweepEvery rather than set a timer per
	// request, which context.WithTimeout would, with a context and the
	// parent's bookkeeping besides: the ingress's largest cost of its own
	// per request.
	Deadline time.Time
}

// Response is a plugin's answer. Read its body with Next until it returns
// an error (io.EOF at the end), or call Close to give up on the rest.
type Response struct {
	Status int
	Header http.Header
	// Size is the body's length when the plugin sent it whole or said it
	// in advance, and -1 otherwise.
	Size int64

	c       *call
	unacked int64 // body bytes handed out and not yet granted back
	window  int64 // the credit the response started with
}

// Transport sends requests to one plugin process. Create it with New once
// the process is up; call Close once it is gone. It is safe for concurrent
// use.
type Transport interface {
	// RoundTrip sends req and waits for the head of its answer. ctx bounds
	// the whole exchange, body included: its deadline becomes the
	// handler's, and when it ends while RoundTrip or Response.Next waits,
	// the plugin is told to cancel the request. As with an http.Response,
	// the caller must Close the Response (or read it to the end); a
	// response left alone keeps its handler running until its deadline.
	// The error is ctx's error, ErrUnavailable, ErrAborted or ErrRefused,
	// possibly wrapped.
	RoundTrip(ctx context.Context, req *Request) (*Response, error)
	// Live returns how many of the connections have not broken.
	Live() int
	// Done is closed once every connection has broken or been closed.
	Done() <-chan struct{}
	// Close closes the connections, failing the requests on them with
	// ErrUnavailable, and waits for their receivers. It is safe to call
	// more than once.
	Close()
}

// maxPluginFrame is the largest frame the host reads from a plugin: a
// response head with up to 1 MiB of headers and a piece of body. A plugin
// that sends more breaks its connection rather than making the host buffer
// it.
const maxPluginFrame = 1<<20 + wire.PieceBytes

// New returns a Transport over conns, which it owns from now on.
func New(conns []*wire.Conn) Transport {
	t := &transport{done: make(chan struct{}), wake: make(chan struct{}, 1)}
	for _, c := range conns {
		c.LimitRecv(maxPluginFrame)
		t.conns = append(t.conns, &conn{t: t, c: c, sendLock: make(chan struct{}, 1), flush: make(chan struct{}, 1),
			broken: make(chan struct{}), calls: map[uint64]*call{}})
	}
	t.live.Store(int64(len(conns)))
	if len(conns) == 0 {
		close(t.done)
	}
	for _, c := range t.conns {
		t.receivers.Add(1)
		go c.receive()
		t.receivers.Go(c.flusher)
	}
	if len(conns) > 0 {
		t.receivers.Go(t.sweep)
	}
	return t
}

type transport struct {
	conns     []*conn
	next      atomic.Uint64 // picks the connection for the next request
	live      atomic.Int64
	done      chan struct{}
	receivers sync.WaitGroup // and the flushers and the sweeper

	// parked says the sweeper waits on wake for a request with a
	// Deadline (sweep).
	parked atomic.Bool
	wake   chan struct{}
}

func (t *transport) Live() int             { return int(t.live.Load()) }
func (t *transport) Done() <-chan struct{} { return t.done }

func (t *transport) Close() {
	for _, c := range t.conns {
		c.fail(fmt.Errorf("%w: connection closed", ErrUnavailable))
	}
	t.receivers.Wait()
}

func (t *transport) RoundTrip(ctx context.Context, req *Request) (*Response, error) {
	n := uint64(len(t.conns))
	start := t.next.Add(1)
	for i := range n {
		c := t.conns[(start+i)%n]
		cl, err := c.register(ctx, req.Deadline)
		if err != nil {
			continue // broken: try the next one
		}
		return cl.roundTrip(req)
	}
	return nil, fmt.Errorf("%w: no connection left", ErrUnavailable)
}

// conn is one data-plane connection.
type conn struct {
	t *transport
	c *wire.Conn

	// sendLock serialises sends, so that a request's frames go out one
	// after another and a sender can stop waiting when its context ends.
	sendLock chan struct{}
	// flush asks the flusher to write out the request heads that
	// sendFrames held in the connection's buffer.
	flush chan struct{}
	// broken is closed when the connection fails.
	broken chan struct{}
	// cancels counts the ids queued in cancelIDs, read without mu.
	cancels atomic.Int32

	mu        sync.Mutex
	nextID    uint64
	calls     map[uint64]*call // requests awaiting (part of) an answer; nil once broken
	err       error            // why the connection broke
	cancelIDs []uint64         // cancel frames not yet sent
}

// call is one request's state on its connection.
type call struct {
	c   *conn
	id  uint64
	ctx context.Context
	// deadline is the Request's Deadline, which the sweeper enforces.
	deadline time.Time

	mu       sync.Mutex
	head     *pluginv1.ResponseHead
	pieces   [][]byte // body pieces not yet handed out
	buffered int64    // their bytes, with the head's body, against the window
	end      bool     // the last piece has arrived
	err      error    // the request failed
	ready    chan struct{}
	window   int64 // the response's credit at its start

	// resp is the Response roundTrip returns, a part of the call so that
	// it costs no allocation of its own.
	resp Response
}

// headFrame is the messages of a request's head, with those of its
// headers if they are few: taken from headFrames to encode a head, and
// given back cleared, since an encoded frame keeps none of them.
type headFrame struct {
	f  pluginv1.Frame
	k  pluginv1.Frame_Request
	r  pluginv1.RequestHead
	h  pluginv1.HTTPRequest
	hm wire.HeaderMessages
}

var headFrames = sync.Pool{New: func() any { return new(headFrame) }}

// register allocates a request id on c. It fails once c has broken.
func (c *conn) register(ctx context.Context, deadline time.Time) (*call, error) {
	c.mu.Lock()
	if c.calls == nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.nextID++
	cl := &call{c: c, id: c.nextID, ctx: ctx, deadline: deadline, ready: make(chan struct{}, 1)}
	c.calls[cl.id] = cl
	c.mu.Unlock()
	if !deadline.IsZero() && c.t.parked.Load() && c.t.parked.CompareAndSwap(true, false) {
		select {
		case c.t.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
	return cl, nil
}

// roundTrip sends req as cl and waits for the head of the answer.
func (cl *call) roundTrip(req *Request) (*Response, error) {
	cl.window = wire.ResponseWindow
	if req.Window > 0 {
		cl.window = int64(req.Window)
	}
	if err := cl.send(req); err != nil {
		return nil, err
	}
	for {
		cl.mu.Lock()
		head, err := cl.head, cl.err
		cl.mu.Unlock()
		if head != nil {
			return cl.response(head, req.ResponseHeader), nil
		}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				cl.giveUp() // the sweeper's: the plugin still runs it
			} else {
				cl.c.forget(cl.id)
			}
			return nil, err
		}
		select {
		case <-cl.ready:
		case <-cl.ctx.Done():
			cl.giveUp()
			return nil, cl.ctx.Err()
		}
	}
}

// send sends the request's head with its body, or the body's first piece
// and then the rest in Body frames. The head goes under one hold of the
// send lock into the connection's buffer, for the flusher to write out,
// with the frames that follow it within a piece's worth of body (most bodies
// are smaller than a piece and arrive in a few pieces: see the ingress's
// firstPiece); each later frame takes the send lock on its own, so that
// other requests' frames go out between them. Frames are encoded as they
// are built, so the Body frames of a request share one set of messages
// (bodyCursor.frame).
func (cl *call) send(req *Request) error {
	body := bodyCursor{pieces: req.Body}
	first, more := body.next()
	hf := headFrames.Get().(*headFrame)
	hf.h.Method, hf.h.Path, hf.h.RawQuery = req.Method, req.Path, req.RawQuery
	hf.h.Headers, hf.h.Body = hf.hm.Convert(req.Header), first
	hf.h.RemoteAddr, hf.h.Host, hf.h.Pattern, hf.h.RequestId = req.RemoteAddr, req.Host, req.Pattern, req.RequestID
	hf.r.Request, hf.r.More, hf.r.Streaming, hf.r.Window = &hf.h, more, req.Streaming, req.Window
	if dl, ok := cl.ctx.Deadline(); ok && (cl.deadline.IsZero() || dl.Before(cl.deadline)) {
		hf.r.DeadlineUnixNano = dl.UnixNano()
	} else if !cl.deadline.IsZero() {
		hf.r.DeadlineUnixNano = cl.deadline.UnixNano()
	}
	hf.k.Request = &hf.r
	hf.f.Id, hf.f.Kind = cl.id, &hf.k
	var frs [headBatch]wire.Frame
	fr, err := cl.encode(&hf.f, nil, false)
	*hf = headFrame{}
	headFrames.Put(hf)
	if err != nil {
		return err
	}
	frs[0] = fr
	n, held := 1, len(first)
	for more && n < headBatch && held+min(len(body.rest), wire.PieceBytes) <= wire.PieceBytes {
		var f *pluginv1.Frame
		var size int
		f, size, more = body.frame(cl.id)
		if frs[n], err = cl.encode(f, frs[:n], false); err != nil {
			return err
		}
		n++
		held += size
	}
	if err := cl.sendFrames(frs[:n], false); err != nil {
		return err
	}
	for more {
		if cl.finished() {
			// The plugin has answered in full, aborted or broken the
			// protocol without the rest of the body: it will not read
			// it. (A head alone is no reason to stop: a handler may
			// stream its answer while it reads.)
			return nil
		}
		var f *pluginv1.Frame
		f, _, more = body.frame(cl.id)
		if frs[0], err = cl.encode(f, nil, true); err != nil {
			return err
		}
		if err := cl.sendFrames(frs[:1], true); err != nil {
			return err
		}
	}
	return nil
}

// bodyCursor walks a request body's pieces in frames of at most
// wire.PieceBytes.
type bodyCursor struct {
	pieces [][]byte
	rest   []byte     // what is left to send of the current piece
	bf     *bodyFrame // every Body frame's messages, made for the first
}

// frame returns the Body frame of request id with the body's next data,
// the data's length, and whether more follows it. Each frame reuses the
// messages of the one before: an encoded frame keeps none of them.
func (b *bodyCursor) frame(id uint64) (*pluginv1.Frame, int, bool) {
	data, more := b.next()
	if b.bf == nil {
		b.bf = new(bodyFrame)
	}
	bf := b.bf
	bf.b.Data, bf.b.End = data, !more
	bf.k.Body = &bf.b
	bf.f.Id, bf.f.Kind = id, &bf.k
	return &bf.f, len(data), more
}

// next returns the body's next frame of data, and whether more follows
// it.
func (b *bodyCursor) next() ([]byte, bool) {
	b.skip()
	data := b.rest[:min(len(b.rest), wire.PieceBytes)]
	b.rest = b.rest[len(data):]
	b.skip()
	return data, len(b.rest) > 0
}

// skip moves past empty pieces.
func (b *bodyCursor) skip() {
	for len(b.rest) == 0 && len(b.pieces) > 0 {
		b.rest, b.pieces = b.pieces[0], b.pieces[1:]
	}
}

// bodyFrame is the messages of a Body frame.
type bodyFrame struct {
	f pluginv1.Frame
	k pluginv1.Frame_Body
	b pluginv1.Body
}

// headBatch is the most frames a request's head goes out with.
const headBatch = 8

// finished reports whether the plugin has sent its whole answer, or the
// request has failed.
func (cl *call) finished() bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.end || cl.err != nil
}

// encode encodes f, a frame of the request. If it cannot be, which
// leaves nothing of the request's frames sent, it discards the frames
// encoded before it, pending, and gives up on the request: started says
// the plugin has its head already, so it must be cancelled there. Frames
// stay far below the message limit: bodies go in pieces, and headers are
// capped by the HTTP server and, for Host.Call, by the Host service's
// message limit.
func (cl *call) encode(f *pluginv1.Frame, pending []wire.Frame, started bool) (wire.Frame, error) {
	fr, err := cl.c.c.Encode(f)
	if err == nil {
		return fr, nil
	}
	for i := range pending {
		pending[i].Discard()
	}
	cl.c.forget(cl.id)
	if started {
		cl.c.sendCancel(cl.id)
	}
	return wire.Frame{}, fmt.Errorf("encode request: %w", err)
}

// sendFrames sends encoded frames of the request under one hold of the
// send lock: the first frames (the head, started false) into the
// connection's buffer for the flusher, later ones with a flush of their
// own. started says the plugin has its head already, so a request given
// up here must be cancelled there. Frames are encoded (encode) before the
// lock is taken, so that it covers only the write.
func (cl *call) sendFrames(frs []wire.Frame, started bool) error {
	c := cl.c
	// The wait for the lock ends too when the request fails meanwhile:
	// the sweeper's Deadline (which ctx does not carry), a broken
	// connection. ready also says the plugin answered, which is no reason
	// to stop: roundTrip finds the head whether or not this took the
	// signal.
	locked := false
	var failed error
	for !locked && failed == nil && cl.ctx.Err() == nil {
		select {
		case c.sendLock <- struct{}{}:
			locked = true
		case <-cl.ctx.Done():
		case <-cl.ready:
			cl.mu.Lock()
			failed = cl.err
			cl.mu.Unlock()
		}
	}
	if err := cmp.Or(cl.ctx.Err(), failed); err != nil {
		// The caller gave up, or the request failed, before the frames
		// went out (select picks at random when both are ready).
		if locked {
			<-c.sendLock
		}
		for j := range frs {
			frs[j].Discard()
		}
		if c.forget(cl.id) && started {
			c.sendCancel(cl.id)
		}
		return err
	}
	var err error
	if started {
		err = c.c.SendAll(frs)
	} else {
		// A request's head (with the body that goes with it) waits in
		// the buffer for the flusher, so that the requests arriving
		// together share a write.
		var first bool
		if first, err = c.c.SendHeld(frs); first {
			select {
			case c.flush <- struct{}{}:
			default: // the flusher has a request to flush already
			}
		}
	}
	<-c.sendLock
	if err != nil {
		// The connection is broken; its receiver fails every request
		// waiting on it, this one too.
		c.fail(err)
		return cl.result()
	}
	if c.cancels.Load() > 0 {
		c.flushCancels()
	}
	return nil
}

// flusher writes out the request heads that sendFrames held in the
// connection's buffer. With other requests in flight on the connection it
// yields once before it flushes, so that the goroutines already runnable
// (the other requests of the same poll of the network, most often) hold
// theirs first: requests that arrive together cost one write and one
// wake-up of the plugin's reader rather than one each. A lone request's
// head goes out at once, without waiting behind whatever else is
// runnable. It ends when the connection does.
func (c *conn) flusher() {
	for {
		select {
		case <-c.flush:
		case <-c.broken:
			return
		}
		if c.inFlight() > 1 {
			yield()
		}
		if err := c.c.Flush(); err != nil {
			c.fail(err)
			return
		}
	}
}

// yield is runtime.Gosched; tests count the flusher's calls.
var yield = runtime.Gosched

// inFlight returns how many requests on c await (part of) an answer.
func (c *conn) inFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// result returns cl's error once its connection has failed it.
func (cl *call) result() error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.err != nil {
		return cl.err
	}
	return ErrUnavailable
}

// response builds the Response for head, its headers added to h (a new
// map if nil); its body's first piece is the head's.
func (cl *call) response(head *pluginv1.ResponseHead, h http.Header) *Response {
	if h == nil {
		h = http.Header{}
	}
	hr := head.GetResponse()
	cl.resp = Response{Status: int(hr.GetStatus()), Header: h, Size: -1, c: cl, window: cl.window}
	r := &cl.resp
	// The frame is the call's alone: its headers' values need no copy.
	wire.AdoptHeaders(r.Header, hr.GetHeaders())
	switch {
	case !head.GetMore():
		r.Size = int64(len(hr.GetBody()))
	case head.GetSize() > 0:
		r.Size = head.GetSize()
	}
	return r
}

// Next returns the next piece of the body, waiting for it until the
// request's context ends. It returns io.EOF after the last piece, or the
// request's error: ctx's, ErrUnavailable or ErrAborted.
func (r *Response) Next() ([]byte, error) {
	cl := r.c
	for {
		if err := cl.ctx.Err(); err != nil {
			// Hand out nothing more, buffered or not: the caller has
			// given up.
			cl.giveUp()
			return nil, err
		}
		cl.mu.Lock()
		if hb := cl.head.GetResponse().GetBody(); hb != nil {
			cl.head.Response.Body = nil
			cl.buffered -= int64(len(hb))
			cl.mu.Unlock()
			r.unacked += int64(len(hb))
			if len(hb) > 0 {
				return hb, nil
			}
			continue
		}
		if len(cl.pieces) > 0 {
			p := cl.pieces[0]
			cl.pieces[0] = nil
			cl.pieces = cl.pieces[1:]
			cl.buffered -= int64(len(p))
			cl.mu.Unlock()
			r.grant(false)
			r.unacked += int64(len(p))
			return p, nil
		}
		end, err := cl.end, cl.err
		cl.mu.Unlock()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				cl.giveUp() // the sweeper's: the plugin still runs it
			}
			return nil, err
		}
		if end {
			return nil, io.EOF
		}
		// Nothing is buffered: whatever was handed out has been
		// consumed, so the plugin may have all its credit back.
		r.grant(true)
		select {
		case <-cl.ready:
		case <-cl.ctx.Done():
			cl.giveUp()
			return nil, cl.ctx.Err()
		}
	}
}

// grant gives the plugin back the credit for the body handed out before
// the piece about to be: in one Window frame per quarter of the window,
// or whatever there is when all is set.
func (r *Response) grant(all bool) {
	if r.unacked == 0 || (!all && r.unacked < r.window/4) {
		return
	}
	n := r.unacked
	r.unacked = 0
	r.c.c.sendControl(&pluginv1.Frame{Id: r.c.id, Kind: &pluginv1.Frame_Window{Window: &pluginv1.Window{Bytes: uint32(n)}}})
}

// Window returns the credit the response started with: the most of its
// body the host buffers while the caller does not read.
func (r *Response) Window() int64 { return r.window }

// Close gives up on the rest of the body: the plugin is told to cancel
// the request if it has not sent all of it. Call it once done with the
// response.
func (r *Response) Close() {
	r.c.giveUp()
}

// giveUp forgets cl and, if the plugin still owes part of its answer,
// tells it to cancel the request.
func (cl *call) giveUp() {
	if cl.c.forget(cl.id) {
		cl.c.sendCancel(cl.id)
	}
}

// forget unregisters id and reports whether it was still awaiting part
// of its answer.
func (c *conn) forget(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.calls[id]; !ok {
		return false
	}
	delete(c.calls, id)
	return true
}

// sendCancel tells the plugin that the caller of id gave up. It never
// waits: the cancel is queued, and sent now if no one else is sending, or
// else by whoever is, once its own frame is out.
func (c *conn) sendCancel(id uint64) {
	c.mu.Lock()
	c.cancelIDs = append(c.cancelIDs, id)
	c.cancels.Add(1)
	c.mu.Unlock()
	c.flushCancels()
}

// sendControl sends a small frame (a Window) without waiting for the
// request's context: it waits for the send lock, which a sender holds
// only while it writes.
func (c *conn) sendControl(f *pluginv1.Frame) {
	fr, err := c.c.Encode(f)
	if err != nil {
		return // cannot happen: an id and a number
	}
	c.sendLock <- struct{}{}
	err = c.c.Send(fr, true)
	<-c.sendLock
	if err != nil {
		c.fail(err)
		return
	}
	if c.cancels.Load() > 0 {
		c.flushCancels()
	}
}

// flushCancels sends the queued cancel frames if the send lock is free.
// A sender checks for queued cancels after releasing the lock, and a
// canceller queues before trying it, so no cancel is left behind.
func (c *conn) flushCancels() {
	for c.cancels.Load() > 0 {
		select {
		case c.sendLock <- struct{}{}:
		default:
			return // the holder flushes them after its send
		}
		c.mu.Lock()
		ids := c.cancelIDs
		c.cancelIDs = nil
		c.cancels.Store(0)
		c.mu.Unlock()
		for i, id := range ids {
			fr, err := c.c.Encode(&pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Cancel{Cancel: &pluginv1.Cancel{}}})
			// A failed Send means the connection has ended, which
			// cancels every request on it anyway.
			if err != nil || c.c.Send(fr, i == len(ids)-1) != nil {
				break
			}
		}
		<-c.sendLock
	}
}

// receive hands each frame to its request until the connection breaks,
// then fails the requests still waiting.
func (c *conn) receive() {
	defer c.t.receivers.Done()
	for {
		f, err := c.c.Recv()
		if err != nil {
			c.fail(err)
			return
		}
		c.mu.Lock()
		cl := c.calls[f.GetId()]
		c.mu.Unlock()
		if cl == nil {
			continue // its caller gave up, or it has ended
		}
		switch more, breach := cl.deliver(f); {
		case breach:
			// The plugin's answer is unusable; stop its handler.
			if c.forget(cl.id) {
				c.sendCancel(cl.id)
			}
		case !more:
			// Answered, or aborted.
			c.forget(cl.id)
		}
	}
}

// deliver hands a frame from the plugin to cl and reports whether cl
// still expects more, and whether the frame broke the protocol.
func (cl *call) deliver(f *pluginv1.Frame) (more, breach bool) {
	cl.mu.Lock()
	more = true
	// A plugin may spend wire.ResponseWindow whatever window the request
	// named: one built before RequestHead.window ignores it.
	switch k := f.GetKind().(type) {
	case *pluginv1.Frame_Response:
		body := int64(len(k.Response.GetResponse().GetBody()))
		switch {
		case cl.head != nil:
			cl.err, breach = fmt.Errorf("%w: a second response head", ErrAborted), true
		case body > wire.ResponseWindow:
			cl.err, breach = fmt.Errorf("%w: it sent more than its window", ErrAborted), true
		default:
			cl.head = k.Response
			cl.buffered = body
			cl.end = !k.Response.GetMore()
			more = !cl.end
		}
	case *pluginv1.Frame_Body:
		data := k.Body.GetData()
		switch {
		case cl.head == nil:
			cl.err, breach = fmt.Errorf("%w: a body piece before the response head", ErrAborted), true
		case cl.buffered+int64(len(data)) > wire.ResponseWindow:
			cl.err, breach = fmt.Errorf("%w: it sent more than its window", ErrAborted), true
		default:
			if len(data) > 0 {
				cl.pieces = append(cl.pieces, data)
				cl.buffered += int64(len(data))
			}
			cl.end = k.Body.GetEnd()
			more = !cl.end
		}
	case *pluginv1.Frame_Abort:
		cl.err, more = ErrAborted, false
		if k.Abort.GetRefused() && cl.head == nil {
			cl.err = ErrRefused
		}
	default:
		// Requests, cancels and windows flow only from the host.
		cl.mu.Unlock()
		return true, false
	}
	if breach {
		more = false
	}
	cl.mu.Unlock()
	select {
	case cl.ready <- struct{}{}:
	default:
	}
	return more, breach
}

// fail marks c broken, closes it and fails every request awaiting part of
// its answer on it.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.calls == nil {
		c.mu.Unlock()
		return
	}
	if !errors.Is(err, ErrUnavailable) {
		if err == io.EOF {
			err = fmt.Errorf("%w: plugin closed the connection", ErrUnavailable)
		} else {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	calls := c.calls
	c.calls, c.err = nil, err
	c.mu.Unlock()
	close(c.broken)
	_ = c.c.Close()
	for _, cl := range calls {
		cl.mu.Lock()
		if cl.err == nil {
			cl.err = err
		}
		cl.mu.Unlock()
		select {
		case cl.ready <- struct{}{}:
		default:
		}
	}
	if c.t.live.Add(-1) == 0 {
		close(c.t.done)
	}
}
