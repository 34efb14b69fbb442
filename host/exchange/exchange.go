// Package exchange sends a plugin process its requests for ordinary
// (non-streaming) routes over a few long-lived exchange streams, many
// requests at once on each, rather than as one Handle call per request:
// that saves a gRPC call's setup and teardown per request on both sides.
// A stream is one of the process's data-plane connections while it lasts,
// which spares gRPC's transport as well, and otherwise an Exchange stream
// (see "Data plane" in proto/pluginv1/plugin.proto). It falls back to
// Handle for a plugin built before Exchange existed, and for requests with
// large bodies. It neither routes nor maps failures to HTTP answers; the
// ingress does both.
package exchange

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

// MaxBodyBytes is the largest request body sent over an Exchange stream.
// Larger ones go as a Handle call of their own: a stream carries one
// message at a time, and a big body would hold up the requests behind it.
const MaxBodyBytes = 64 << 10

// Pool sends requests to one plugin process. Create it with New once the
// process is up, and call Close once it is gone. It is safe for concurrent
// use.
//
// Streams are opened on first use and used in turn. A stream that breaks
// fails the requests waiting on it and is replaced on the next use; a
// data-plane connection is used once, and an Exchange stream replaces it.
type Pool struct {
	rpc         pluginv1.PluginClient
	slots       []slot
	next        atomic.Uint64 // picks the slot for the next request
	unsupported atomic.Bool   // Exchange answered Unimplemented
	receivers   sync.WaitGroup

	mu     sync.Mutex // guards closed and each slot's opening
	closed bool
}

// slot holds one of the pool's streams.
type slot struct {
	cur     atomic.Pointer[stream] // nil until opened, and after it broke
	opening chan struct{}          // closed when an open in progress ends
	data    *wire.Conn             // the slot's data-plane connection until first used; guarded by Pool.mu
}

// New returns a pool of streams to the plugin served by rpc: one per
// data-plane connection in data, which it owns from now on, or GOMAXPROCS
// Exchange streams when there are none. It opens no Exchange stream yet.
func New(rpc pluginv1.PluginClient, data []*wire.Conn) *Pool {
	n := len(data)
	if n == 0 {
		n = runtime.GOMAXPROCS(0)
	}
	p := newPool(rpc, n)
	for i, c := range data {
		p.slots[i].data = c
	}
	return p
}

// DataPlaneConns returns how many of the pool's streams are data-plane
// connections: not yet used, or in use and not broken.
func (p *Pool) DataPlaneConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for i := range p.slots {
		sl := &p.slots[i]
		if sl.data != nil {
			n++
		} else if s := sl.cur.Load(); s != nil && s.framed {
			n++
		}
	}
	return n
}

func newPool(rpc pluginv1.PluginClient, streams int) *Pool {
	return &Pool{rpc: rpc, slots: make([]slot, streams)}
}

// errUnsupported is how a stream fails when the plugin has no Exchange.
var errUnsupported = errors.New("plugin does not implement Exchange")

// errClosed answers requests that arrive after Close.
var errClosed = status.Error(codes.Unavailable, "plugin connection is closed")

// errAborted is what a handler that aborted its response fails with; it is
// the error Handle returns for one.
var errAborted = status.Error(codes.Aborted, "handler aborted the response")

// Handle serves one request, as the plugin's Handle RPC would: the answer,
// or a gRPC status error. ctx's deadline becomes the handler's. When ctx
// ends first, Handle tells the plugin to cancel the request and returns
// the context's error as a status (DeadlineExceeded or Canceled). When the
// stream carrying the request breaks, or the pool is closed, the error is
// Unavailable; a handler that aborted its response gives Aborted.
func (p *Pool) Handle(ctx context.Context, req *pluginv1.HTTPRequest) (*pluginv1.HTTPResponse, error) {
	if p.unsupported.Load() || len(req.GetBody()) > MaxBodyBytes {
		return p.rpc.Handle(ctx, req)
	}
	for attempt := 0; ; attempt++ {
		s, err := p.stream(ctx)
		if err != nil {
			if errors.Is(err, errUnsupported) {
				return p.rpc.Handle(ctx, req)
			}
			return nil, err
		}
		id, ch, err := s.register()
		if err != nil {
			// The stream broke before it took the request. The
			// plugin saw nothing, so a new stream may carry it.
			if errors.Is(err, errUnsupported) {
				return p.rpc.Handle(ctx, req)
			}
			if attempt == 0 {
				continue
			}
			return nil, err
		}
		resp, err := s.do(ctx, id, ch, req)
		if errors.Is(err, errUnsupported) {
			// The plugin refused the stream without serving anything.
			return p.rpc.Handle(ctx, req)
		}
		return resp, err
	}
}

