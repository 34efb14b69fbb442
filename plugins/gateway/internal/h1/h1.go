// Package h1 is the gateway's client of its http:// upstreams: HTTP/1.1
// over a pool of kept-alive connections, each request written and its
// response read on the caller's goroutine.
//
// net/http's Transport gives every connection a reading and a writing
// goroutine, so each request there wakes three goroutines besides its
// caller's, and parks its caller until they answer. A proxy that sends
// small requests over loopback spends more on those hand-offs than on
// the HTTP itself; this client has none. It keeps what the gateway
// relies on from the Transport: requests are written as Request.Write
// writes them and responses read as ReadResponse reads them (the common
// ones by writeRequest and readResponse, in the connection's buffers,
// the rest by net/http); a request's context bounds the whole call, its
// end (cancellation or deadline) ending a blocked read or write; errors
// are those of the net package (*net.OpError with Op "dial", "write" or
// "read"), or the context's when it was cancelled; a request that meets
// a kept-alive connection the upstream has closed is sent again on
// another connection when net/http would (nothing of it was written, or
// it is replayable); a connection with bytes beyond an answer, buffered
// or arrived while it was idle, is closed rather than reused; response
// headers are bounded; informational (1xx) responses are skipped.
//
// It must not be used for https:// upstreams (it speaks neither TLS nor
// HTTP/2) nor follow redirects, and it starts no goroutine.
package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// maxHeaderBytes bounds a response's status line and headers: the
// Transport's default.
const maxHeaderBytes = 10 << 20

// max1xx bounds the informational responses skipped before the final
// one: the Transport's bound.
const max1xx = 5

// errHeaderTooLong is a response whose head exceeds maxHeaderBytes.
var errHeaderTooLong = fmt.Errorf("h1: response headers exceed %d bytes", maxHeaderBytes)

// Client is a pool of HTTP/1.1 connections, keyed by host:port. Its
// zero value is not usable: set Dial. Call CloseIdleConnections when done.
type Client struct {
	// Dial opens a connection; it should bound the dial on its own too,
	// since a request without a deadline has nothing else bounding it.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxIdlePerHost bounds the idle connections kept to one host:port;
	// beyond it a connection is closed when its response is read.
	MaxIdlePerHost int
	// IdleTimeout closes a connection left idle that long.
	IdleTimeout time.Duration

	mu     sync.Mutex
	idle   map[string][]*conn // newest last
	closed bool               // CloseIdleConnections ran: pool nothing more
}

// conn is one connection. Between get and put (or close) it belongs to
// one request.
type conn struct {
	c     *Client
	addr  string
	nc    net.Conn
	br    *bufio.Reader
	bw    *bufio.Writer
	cr    countedConn
	timer *time.Timer // closes it when idle past IdleTimeout
	keys  []string    // writeRequest's scratch space
	// stop unhooks the request's context from the connection; false if
	// the context was done first and poisoned its deadline.
	stop func() bool
}

// countedConn is the connection under the buffers: it counts what was
// written and read, to tell a request the upstream never saw from one
// it may have, and bounds the reads of a response's head.
type countedConn struct {
	net.Conn
	written, read int64
	limit         int64 // bytes the head may still take; <0: no bound
}

func (c *countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written += int64(n)
	return n, err
}

func (c *countedConn) Read(p []byte) (int, error) {
	if c.limit == 0 {
		return 0, errHeaderTooLong
	}
	if c.limit > 0 && int64(len(p)) > c.limit {
		p = p[:c.limit]
	}
	n, err := c.Conn.Read(p)
	c.read += int64(n)
	if c.limit > 0 {
		c.limit -= int64(n)
	}
	return n, err
}

// RoundTrip sends req to req.URL's host:port and returns the response.
// The response's body must be read to its end or closed; read to its end,
// it returns the connection to the pool. req's context bounds the call
// and the reading of the body.
func (c *Client) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	for {
		pc, reused, err := c.get(ctx, addr)
		if err != nil {
			return nil, err
		}
		resp, err := pc.roundTrip(ctx, req)
		if err == nil {
			return resp, nil
		}
		pc.close()
		if ctx.Err() != nil {
			// Cancelled or past its deadline: the context says
			// which, and a timeout keeps the step that hit it.
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, ctx.Err()
			}
			return nil, err
		}
		if !reused || !retryable(req, &pc.cr, err) {
			return nil, err
		}
		// The upstream closed a kept-alive connection before it took
		// the request: send it again, on another one.
		if req.Body != nil && req.Body != http.NoBody {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			r2 := *req
			r2.Body = body
			req = &r2
		}
	}
}

// retryable says whether a request that failed with err on a kept-alive
// connection may go again on another, by net/http's rule: the upstream
// got none of it, or it read none of the answer and the request can be
// sent twice. A timeout is the request's deadline: trying again would
// only spend the pool's idle connections on a call already over.
func retryable(req *http.Request, cr *countedConn, err error) bool {
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return false
	}
	if cr.written == 0 {
		return resendable(req)
	}
	return cr.read == 0 && replayable(req)
}

