package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

// exchangeStream is an exchange stream to a test plugin, driven frame by
// frame as the host would.
type exchangeStream struct {
	s      hostStream
	frames chan *pluginv1.ExchangeFrame // what the plugin sent; closed when the stream ends
	err    error                        // why it ended; read after frames is closed
}

// hostStream is the host's side of an exchange stream.
type hostStream interface {
	Send(*pluginv1.ExchangeFrame) error
	Recv() (*pluginv1.ExchangeFrame, error)
	// CloseSend ends what the host sends; the plugin reads the end.
	CloseSend() error
}

// transport is what an exchange stream runs over.
type transport string

const (
	grpcStream transport = "exchange_stream" // an Exchange gRPC stream
	dataConn   transport = "data_plane"      // a data-plane connection
)

// forTransports runs test once over each transport.
func forTransports(t *testing.T, test func(t *testing.T, tr transport)) {
	for _, tr := range []transport{grpcStream, dataConn} {
		t.Run(string(tr), func(t *testing.T) { test(t, tr) })
	}
}

// dataHost is the host's end of a data-plane connection.
type dataHost struct {
	*wire.Conn
	raw *net.UnixConn
}

func (d dataHost) Send(f *pluginv1.ExchangeFrame) error {
	fr, err := d.Encode(f)
	if err != nil {
		return err
	}
	return d.Conn.Send(fr, true)
}

func (d dataHost) CloseSend() error { return d.raw.CloseWrite() }

// openExchange opens an exchange stream over tr that lasts as long as ctx.
func (tp *testPlugin) openExchange(t *testing.T, tr transport, ctx context.Context) *exchangeStream {
	t.Helper()
	var s hostStream
	switch tr {
	case grpcStream:
		cs, err := tp.client.Exchange(ctx)
		if err != nil {
			t.Fatalf("Exchange() = %v", err)
		}
		s = cs
	case dataConn:
		if len(tp.data) == 0 {
			t.Fatal("the test plugin has no data-plane connection left")
		}
		raw := tp.data[0]
		tp.data = tp.data[1:]
		c := dataHost{Conn: wire.NewConn(raw), raw: raw}
		stop := context.AfterFunc(ctx, func() { _ = c.Close() })
		t.Cleanup(func() {
			stop()
			_ = c.Close()
		})
		s = c
	}
	// Room for every frame a test provokes, so the reader never blocks.
	xs := &exchangeStream{s: s, frames: make(chan *pluginv1.ExchangeFrame, 1024)}
	tp.goCall(func() {
		defer close(xs.frames)
		for {
			f, err := s.Recv()
			if err != nil {
				xs.err = err
				return
			}
			xs.frames <- f
		}
	})
	return xs
}

// request sends a request frame; a zero deadline sends none.
func (xs *exchangeStream) request(t *testing.T, id uint64, req *pluginv1.HTTPRequest, deadline time.Time) {
	t.Helper()
	xr := &pluginv1.ExchangeRequest{Request: req}
	if !deadline.IsZero() {
		xr.DeadlineUnixNano = deadline.UnixNano()
	}
	if err := xs.s.Send(&pluginv1.ExchangeFrame{Id: id, Kind: &pluginv1.ExchangeFrame_Request{Request: xr}}); err != nil {
		t.Fatalf("Send(request %d) = %v", id, err)
	}
}

func (xs *exchangeStream) cancel(t *testing.T, id uint64) {
	t.Helper()
	if err := xs.s.Send(&pluginv1.ExchangeFrame{Id: id, Kind: &pluginv1.ExchangeFrame_Cancel{Cancel: &pluginv1.ExchangeCancel{}}}); err != nil {
		t.Fatalf("Send(cancel %d) = %v", id, err)
	}
}

// response returns the next frame, which must be a response.
func (xs *exchangeStream) response(t *testing.T) (uint64, *pluginv1.ExchangeResponse) {
	t.Helper()
	select {
	case f, ok := <-xs.frames:
		if !ok {
			t.Fatalf("Exchange stream ended (%v), want a response", xs.err)
		}
		if f.GetResponse() == nil {
			t.Fatalf("Exchange frame %v, want a response", f)
		}
		return f.GetId(), f.GetResponse()
	case <-time.After(10 * time.Second):
		t.Fatal("no response within 10s")
		return 0, nil
	}
}

// end waits for the stream to end and returns why.
func (xs *exchangeStream) end(t *testing.T) error {
	t.Helper()
	for {
		select {
		case f, ok := <-xs.frames:
			if !ok {
				return xs.err
			}
			t.Errorf("Exchange frame %v, want the stream to end", f)
		case <-time.After(10 * time.Second):
			t.Fatal("stream did not end within 10s")
			return nil
		}
	}
}