// Close ends the pool's streams, failing the requests waiting on them,
// and waits for their receivers. Requests after Close fail with
// Unavailable. Call it once the plugin process is gone; it is safe to call
// more than once.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	var open []*stream
	for i := range p.slots {
		if s := p.slots[i].cur.Load(); s != nil {
			open = append(open, s)
		}
		if c := p.slots[i].data; c != nil {
			_ = c.Close()
			p.slots[i].data = nil
		}
	}
	p.mu.Unlock()
	for _, s := range open {
		s.cancel()
	}
	p.receivers.Wait()
}

// stream returns the next slot's stream, opening it if needed. Only one
// caller opens a slot's stream; others wait for it, or for ctx.
func (p *Pool) stream(ctx context.Context) (*stream, error) {
	sl := &p.slots[p.next.Add(1)%uint64(len(p.slots))]
	for {
		if s := sl.cur.Load(); s != nil {
			return s, nil
		}
		if p.unsupported.Load() {
			return nil, errUnsupported
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, errClosed
		}
		if s := sl.cur.Load(); s != nil {
			p.mu.Unlock()
			return s, nil
		}
		if wait := sl.opening; wait != nil {
			p.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		done := make(chan struct{})
		sl.opening = done
		p.mu.Unlock()

		s, err := p.open(ctx, sl)
		p.mu.Lock()
		sl.opening = nil
		p.mu.Unlock()
		close(done)
		return s, err
	}
}

// open opens a stream for sl, on its data-plane connection if it has one
// left, and starts its receiver.
func (p *Pool) open(ctx context.Context, sl *slot) (*stream, error) {
	p.mu.Lock()
	data := sl.data
	sl.data = nil
	p.mu.Unlock()
	if data != nil {
		return p.start(sl, data, true, func() { _ = data.Close() })
	}
	// The stream outlives the caller who opens it, so it gets a context
	// of its own; but the opening must not outlast the caller.
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	cs, err := p.rpc.Exchange(sctx)
	if !stop() {
		cancel()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		cancel()
		if status.Code(err) == codes.Unimplemented {
			p.unsupported.Store(true)
			return nil, errUnsupported
		}
		return nil, err
	}
	return p.start(sl, wire.GRPCStream(cs), false, cancel)
}

// start makes st sl's stream and starts its receiver; framed says st is a
// data-plane connection, and end ends st.
func (p *Pool) start(sl *slot, st wire.Stream, framed bool, end func()) (*stream, error) {
	s := &stream{pool: p, slot: sl, st: st, framed: framed, cancel: end, sendLock: make(chan struct{}, 1), calls: map[uint64]chan result{}}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		end()
		return nil, errClosed
	}
	sl.cur.Store(s)
	p.receivers.Add(1)
	p.mu.Unlock()
	go s.receive()
	return s, nil
}

// stream is one exchange stream.
type stream struct {
	pool   *Pool
	slot   *slot
	st     wire.Stream
	framed bool   // st is a data-plane connection
	cancel func() // ends the stream

	// sendLock serialises Send, which a Stream allows one caller at a time.
	// It is a channel so that a caller can stop waiting for it when its
	// context ends.
	sendLock chan struct{}
	// cancels counts the ids queued in cancelIDs, read without mu.
	cancels atomic.Int32

	mu        sync.Mutex
	nextID    uint64
	calls     map[uint64]chan result // waiting callers by request id; nil once broken
	err       error                  // why the stream broke
	cancelIDs []uint64               // cancel frames not yet sent
}

// result is the outcome of one request.
type result struct {
	resp *pluginv1.HTTPResponse
	err  error
}

// register allocates a request id and the channel its answer arrives on.
// It fails with the stream's error once the stream has broken.
func (s *stream) register() (uint64, chan result, error) {
	ch := make(chan result, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		return 0, nil, s.err
	}
	s.nextID++
	s.calls[s.nextID] = ch
	return s.nextID, ch, nil
}

// forget unregisters id and reports whether it was still waiting.
func (s *stream) forget(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.calls[id]; !ok {
		return false
	}
	delete(s.calls, id)
	return true
}