// resendable says whether req's body can be sent again.
func resendable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// replayable says whether req may reach the upstream twice: its body
// can be sent again, and its method is safe or it carries an idempotency
// key (net/http's Request.isReplayable).
func replayable(req *http.Request) bool {
	if !resendable(req) {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, ok := req.Header["Idempotency-Key"]
	_, xok := req.Header["X-Idempotency-Key"]
	return ok || xok
}

// aLongTimeAgo is a deadline in the past: set on a connection, it ends
// its blocked reads and writes at once.
var aLongTimeAgo = time.Unix(1, 0)

// roundTrip writes req and reads the head of its response. The context's
// end sets a deadline in the past on the connection, which fails the
// blocked read or write with a timeout of that step; the connection's
// own deadline is otherwise left unset, which spares the poller two
// timers a request. A deadline already past when the call starts is the
// connection's at once, so that the write is the step that times out.
func (pc *conn) roundTrip(ctx context.Context, req *http.Request) (*http.Response, error) {
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		if err := pc.nc.SetDeadline(dl); err != nil {
			return nil, err
		}
	}
	nc := pc.nc
	pc.stop = context.AfterFunc(ctx, func() { _ = nc.SetDeadline(aLongTimeAgo) })
	pc.cr.written, pc.cr.read = 0, 0
	var err error
	if pc.keys, err = writeRequest(pc.bw, req, pc.keys); err != nil {
		return nil, err
	}
	if err := pc.bw.Flush(); err != nil {
		return nil, err
	}
	pc.cr.limit = maxHeaderBytes
	var resp *http.Response
	for n := 0; ; n++ {
		r, err := readResponse(pc.br, req)
		if err != nil {
			return nil, err
		}
		if r.StatusCode >= 200 || r.StatusCode == http.StatusSwitchingProtocols {
			resp = r
			break
		}
		if n == max1xx {
			return nil, errors.New("h1: too many 1xx informational responses")
		}
	}
	pc.cr.limit = -1
	reuse := !resp.Close && !req.Close && resp.StatusCode != http.StatusSwitchingProtocols
	if resp.Body == http.NoBody {
		pc.done(reuse)
		return resp, nil
	}
	resp.Body = &body{rc: resp.Body, pc: pc, reuse: reuse}
	return resp, nil
}

// done ends pc's request: it goes back to the pool when reuse holds, its
// context did not poison its deadline, and nothing came after the answer,
// else it is closed. Bytes already buffered beyond the answer (a 204 with
// a body, a body longer than its Content-Length) would be read as the
// start of the next request's answer, which may be another tenant's.
func (pc *conn) done(reuse bool) {
	stopped := pc.stop()
	pc.stop = nil
	if stopped && reuse && pc.br.Buffered() == 0 {
		pc.c.put(pc)
		return
	}
	_ = pc.nc.Close()
}

// close closes pc after a failed request.
func (pc *conn) close() {
	if pc.stop != nil {
		pc.stop()
	}
	_ = pc.nc.Close()
}

// body is a response body that hands its connection back at its end.
type body struct {
	rc    io.ReadCloser
	pc    *conn // nil once handed back or closed
	reuse bool
}

func (b *body) Read(p []byte) (int, error) {
	if b.pc == nil {
		return b.rc.Read(p)
	}
	n, err := b.rc.Read(p)
	if err != nil {
		pc := b.pc
		b.pc = nil
		pc.done(b.reuse && err == io.EOF)
	}
	return n, err
}

// Close closes a body not read to its end with its connection, since
// what is left of it would come before the next response.
func (b *body) Close() error {
	if pc := b.pc; pc != nil {
		b.pc = nil
		pc.close()
	}
	return b.rc.Close()
}

// get returns an idle connection to addr, the newest, or dials one. It
// first makes sure that the upstream has neither closed the idle one nor
// sent on it what no request asked for (closedByPeer): such bytes would
// be read as the next answer, so the connection is closed, as net/http's
// Transport closes an idle connection that receives anything. That costs
// one non-blocking system call per reused connection, where the
// Transport keeps a goroutine reading every connection.
func (c *Client) get(ctx context.Context, addr string) (*conn, bool, error) {
	for {
		c.mu.Lock()
		l := c.idle[addr]
		if len(l) == 0 {
			c.mu.Unlock()
			break
		}
		pc := l[len(l)-1]
		l[len(l)-1] = nil
		c.idle[addr] = l[:len(l)-1]
		c.mu.Unlock()
		pc.timer.Stop() // if it fired, it finds pc gone from the pool
		if closedByPeer(pc.nc) {
			_ = pc.nc.Close()
			continue
		}
		return pc, true, nil
	}
	nc, err := c.Dial(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	pc := &conn{c: c, addr: addr, nc: nc}
	pc.cr = countedConn{Conn: nc, limit: -1}
	pc.br = bufio.NewReader(&pc.cr)
	pc.bw = bufio.NewWriter(&pc.cr)
	return pc, false, nil
}

// put pools pc, or closes it when the pool is full or closed.
func (c *Client) put(pc *conn) {
	c.mu.Lock()
	if c.closed || len(c.idle[pc.addr]) >= c.MaxIdlePerHost {
		c.mu.Unlock()
		_ = pc.nc.Close()
		return
	}
	if c.idle == nil {
		c.idle = map[string][]*conn{}
	}
	c.idle[pc.addr] = append(c.idle[pc.addr], pc)
	if pc.timer == nil {
		pc.timer = time.AfterFunc(c.IdleTimeout, func() { c.expire(pc) })
	} else {
		pc.timer.Reset(c.IdleTimeout)
	}
	c.mu.Unlock()
}

// expire closes pc if it is still idle.
func (c *Client) expire(pc *conn) {
	c.mu.Lock()
	l := c.idle[pc.addr]
	for i, x := range l {
		if x == pc {
			c.idle[pc.addr] = append(l[:i], l[i+1:]...)
			l[len(l)-1] = nil
			c.mu.Unlock()
			_ = pc.nc.Close()
			return
		}
	}
	c.mu.Unlock()
}

// CloseIdleConnections closes the idle connections, and those that go
// idle from now on.
func (c *Client) CloseIdleConnections() {
	c.mu.Lock()
	idle := c.idle
	c.idle, c.closed = nil, true
	c.mu.Unlock()
	for _, l := range idle {
		for _, pc := range l {
			pc.timer.Stop()
			_ = pc.nc.Close()
		}
	}
}