func TestExchangeConcurrent(t *testing.T) { forTransports(t, testExchangeConcurrent) }

func testExchangeConcurrent(t *testing.T, tr transport) {
	const n = 20
	// Every handler waits until all n have started, so they only finish
	// if they run at once.
	var started atomic.Int64
	all := newGate(t)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if started.Add(1) == n {
			all.open()
		}
		all.wait(r)
		io.WriteString(w, r.URL.Path)
	})
	tp := startPlugin(t, pluginWith(h))
	xs := tp.openExchange(t, tr, t.Context())
	for id := range uint64(n) {
		xs.request(t, id+1, &pluginv1.HTTPRequest{Method: "GET", Path: fmt.Sprintf("/%d", id+1)}, time.Now().Add(time.Minute))
	}
	got := map[uint64]string{}
	want := map[uint64]string{}
	for id := range uint64(n) {
		want[id+1] = fmt.Sprintf("200 /%d", id+1)
		rid, resp := xs.response(t)
		got[rid] = fmt.Sprintf("%d %s", resp.GetResponse().GetStatus(), resp.GetResponse().GetBody())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("responses by id mismatch (-want +got):\n%s", diff)
	}
}

func TestExchangeRequest(t *testing.T) { forTransports(t, testExchangeRequest) }

func testExchangeRequest(t *testing.T, tr transport) {
	tp := startPlugin(t, pluginWith(echoHandler()))
	xs := tp.openExchange(t, tr, t.Context())
	req := &pluginv1.HTTPRequest{
		Method:   "POST",
		Path:     "/items/42",
		RawQuery: "a=1",
		Headers:  []*pluginv1.Header{{Name: "X-Multi", Values: []string{"1", "2"}}},
		Body:     []byte(`{"x":1}`),
		Host:     "example.com",
	}
	xs.request(t, 7, req, time.Time{})
	id, resp := xs.response(t)
	if id != 7 || resp.GetAborted() || resp.GetResponse().GetStatus() != http.StatusCreated {
		t.Fatalf("response = id %d %v, want id 7 status 201", id, resp)
	}
	wantHeader := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}}
	if diff := cmp.Diff(wantHeader, headerOf(resp.GetResponse().GetHeaders())); diff != "" {
		t.Errorf("response headers mismatch (-want +got):\n%s", diff)
	}
	for _, want := range []string{`"Method":"POST"`, `"RequestURI":"/items/42?a=1"`, `"X-Multi":["1","2"]`, `"Body":"{\"x\":1}"`, `"Host":"example.com"`} {
		if !strings.Contains(string(resp.GetResponse().GetBody()), want) {
			t.Errorf("request seen by the handler = %s, want it to contain %s", resp.GetResponse().GetBody(), want)
		}
	}
}

func TestExchangeCancel(t *testing.T) { forTransports(t, testExchangeCancel) }

func testExchangeCancel(t *testing.T, tr transport) {
	started := make(chan struct{}, 1)
	ended := make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/block", func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-r.Context().Done()
		ended <- r.Context().Err()
		io.WriteString(w, "too late")
	})
	mux.Handle("/ok", okHandler())
	tp := startPlugin(t, pluginWith(mux))
	xs := tp.openExchange(t, tr, t.Context())

	xs.cancel(t, 99) // for no request: ignored
	xs.request(t, 1, &pluginv1.HTTPRequest{Method: "GET", Path: "/block"}, time.Now().Add(time.Minute))
	waitFor(t, started, "the handler to start")
	xs.cancel(t, 1)
	if err := waitFor(t, ended, "the handler to see the cancel"); !errors.Is(err, context.Canceled) {
		t.Errorf("r.Context().Err() after a cancel frame = %v, want %v", err, context.Canceled)
	}
	// The cancelled request is not answered: the next response is the
	// next request's.
	xs.request(t, 2, &pluginv1.HTTPRequest{Method: "GET", Path: "/ok"}, time.Time{})
	if id, resp := xs.response(t); id != 2 || string(resp.GetResponse().GetBody()) != "ok" {
		t.Errorf("response = id %d %v, want id 2 ok", id, resp)
	}
}

func TestExchangeDeadline(t *testing.T) { forTransports(t, testExchangeDeadline) }