// do sends the request registered as id and waits for its answer on ch.
func (s *stream) do(ctx context.Context, id uint64, ch chan result, req *pluginv1.HTTPRequest) (*pluginv1.HTTPResponse, error) {
	xr := &pluginv1.ExchangeRequest{Request: req}
	if dl, ok := ctx.Deadline(); ok {
		xr.DeadlineUnixNano = dl.UnixNano()
	}
	// Encode before taking the send lock, so the lock covers only the
	// write, and so that a message that cannot be encoded (a string that
	// is not UTF-8, say) fails this request alone. Frames stay far below
	// the 64 MiB message limit: bodies over MaxBodyBytes go by Handle, and
	// headers are capped by the HTTP server and, for Host.Call, by the
	// Host service's message limit.
	fr, err := s.st.Encode(&pluginv1.ExchangeFrame{Id: id, Kind: &pluginv1.ExchangeFrame_Request{Request: xr}})
	if err != nil {
		s.forget(id)
		return nil, status.Errorf(codes.Internal, "encode request: %v", err)
	}
	err = s.send(ctx, fr)
	if err != nil && err != io.EOF {
		// The request did not leave: ctx ended while waiting to send.
		s.forget(id)
		return nil, err
	}
	// On io.EOF the stream has ended; its receiver fails every waiting
	// request with the reason.
	select {
	case r := <-ch:
		return r.resp, r.err
	case <-ctx.Done():
		if s.forget(id) {
			s.sendCancel(id)
		}
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// send sends f, waiting for the send lock until ctx ends. Send itself
// waits only for flow control, that is, while the plugin is not reading
// the stream; a plugin that stops reading fails its health checks, and the
// stream ends when the supervisor kills it.
func (s *stream) send(ctx context.Context, fr wire.Frame) error {
	select {
	case s.sendLock <- struct{}{}:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	err := s.st.Send(fr, true)
	<-s.sendLock
	if err != nil {
		// Messages were checked when encoded, so the stream is broken
		// (a gRPC stream says io.EOF, a connection how its write
		// failed). Ending it makes its receiver fail every request
		// waiting on it, this one too, with the reason.
		s.cancel()
		return io.EOF
	}
	if s.cancels.Load() > 0 {
		s.flushCancels()
	}
	return nil
}

// sendCancel tells the plugin that the caller of id gave up. It never
// waits: the cancel is queued, and sent now if no one else is sending, or
// else by whoever is, once its own frame is out.
func (s *stream) sendCancel(id uint64) {
	s.mu.Lock()
	s.cancelIDs = append(s.cancelIDs, id)
	s.cancels.Add(1)
	s.mu.Unlock()
	s.flushCancels()
}

// flushCancels sends the queued cancel frames if the send lock is free.
// A sender checks for queued cancels after releasing the lock, and a
// canceller queues before trying it, so no cancel is left behind.
func (s *stream) flushCancels() {
	for s.cancels.Load() > 0 {
		select {
		case s.sendLock <- struct{}{}:
		default:
			return // the holder flushes them after its send
		}
		s.mu.Lock()
		ids := s.cancelIDs
		s.cancelIDs = nil
		s.cancels.Store(0)
		s.mu.Unlock()
		for i, id := range ids {
			fr, err := s.st.Encode(&pluginv1.ExchangeFrame{Id: id, Kind: &pluginv1.ExchangeFrame_Cancel{Cancel: &pluginv1.ExchangeCancel{}}})
			// A failed Send means the stream has ended, which cancels
			// every request on it anyway.
			if err != nil || s.st.Send(fr, i == len(ids)-1) != nil {
				break
			}
		}
		<-s.sendLock
	}
}

// receive hands each response to its caller until the stream breaks, then
// fails the callers still waiting.
func (s *stream) receive() {
	defer s.pool.receivers.Done()
	for {
		f, err := s.st.Recv()
		if err != nil {
			s.fail(err)
			return
		}
		r := f.GetResponse()
		if r == nil {
			continue // only responses flow this way
		}
		s.mu.Lock()
		ch, ok := s.calls[f.GetId()]
		delete(s.calls, f.GetId())
		s.mu.Unlock()
		if !ok {
			continue // its caller gave up
		}
		if r.GetAborted() {
			ch <- result{err: errAborted}
		} else {
			ch <- result{resp: r.GetResponse()}
		}
	}
}

// fail takes the broken stream out of its slot, so that the next request
// opens another, and fails every request waiting on it.
func (s *stream) fail(err error) {
	s.slot.cur.CompareAndSwap(s, nil)
	s.cancel()
	switch {
	case status.Code(err) == codes.Unimplemented:
		s.pool.unsupported.Store(true)
		err = errUnsupported
	case err == io.EOF:
		err = status.Error(codes.Unavailable, "plugin ended the exchange stream")
	default:
		err = status.Errorf(codes.Unavailable, "exchange stream broke: %v", status.Convert(err).Message())
	}
	s.mu.Lock()
	calls := s.calls
	s.calls, s.err = nil, err
	s.mu.Unlock()
	for _, ch := range calls {
		ch <- result{err: err}
	}
}
