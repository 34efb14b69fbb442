package sdk

import (
	"context"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

// Exchange serves ordinary requests over one long-lived stream, many at
// once: each request frame is served as a Handle call would be, by serve in
// a goroutine of its own, and answered with a response frame carrying its
// id. A cancel frame, or the end of the stream, cancels the request's
// context. Exchange returns once the stream has ended and every request
// started on it has returned. A data-plane connection is served the same
// way (serveData).
func (s *server) Exchange(stream pluginv1.Plugin_ExchangeServer) error {
	return s.newExchange(wire.GRPCStream(stream)).run(stream.Context())
}

func (s *server) newExchange(st wire.Stream) *exchange {
	return &exchange{
		s:       s,
		stream:  st,
		calls:   map[uint64]context.CancelFunc{},
		work:    make(chan *exchangeCall),
		maxIdle: maxIdleExchangeWorkers(),
	}
}

// serveData serves each data-plane connection in conns as an exchange
// stream, until the host closes it or it breaks, in goroutines that
// s.dataWG waits for. The process exits without waiting for them: a
// connection ends when the host is gone.
func (s *server) serveData(conns []*wire.Conn) {
	s.dataConns = len(conns)
	for _, c := range conns {
		s.dataWG.Go(func() {
			defer c.Close()
			if err := s.newExchange(c).run(context.Background()); err != nil {
				s.logger.Error("data plane connection broke", "error", err)
			}
		})
	}
}

// maxIdleExchangeWorkers returns how many idle workers an Exchange stream keeps
// for its next requests; a worker that finishes a request when this many
// are idle exits. Workers are kept for the same reason as the gRPC
// server's stream workers (see streamWorkers): a fresh goroutine per
// request grows its stack to a handler's depth again. The host bounds how
// many requests are in flight at once, and so how many workers are busy.
func maxIdleExchangeWorkers() int64 { return int64(workersPerCPU * runtime.GOMAXPROCS(0)) }

// exchange is the state of one Exchange stream.
type exchange struct {
	s      *server
	stream wire.Stream

	// sendMu serialises Send: a stream allows one sender at a time.
	// Holding it across the Send is its purpose.
	sendMu sync.Mutex
	// sending counts the goroutines sending or waiting to: a sender that
	// knows another follows leaves its frame for that one to flush.
	sending atomic.Int32

	mu    sync.Mutex
	calls map[uint64]context.CancelFunc // requests being served, by id

	// work hands a request to an idle worker; unbuffered, so a send
	// succeeds only when one is waiting.
	work    chan *exchangeCall
	idle    atomic.Int64
	maxIdle int64 // idle workers kept (maxIdleExchangeWorkers)
	workers sync.WaitGroup
}

// exchangeCall is one request on an Exchange stream.
type exchangeCall struct {
	id     uint64
	ctx    context.Context
	cancel context.CancelFunc
	req    *pluginv1.HTTPRequest
}

// run reads frames until the stream ends, then cancels the requests still
// being served and waits for their workers. ctx is the requests' parent.
func (x *exchange) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		close(x.work)
		x.workers.Wait()
	}()
	for {
		f, err := x.stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch k := f.GetKind().(type) {
		case *pluginv1.ExchangeFrame_Request:
			if err := x.start(ctx, f.GetId(), k.Request); err != nil {
				return err
			}
		case *pluginv1.ExchangeFrame_Cancel:
			x.cancel(f.GetId())
		}
		// Responses flow only from the plugin; the host sends none.
	}
}

// start hands a request to a worker: an idle one, or a new one.
func (x *exchange) start(ctx context.Context, id uint64, req *pluginv1.ExchangeRequest) error {
	var cancel context.CancelFunc
	if d := req.GetDeadlineUnixNano(); d > 0 {
		ctx, cancel = context.WithDeadline(ctx, time.Unix(0, d))
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	x.mu.Lock()
	if _, dup := x.calls[id]; dup {
		x.mu.Unlock()
		cancel()
		// The host never reuses an id on a stream; ending the stream
		// makes such a bug loud rather than leaving a caller waiting.
		return status.Errorf(codes.InvalidArgument, "request id %d is already in flight on this stream", id)
	}
	x.calls[id] = cancel
	x.mu.Unlock()

	c := &exchangeCall{id: id, ctx: ctx, cancel: cancel, req: req.GetRequest()}
	select {
	case x.work <- c:
	default:
		x.workers.Go(func() { x.worker(c) })
	}
	return nil
}

// cancel cancels the request with id, if it is still being served.
func (x *exchange) cancel(id uint64) {
	x.mu.Lock()
	cancel := x.calls[id]
	x.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// worker serves c, then further requests until the stream ends or enough
// other workers are idle.
func (x *exchange) worker(c *exchangeCall) {
	for {
		x.serve(c)
		if x.idle.Add(1) > x.maxIdle {
			x.idle.Add(-1)
			return
		}
		next, ok := <-x.work
		x.idle.Add(-1)
		if !ok {
			return
		}
		c = next
	}
}

// serve serves one request and sends its answer. A request whose context
// has ended is not answered: its caller has given up.
func (x *exchange) serve(c *exchangeCall) {
	w := newBufferedWriter()
	err := x.s.serve(c.ctx, c.req, w)
	x.mu.Lock()
	delete(x.calls, c.id)
	x.mu.Unlock()
	ended := c.ctx.Err() != nil
	c.cancel()
	if ended {
		return
	}
	resp := &pluginv1.ExchangeResponse{}
	if err != nil {
		// serve failed the request with Aborted; Handle would return
		// that as the call's error.
		resp.Aborted = true
	} else {
		resp.Response = &pluginv1.HTTPResponse{
			Status:  int32(w.status),
			Headers: wire.HeadersToProto(w.header),
			Body:    w.body.Bytes(),
		}
	}
	f := &pluginv1.ExchangeFrame{Id: c.id, Kind: &pluginv1.ExchangeFrame_Response{Response: resp}}
	// Encode before taking the send lock, so the lock covers only the
	// write; a frame that cannot be sent (too large, say) fails this
	// request alone, as it would fail a Handle call, and the host answers
	// it as it does an aborted one.
	fr, err := x.stream.Encode(f)
	if err != nil {
		x.s.logger.Error("cannot send response", "method", c.req.GetMethod(), "path", c.req.GetPath(),
			"request_id", c.req.GetRequestId(), "error", err)
		f.Kind = &pluginv1.ExchangeFrame_Response{Response: &pluginv1.ExchangeResponse{Aborted: true}}
		if fr, err = x.stream.Encode(f); err != nil {
			return // cannot happen: the frame is an id and a flag
		}
	}
	x.sending.Add(1)
	x.sendMu.Lock()
	defer x.sendMu.Unlock()
	// Every goroutine counted in sending takes the lock after this one;
	// the last of them flushes.
	flush := x.sending.Add(-1) == 0
	// An error means the stream is gone; run's Recv fails too and ends
	// the stream, and the host fails the request itself.
	_ = x.stream.Send(fr, flush)
}