func testExchangeDeadline(t *testing.T, tr transport) {
	const noDeadline = "none"
	ended := make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/deadline", func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		if !ok {
			io.WriteString(w, noDeadline)
			return
		}
		io.WriteString(w, dl.Format(time.RFC3339Nano))
	})
	mux.HandleFunc("/block", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		ended <- r.Context().Err()
	})
	tp := startPlugin(t, pluginWith(mux))
	xs := tp.openExchange(t, tr, t.Context())

	dl := time.Now().Add(30 * time.Second)
	tests := []struct {
		name     string
		deadline time.Time
		want     string
	}{
		{name: "caller deadline", deadline: dl, want: time.Unix(0, dl.UnixNano()).Format(time.RFC3339Nano)},
		{name: "no deadline", want: noDeadline},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			xs.request(t, uint64(i+1), &pluginv1.HTTPRequest{Method: "GET", Path: "/deadline"}, tt.deadline)
			if _, resp := xs.response(t); string(resp.GetResponse().GetBody()) != tt.want {
				t.Errorf("r.Context().Deadline() = %s, want %s", resp.GetResponse().GetBody(), tt.want)
			}
		})
	}

	t.Run("deadline passes", func(t *testing.T) {
		xs.request(t, 10, &pluginv1.HTTPRequest{Method: "GET", Path: "/block"}, time.Now().Add(100*time.Millisecond))
		if err := waitFor(t, ended, "the handler's deadline"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("r.Context().Err() = %v, want %v", err, context.DeadlineExceeded)
		}
		// It is not answered: the next response is the next request's.
		xs.request(t, 11, &pluginv1.HTTPRequest{Method: "GET", Path: "/deadline"}, time.Time{})
		if id, _ := xs.response(t); id != 11 {
			t.Errorf("response id = %d, want 11", id)
		}
	})
}

func TestExchangeStreamEnd(t *testing.T) { forTransports(t, testExchangeStreamEnd) }

func testExchangeStreamEnd(t *testing.T, tr transport) {
	tests := []struct {
		name string
		end  func(cancel context.CancelFunc, s hostStream) error
	}{
		{name: "host cancels the stream", end: func(cancel context.CancelFunc, _ hostStream) error {
			cancel()
			return nil
		}},
		{name: "host closes its side", end: func(_ context.CancelFunc, s hostStream) error {
			return s.CloseSend()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const n = 5
			started := make(chan struct{}, n)
			ended := make(chan error, n)
			tp := startPlugin(t, pluginWith(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				started <- struct{}{}
				<-r.Context().Done()
				ended <- r.Context().Err()
			})))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			xs := tp.openExchange(t, tr, ctx)
			for id := range uint64(n) {
				xs.request(t, id+1, &pluginv1.HTTPRequest{Method: "GET", Path: "/"}, time.Time{})
			}
			for range n {
				waitFor(t, started, "the handlers to start")
			}
			if err := tt.end(cancel, xs.s); err != nil {
				t.Fatalf("ending the stream: %v", err)
			}
			for range n {
				if err := waitFor(t, ended, "the handlers to be cancelled"); !errors.Is(err, context.Canceled) {
					t.Errorf("r.Context().Err() after the stream ended = %v, want %v", err, context.Canceled)
				}
			}
			xs.end(t)
			// Nothing is left in flight.
			resp, err := tp.client.Drain(t.Context(), &pluginv1.DrainRequest{DeadlineUnixNano: time.Now().Add(10 * time.Second).UnixNano()})
			if err != nil || resp.GetAbandoned() != 0 {
				t.Errorf("Drain() after the stream ended = %v, %v, want nothing abandoned", resp, err)
			}
		})
	}
}

func TestExchangePanic(t *testing.T) { forTransports(t, testExchangePanic) }

func testExchangePanic(t *testing.T, tr transport) {
	mux := http.NewServeMux()
	mux.HandleFunc("/panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
	mux.HandleFunc("/abort", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "half")
		panic(http.ErrAbortHandler)
	})
	mux.HandleFunc("/bad-header", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Bad", "\xff") // not UTF-8: protobuf cannot encode it
		io.WriteString(w, "ok")
	})
	mux.Handle("/ok", okHandler())
	tp := startPlugin(t, pluginWith(mux))
	xs := tp.openExchange(t, tr, t.Context())

	xs.request(t, 1, &pluginv1.HTTPRequest{Method: "GET", Path: "/panic"}, time.Time{})
	_, resp := xs.response(t)
	if resp.GetResponse().GetStatus() != http.StatusInternalServerError || decodeError(t, resp.GetResponse().GetBody()).Error.Code != "internal" {
		t.Errorf("response to a panic = %v, want 500 internal", resp)
	}
	if recs := tp.logs.records(t, "handler panicked"); len(recs) != 1 {
		t.Errorf("log has %d %q records, want 1", len(recs), "handler panicked")
	}

	xs.request(t, 2, &pluginv1.HTTPRequest{Method: "GET", Path: "/abort"}, time.Time{})
	if _, resp := xs.response(t); !resp.GetAborted() || resp.GetResponse() != nil {
		t.Errorf("response to http.ErrAbortHandler = %v, want aborted without a response", resp)
	}

	// A response gRPC cannot send fails alone, not the stream.
	xs.request(t, 3, &pluginv1.HTTPRequest{Method: "GET", Path: "/bad-header"}, time.Time{})
	if _, resp := xs.response(t); !resp.GetAborted() {
		t.Errorf("response with a header that is not UTF-8 = %v, want aborted", resp)
	}
	if recs := tp.logs.records(t, "cannot send response"); len(recs) != 1 {
		t.Errorf("log has %d %q records, want 1", len(recs), "cannot send response")
	}

	xs.request(t, 4, &pluginv1.HTTPRequest{Method: "GET", Path: "/ok"}, time.Time{})
	if id, resp := xs.response(t); id != 4 || resp.GetResponse().GetStatus() != http.StatusOK || string(resp.GetResponse().GetBody()) != "ok" {
		t.Errorf("response after them = id %d %v, want id 4 200 ok", id, resp)
	}
}

func TestExchangeDrain(t *testing.T) { forTransports(t, testExchangeDrain) }

func testExchangeDrain(t *testing.T, tr transport) {
	started := make(chan struct{})
	release := newGate(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		release.wait(r)
		io.WriteString(w, "slow done")
	})
	mux.Handle("/fast", okHandler())
	p := pluginWith(mux)
	draining := make(chan struct{})
	p.Drain = func(context.Context) error {
		close(draining) // new requests are refused from now on
		return nil
	}
	tp := startPlugin(t, p)
	xs := tp.openExchange(t, tr, t.Context())

	xs.request(t, 1, &pluginv1.HTTPRequest{Method: "GET", Path: "/slow"}, time.Time{})
	waitFor(t, started, "the slow handler to start")
	drained := make(chan struct{})
	var (
		drainResp *pluginv1.DrainResponse
		drainErr  error
	)
	tp.goCall(func() {
		defer close(drained)
		drainResp, drainErr = tp.client.Drain(t.Context(), &pluginv1.DrainRequest{DeadlineUnixNano: time.Now().Add(time.Minute).UnixNano()})
	})
	// A request that arrives once the drain has begun gets 503.
	waitFor(t, draining, "the Drain hook")
	xs.request(t, 2, &pluginv1.HTTPRequest{Method: "GET", Path: "/fast"}, time.Time{})
	if id, resp := xs.response(t); id != 2 {
		t.Errorf("response id = %d, want 2", id)
	} else {
		r := resp.GetResponse()
		checkDraining(t, "Exchange(/fast)", r.GetStatus(), headerOf(r.GetHeaders()), r.GetBody())
	}
	select {
	case <-drained:
		t.Fatal("Drain() returned while a request was in flight on an Exchange stream")
	default:
	}
	release.open()
	if id, resp := xs.response(t); id != 1 || string(resp.GetResponse().GetBody()) != "slow done" {
		t.Errorf("in-flight response = id %d %v, want id 1 slow done", id, resp)
	}
	waitFor(t, drained, "Drain to return")
	if drainErr != nil || drainResp.GetCompleted() != 1 || drainResp.GetAbandoned() != 0 {
		t.Errorf("Drain() = %v, %v, want completed 1 abandoned 0", drainResp, drainErr)
	}
}

func TestExchangeDuplicateID(t *testing.T) { forTransports(t, testExchangeDuplicateID) }

func testExchangeDuplicateID(t *testing.T, tr transport) {
	ended := make(chan error, 1)
	tp := startPlugin(t, pluginWith(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		ended <- r.Context().Err()
	})))
	xs := tp.openExchange(t, tr, t.Context())
	xs.request(t, 1, &pluginv1.HTTPRequest{Method: "GET", Path: "/"}, time.Time{})
	xs.request(t, 1, &pluginv1.HTTPRequest{Method: "GET", Path: "/"}, time.Time{})
	// An Exchange stream ends with the error; a data-plane connection
	// is closed, and the error logged.
	err := xs.end(t)
	switch {
	case tr == grpcStream && status.Code(err) != codes.InvalidArgument:
		t.Errorf("Exchange stream with a repeated request id ended with %v, want code %v", err, codes.InvalidArgument)
	case tr == dataConn && err != io.EOF:
		t.Errorf("data-plane connection with a repeated request id ended with %v, want %v", err, io.EOF)
	}
	if err := waitFor(t, ended, "the first request to be cancelled"); !errors.Is(err, context.Canceled) {
		t.Errorf("r.Context().Err() of the first request = %v, want %v", err, context.Canceled)
	}
}
