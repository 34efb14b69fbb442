//go:build unix

package dataplane_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/host/dataplane"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

func TestRequestFrames(t *testing.T) {
	big := pattern(3*wire.PieceBytes + 5)
	deadline := time.Now().Add(time.Hour)
	tests := []struct {
		name      string
		req       dataplane.Request
		deadline  bool
		wantFirst int // bytes of the body in the head
	}{
		{
			name: "every field",
			req: dataplane.Request{
				Method: "POST", Path: "/items/7", RawQuery: "a=1", Header: http.Header{"X-Multi": {"1", "2"}},
				Body: [][]byte{[]byte("small")}, RemoteAddr: "203.0.113.7:5555", Host: "example.com",
				Pattern: "POST /items/{id}", RequestID: "req-1",
			},
			deadline:  true,
			wantFirst: 5,
		},
		{name: "no body, no deadline", req: dataplane.Request{Method: "GET", Path: "/"}},
		{name: "streaming", req: dataplane.Request{Method: "GET", Path: "/events", Streaming: true}},
		{name: "body in pieces", req: dataplane.Request{Method: "PUT", Path: "/blob", Body: [][]byte{big}}, wantFirst: wire.PieceBytes},
		{name: "body of exactly a piece", req: dataplane.Request{Method: "PUT", Path: "/blob", Body: [][]byte{big[:wire.PieceBytes]}}, wantFirst: wire.PieceBytes},
		{
			name: "body as it arrived, in pieces of any size",
			req: dataplane.Request{Method: "PUT", Path: "/blob", Body: [][]byte{
				{}, big[:4<<10], big[4<<10 : 8<<10], {}, big[8<<10 : 150<<10], big[150<<10 : 150<<10+1], {},
			}},
			wantFirst: 4 << 10,
		},
		{name: "empty pieces only", req: dataplane.Request{Method: "PUT", Path: "/blob", Body: [][]byte{{}, {}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1)
			ctx := t.Context()
			if tt.deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, deadline)
				defer cancel()
			}
			rt := h.goRoundTrip(ctx, &tt.req)
			fake := h.fakes[0]
			f := fake.recv()
			got := f.GetRequest()
			if got == nil {
				t.Fatalf("first frame = %v, want a request head", f)
			}
			r := got.GetRequest()
			gotHeader := http.Header{}
			wire.HeadersFromProto(gotHeader, r.GetHeaders())
			if len(tt.req.Header) == 0 {
				gotHeader = nil
			}
			gotReq := dataplane.Request{
				Method: r.GetMethod(), Path: r.GetPath(), RawQuery: r.GetRawQuery(), Header: gotHeader,
				RemoteAddr: r.GetRemoteAddr(), Host: r.GetHost(), Pattern: r.GetPattern(), RequestID: r.GetRequestId(),
				Streaming: got.GetStreaming(),
			}
			wantReq := tt.req
			wantReq.Body = nil
			if diff := cmp.Diff(wantReq, gotReq); diff != "" {
				t.Errorf("request head mismatch (-want +got):\n%s", diff)
			}
			var wantDeadline int64
			if tt.deadline {
				wantDeadline = deadline.UnixNano()
			}
			if got.GetDeadlineUnixNano() != wantDeadline {
				t.Errorf("head deadline = %d, want %d", got.GetDeadlineUnixNano(), wantDeadline)
			}
			if n := len(r.GetBody()); n != tt.wantFirst {
				t.Errorf("head carries %d bytes of body, want %d", n, tt.wantFirst)
			}
			sent := bytes.Join(tt.req.Body, nil)
			if more := len(sent) > tt.wantFirst; got.GetMore() != more {
				t.Errorf("head more = %t, want %t", got.GetMore(), more)
			}
			body := bytes.Clone(r.GetBody())
			for more := got.GetMore(); more; {
				b := fake.recv()
				if b.GetId() != f.GetId() || b.GetBody() == nil {
					t.Fatalf("frame after the head = %v, want a body piece of request %d", b, f.GetId())
				}
				if n := len(b.GetBody().GetData()); n == 0 || n > wire.PieceBytes {
					t.Errorf("body piece of %d bytes, want 1 to %d", n, wire.PieceBytes)
				}
				body = append(body, b.GetBody().GetData()...)
				more = !b.GetBody().GetEnd()
			}
			if !bytes.Equal(body, sent) {
				t.Errorf("plugin got a body of %d bytes, want the %d sent", len(body), len(sent))
			}
			fake.answer(f.GetId(), "ok")
			res := await(t, rt, "RoundTrip")
			if res.err != nil {
				t.Fatalf("RoundTrip() = %v", res.err)
			}
			if pieces, err := readAll(t, res.resp); err != nil || len(pieces) != 1 || string(pieces[0]) != "ok" {
				t.Errorf("response body = %q, %v, want ok", pieces, err)
			}
		})
	}
}

func TestResponse(t *testing.T) {
	const id = 1 // the first request on a connection
	tests := []struct {
		name       string
		frames     []*pluginv1.Frame
		wantStatus int
		wantSize   int64
		wantPieces []string
		wantErr    error
	}{
		{
			name:       "whole",
			frames:     []*pluginv1.Frame{head(id, 201, []byte("hello"), false, 0)},
			wantStatus: 201, wantSize: 5, wantPieces: []string{"hello"},
		},
		{
			name:       "empty",
			frames:     []*pluginv1.Frame{head(id, 204, nil, false, 0)},
			wantStatus: 204, wantSize: 0,
		},
		{
			name:       "pieces of a size said in advance",
			frames:     []*pluginv1.Frame{head(id, 200, []byte("hello"), true, 10), piece(id, []byte("world"), true)},
			wantStatus: 200, wantSize: 10, wantPieces: []string{"hello", "world"},
		},
		{
			name:       "pieces of unknown size, empty last",
			frames:     []*pluginv1.Frame{head(id, 200, nil, true, 0), piece(id, []byte("a"), false), piece(id, nil, true)},
			wantStatus: 200, wantSize: -1, wantPieces: []string{"a"},
		},
		{
			name:       "abort after the head",
			frames:     []*pluginv1.Frame{head(id, 200, []byte("a"), true, 0), abort(id)},
			wantStatus: 200, wantSize: -1, wantPieces: []string{"a"}, wantErr: dataplane.ErrAborted,
		},
		{
			name:       "a second head",
			frames:     []*pluginv1.Frame{head(id, 200, []byte("a"), true, 0), head(id, 500, []byte("b"), false, 0)},
			wantStatus: 200, wantSize: -1, wantPieces: []string{"a"}, wantErr: dataplane.ErrAborted,
		},
		{
			name: "frames of unknown requests are ignored",
			frames: []*pluginv1.Frame{
				head(id+100, 500, []byte("x"), true, 0), piece(id+101, []byte("y"), true), abort(id + 102),
				head(id, 200, []byte("a"), true, 0),
				head(id+103, 500, nil, false, 0),
				piece(id, []byte("b"), true),
			},
			wantStatus: 200, wantSize: -1, wantPieces: []string{"a", "b"},
		},
		{
			// Frames only the host sends, sent by the plugin.
			name: "frames of the wrong direction are ignored",
			frames: []*pluginv1.Frame{
				{Id: id, Kind: &pluginv1.Frame_Window{Window: &pluginv1.Window{Bytes: 1}}},
				{Id: id, Kind: &pluginv1.Frame_Cancel{Cancel: &pluginv1.Cancel{}}},
				{Id: id, Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{}}},
				{Id: id},
				head(id, 200, []byte("a"), true, 0),
				{Id: id, Kind: &pluginv1.Frame_Window{Window: &pluginv1.Window{Bytes: 1}}},
				piece(id, []byte("b"), true),
			},
			wantStatus: 200, wantSize: -1, wantPieces: []string{"a", "b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1)
			rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
			fake := h.fakes[0]
			if got, _, _ := fake.recvRequest(); got != id {
				t.Fatalf("first request has id %d, want %d", got, id)
			}
			fake.send(tt.frames...)
			res := await(t, rt, "RoundTrip")
			if res.err != nil {
				t.Fatalf("RoundTrip() = %v", res.err)
			}
			if res.resp.Status != tt.wantStatus || res.resp.Size != tt.wantSize {
				t.Errorf("RoundTrip() = status %d size %d, want %d and %d", res.resp.Status, res.resp.Size, tt.wantStatus, tt.wantSize)
			}
			done := make(chan struct{})
			var pieces [][]byte
			var err error
			h.calls.Go(func() {
				defer close(done)
				pieces, err = readAll(t, res.resp)
			})
			await(t, done, "the body")
			var got []string
			for _, p := range pieces {
				got = append(got, string(p))
			}
			if diff := cmp.Diff(tt.wantPieces, got); diff != "" {
				t.Errorf("pieces mismatch (-want +got):\n%s", diff)
			}
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("body ended with %v, want %v", err, tt.wantErr)
			}
			if h.tr.Live() != 1 {
				t.Errorf("Live() = %d after a request, want the connection kept", h.tr.Live())
			}
		})
	}
}

func TestRoundTripFails(t *testing.T) {
	const id = 1
	tests := []struct {
		name string
		// plugin answers the request as the plugin.
		plugin   func(p *fakePlugin)
		wantErr  error
		wantLive int
	}{
		{
			name:     "abort before the head",
			plugin:   func(p *fakePlugin) { p.send(abort(id)) },
			wantErr:  dataplane.ErrAborted,
			wantLive: 1,
		},
		{
			name:     "body piece before the head",
			plugin:   func(p *fakePlugin) { p.send(piece(id, []byte("x"), true)) },
			wantErr:  dataplane.ErrAborted,
			wantLive: 1,
		},
		{
			name:    "connection closed before the head",
			plugin:  func(p *fakePlugin) { _ = p.c.Close() },
			wantErr: dataplane.ErrUnavailable,
		},
		{
			name: "a frame that cannot be decoded",
			plugin: func(p *fakePlugin) {
				if _, err := p.raw.Write([]byte{0, 0, 0, 2, 0xff, 0xff}); err != nil {
					p.t.Fatal(err)
				}
			},
			wantErr: dataplane.ErrUnavailable,
		},
		{
			name: "a frame over the limit",
			plugin: func(p *fakePlugin) {
				if _, err := p.raw.Write([]byte{0xff, 0xff, 0xff, 0xff}); err != nil {
					p.t.Fatal(err)
				}
			},
			wantErr: dataplane.ErrUnavailable,
		},
		{
			// The host reads no more than a head and a piece from a
			// plugin: a frame claiming 2 MiB breaks the connection
			// before its bytes are read.
			name: "a frame over what a plugin may send",
			plugin: func(p *fakePlugin) {
				if _, err := p.raw.Write([]byte{0, 0x20, 0, 0}); err != nil {
					p.t.Fatal(err)
				}
			},
			wantErr: dataplane.ErrUnavailable,
		},
		{
			name: "the connection ends inside a frame",
			plugin: func(p *fakePlugin) {
				if _, err := p.raw.Write([]byte{0, 0, 0, 9, 1}); err != nil {
					p.t.Fatal(err)
				}
				_ = p.c.Close()
			},
			wantErr: dataplane.ErrUnavailable,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1)
			rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
			fake := h.fakes[0]
			fake.recvRequest()
			tt.plugin(fake)
			res := await(t, rt, "RoundTrip")
			if !errors.Is(res.err, tt.wantErr) {
				t.Errorf("RoundTrip() = %v, %v, want %v", res.resp, res.err, tt.wantErr)
			}
			waitLive(t, h.tr, tt.wantLive)
		})
	}
}

// waitLive waits until tr.Live() is want: a connection breaks in the
// transport's receiver, a moment after its peer is gone.
func waitLive(t *testing.T, tr dataplane.Transport, want int) {
	t.Helper()
	for end := time.Now().Add(waitTime); tr.Live() != want; {
		if time.Now().After(end) {
			t.Fatalf("Live() = %d after %v, want %d", tr.Live(), waitTime, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestWindow(t *testing.T) {
	tests := []struct {
		name    string
		extra   int // bytes sent beyond the window
		wantErr error
	}{
		{name: "exactly the window", extra: 0},
		{name: "a byte beyond the window", extra: 1, wantErr: dataplane.ErrAborted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1)
			fake := h.fakes[0]
			rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
			id, _, _ := fake.recvRequest()
			body := pattern(wire.ResponseWindow + tt.extra)
			fake.send(head(id, 200, body[:wire.PieceBytes], true, 0))
			for rest := body[wire.PieceBytes:]; len(rest) > 0; {
				n := min(len(rest), wire.PieceBytes)
				fake.send(piece(id, rest[:n], n == len(rest)))
				rest = rest[n:]
			}
			res := await(t, rt, "RoundTrip")
			if res.err != nil {
				t.Fatalf("RoundTrip() = %v", res.err)
			}
			// A second request, answered after the first's frames, tells
			// when the transport has taken them all in: until the caller
			// reads, it holds them all against the window.
			rt2 := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/barrier"})
			// Past its window the answer is unusable: the host tells the
			// plugin to stop producing it, before or after it sends the
			// second request.
			var id2 uint64
			cancelled := false
			for id2 == 0 || tt.wantErr != nil && !cancelled {
				switch f := fake.recv(); {
				case f.GetRequest() != nil:
					id2 = f.GetId()
				case f.GetCancel() != nil && f.GetId() == id && tt.wantErr != nil:
					cancelled = true
				default:
					t.Fatalf("frame = %v, want the second request's head or, after a breach, a cancel of request %d", f, id)
				}
			}
			fake.answer(id2, "")
			if res := await(t, rt2, "the second RoundTrip"); res.err != nil {
				t.Fatalf("second RoundTrip() = %v", res.err)
			}
			pieces, err := readAll(t, res.resp)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("body ended with %v, want %v", err, tt.wantErr)
			}
			if got := bytes.Join(pieces, nil); !bytes.Equal(got, body[:len(got)]) || len(got) < wire.ResponseWindow {
				t.Errorf("read %d bytes of body, want the first %d intact", len(got), wire.ResponseWindow)
			}
		})
	}
}

// TestWindowGrants checks that credit comes back as the caller reads, all
// of it once the caller has read everything sent.
func TestWindowGrants(t *testing.T) {
	h := newHarness(t, 1)
	fake := h.fakes[0]
	rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
	id, _, _ := fake.recvRequest()
	body := pattern(wire.ResponseWindow)
	fake.send(head(id, 200, body[:wire.PieceBytes], true, 0))
	for rest := body[wire.PieceBytes:]; len(rest) > 0; rest = rest[wire.PieceBytes:] {
		fake.send(piece(id, rest[:wire.PieceBytes], false))
	}
	res := await(t, rt, "RoundTrip")
	if res.err != nil {
		t.Fatalf("RoundTrip() = %v", res.err)
	}
	var got []byte
	for len(got) < len(body) {
		p, err := res.resp.Next()
		if err != nil {
			t.Fatalf("Next() after %d bytes = %v", len(got), err)
		}
		got = append(got, p...)
	}
	// The caller waits for more, and so has consumed all it was given.
	next := h.goNext(res.resp)
	var granted int64
	for granted < wire.ResponseWindow {
		f := fake.recv()
		w := f.GetWindow()
		if w == nil || f.GetId() != id {
			t.Fatalf("frame after %d bytes granted = %v, want a window for request %d", granted, f, id)
		}
		granted += int64(w.GetBytes())
	}
	if granted != wire.ResponseWindow {
		t.Errorf("granted %d bytes, want the %d read", granted, wire.ResponseWindow)
	}
	fake.send(piece(id, []byte("end"), true))
	if r := await(t, next, "Next"); r.err != nil || string(r.piece) != "end" {
		t.Errorf("Next() = %q, %v, want the last piece", r.piece, r.err)
	}
	if _, err := res.resp.Next(); err != io.EOF {
		t.Errorf("Next() after the end = %v, want io.EOF", err)
	}
}

func TestCancel(t *testing.T) {
	tests := []struct {
		name string
		// giveUp gives up on the request while it waits for its head
		// (resp is nil) or after it.
		afterHead bool
		giveUp    func(cancel context.CancelFunc, resp *dataplane.Response) error
		wantErr   error
	}{
		{
			name:    "context cancelled before the head",
			giveUp:  func(cancel context.CancelFunc, _ *dataplane.Response) error { cancel(); return nil },
			wantErr: context.Canceled,
		},
		{
			name:      "context cancelled while reading",
			afterHead: true,
			giveUp: func(cancel context.CancelFunc, resp *dataplane.Response) error {
				cancel()
				_, err := resp.Next()
				return err
			},
			wantErr: context.Canceled,
		},
		{
			name:      "Close while reading",
			afterHead: true,
			giveUp: func(_ context.CancelFunc, resp *dataplane.Response) error {
				resp.Close()
				return nil
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, 1)
			fake := h.fakes[0]
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			rt := h.goRoundTrip(ctx, &dataplane.Request{Method: "GET", Path: "/"})
			id, _, _ := fake.recvRequest()
			var err error
			if tt.afterHead {
				fake.send(head(id, 200, []byte("a"), true, 0))
				res := await(t, rt, "RoundTrip")
				if res.err != nil {
					t.Fatalf("RoundTrip() = %v", res.err)
				}
				if p, err := res.resp.Next(); err != nil || string(p) != "a" {
					t.Fatalf("Next() = %q, %v, want the head's piece", p, err)
				}
				err = tt.giveUp(cancel, res.resp)
			} else {
				tt.giveUp(cancel, nil)
				err = await(t, rt, "RoundTrip").err
			}
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("after giving up: %v, want %v", err, tt.wantErr)
			}
			fake.recvCancel(id)
			// Whatever the plugin still sends for it is dropped.
			fake.send(piece(id, []byte("late"), true))
			rt2 := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/next"})
			id2, _, _ := fake.recvRequest()
			fake.answer(id2, "next")
			if res := await(t, rt2, "the next RoundTrip"); res.err != nil {
				t.Errorf("next RoundTrip() = %v", res.err)
			}
		})
	}
}

// TestNoCancelAfterTheEnd checks that a request answered in full is not
// cancelled when its caller closes the response or its context ends.
func TestNoCancelAfterTheEnd(t *testing.T) {
	h := newHarness(t, 1)
	fake := h.fakes[0]
	ctx, cancel := context.WithCancel(t.Context())
	rt := h.goRoundTrip(ctx, &dataplane.Request{Method: "GET", Path: "/"})
	id, _, _ := fake.recvRequest()
	fake.send(head(id, 200, []byte("a"), true, 0), piece(id, []byte("b"), true))
	res := await(t, rt, "RoundTrip")
	if res.err != nil {
		t.Fatalf("RoundTrip() = %v", res.err)
	}
	if pieces, err := readAll(t, res.resp); err != nil || len(pieces) != 2 {
		t.Fatalf("body = %q, %v, want two pieces", pieces, err)
	}
	res.resp.Close()
	cancel()
	rt2 := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/next"})
	// Reading the whole body grants its credit back; then comes the next
	// request, not a cancel.
	for {
		f := fake.recv()
		if f.GetWindow() != nil {
			continue
		}
		if f.GetRequest() == nil {
			t.Fatalf("frame after a finished request = %v, want the next request", f)
		}
		fake.answer(f.GetId(), "")
		break
	}
	if res := await(t, rt2, "the next RoundTrip"); res.err != nil {
		t.Errorf("next RoundTrip() = %v", res.err)
	}
}

func TestDeadlinePassesWaitingForHead(t *testing.T) {
	h := newHarness(t, 1)
	fake := h.fakes[0]
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	rt := h.goRoundTrip(ctx, &dataplane.Request{Method: "GET", Path: "/"})
	id, _, _ := fake.recvRequest()
	if res := await(t, rt, "RoundTrip"); !errors.Is(res.err, context.DeadlineExceeded) {
		t.Errorf("RoundTrip() past its deadline = %v, want %v", res.err, context.DeadlineExceeded)
	}
	fake.recvCancel(id)
}

func TestConnectionBreaksMidBody(t *testing.T) {
	h := newHarness(t, 1)
	fake := h.fakes[0]
	rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
	id, _, _ := fake.recvRequest()
	fake.send(head(id, 200, []byte("a"), true, 0), piece(id, []byte("b"), false))
	res := await(t, rt, "RoundTrip")
	if res.err != nil {
		t.Fatalf("RoundTrip() = %v", res.err)
	}
	_ = fake.c.Close()
	pieces, err := readAll(t, res.resp)
	if !errors.Is(err, dataplane.ErrUnavailable) {
		t.Errorf("body of a response whose connection closed ended with %v, want %v", err, dataplane.ErrUnavailable)
	}
	// "b" may be lost with the connection: a credit grant sent as the
	// caller reads can find the socket closed before the receiver has
	// read "b" from it, and either end fails the whole connection.
	if got := string(bytes.Join(pieces, nil)); got != "ab" && got != "a" {
		t.Errorf("body before the break = %q, want %q or its head %q", got, "ab", "a")
	}
	waitLive(t, h.tr, 0)
	await(t, h.tr.Done(), "Done")
	if _, err := h.tr.RoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"}); !errors.Is(err, dataplane.ErrUnavailable) {
		t.Errorf("RoundTrip() with no connection left = %v, want %v", err, dataplane.ErrUnavailable)
	}
}

// TestLive checks that requests go to the connections left when one
// breaks, and that Done closes when the last does.
func TestLive(t *testing.T) {
	h := newHarness(t, 2)
	if got := h.tr.Live(); got != 2 {
		t.Fatalf("Live() = %d, want 2", got)
	}
	_ = h.fakes[0].c.Close()
	waitLive(t, h.tr, 1)
	select {
	case <-h.tr.Done():
		t.Fatal("Done() closed with a connection left")
	default:
	}
	for i := range 3 {
		rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: fmt.Sprint("/", i)})
		id, _, _ := h.fakes[1].recvRequest()
		h.fakes[1].answer(id, "")
		if res := await(t, rt, "RoundTrip"); res.err != nil {
			t.Errorf("RoundTrip() #%d with one connection broken = %v", i, res.err)
		}
	}
	_ = h.fakes[1].c.Close()
	waitLive(t, h.tr, 0)
	await(t, h.tr.Done(), "Done")
	if _, err := h.tr.RoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"}); !errors.Is(err, dataplane.ErrUnavailable) {
		t.Errorf("RoundTrip() with no connection left = %v, want %v", err, dataplane.ErrUnavailable)
	}
}

func TestNoConnections(t *testing.T) {
	tr := dataplane.New(nil)
	defer tr.Close()
	if tr.Live() != 0 {
		t.Errorf("Live() = %d, want 0", tr.Live())
	}
	await(t, tr.Done(), "Done")
	if _, err := tr.RoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"}); !errors.Is(err, dataplane.ErrUnavailable) {
		t.Errorf("RoundTrip() = %v, want %v", err, dataplane.ErrUnavailable)
	}
}

func TestClose(t *testing.T) {
	h := newHarness(t, 2)
	// One request waits for its head, one for the rest of its body; the
	// transport spreads them over the two connections.
	waiting := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/waiting"})
	reading := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/reading"})
	for _, fake := range h.fakes {
		id, head0, _ := fake.recvRequest()
		if head0.GetRequest().GetPath() == "/reading" {
			fake.send(head(id, 200, []byte("a"), true, 0))
		}
	}
	res := await(t, reading, "RoundTrip(/reading)")
	if res.err != nil {
		t.Fatalf("RoundTrip(/reading) = %v", res.err)
	}
	if _, err := res.resp.Next(); err != nil {
		t.Fatalf("Next() = %v", err)
	}
	next := h.goNext(res.resp)
	h.tr.Close()
	if r := await(t, waiting, "RoundTrip(/waiting)"); !errors.Is(r.err, dataplane.ErrUnavailable) {
		t.Errorf("RoundTrip() waiting at Close = %v, want %v", r.err, dataplane.ErrUnavailable)
	}
	if r := await(t, next, "Next"); !errors.Is(r.err, dataplane.ErrUnavailable) {
		t.Errorf("Next() waiting at Close = %q, %v, want %v", r.piece, r.err, dataplane.ErrUnavailable)
	}
	if h.tr.Live() != 0 {
		t.Errorf("Live() after Close = %d, want 0", h.tr.Live())
	}
	await(t, h.tr.Done(), "Done after Close")
	if _, err := h.tr.RoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"}); !errors.Is(err, dataplane.ErrUnavailable) {
		t.Errorf("RoundTrip() after Close = %v, want %v", err, dataplane.ErrUnavailable)
	}
	h.tr.Close() // a second Close is harmless
}

// TestConcurrent sends many requests at once over one connection; the fake
// answers them in reverse order, each with its own path, so that a frame
// handed to the wrong request shows.
func TestConcurrent(t *testing.T) {
	const n = 50
	h := newHarness(t, 1)
	fake := h.fakes[0]
	rts := make([]<-chan result, n)
	for i := range n {
		body := pattern(i * wire.PieceBytes / 8)
		rts[i] = h.goRoundTrip(t.Context(), &dataplane.Request{Method: "POST", Path: fmt.Sprint("/", i), Body: [][]byte{body}})
	}
	// Heads and pieces of different requests may interleave.
	type req struct {
		path string
		body []byte
		done bool
	}
	reqs := map[uint64]*req{}
	for finished := 0; finished < n; {
		f := fake.recv()
		switch {
		case f.GetRequest() != nil:
			r := f.GetRequest()
			reqs[f.GetId()] = &req{path: r.GetRequest().GetPath(), body: bytes.Clone(r.GetRequest().GetBody()), done: !r.GetMore()}
		case f.GetBody() != nil:
			r := reqs[f.GetId()]
			if r == nil || r.done {
				t.Fatalf("body piece for request %d, which has no head or has ended", f.GetId())
			}
			r.body = append(r.body, f.GetBody().GetData()...)
			r.done = f.GetBody().GetEnd()
		default:
			t.Fatalf("frame %v, want requests only", f)
		}
		if r := reqs[f.GetId()]; r.done {
			finished++
		}
	}
	for id := uint64(n); id >= 1; id-- {
		r := reqs[id]
		var i int
		fmt.Sscanf(r.path, "/%d", &i)
		if want := pattern(i * wire.PieceBytes / 8); !bytes.Equal(r.body, want) {
			t.Errorf("request %s has a body of %d bytes, want the %d sent", r.path, len(r.body), len(want))
		}
		fake.send(head(id, 200, []byte(r.path), true, 0), piece(id, []byte(r.path), true))
	}
	for i, rt := range rts {
		res := await(t, rt, "RoundTrip")
		if res.err != nil {
			t.Errorf("RoundTrip(/%d) = %v", i, res.err)
			continue
		}
		pieces, err := readAll(t, res.resp)
		if want := fmt.Sprintf("/%d/%d", i, i); err != nil || string(bytes.Join(pieces, nil)) != want {
			t.Errorf("RoundTrip(/%d) body = %q, %v, want %q", i, bytes.Join(pieces, nil), err, want)
		}
	}
}

// TestBodyStopsOnceAnswered checks that the host stops sending a request
// body once the plugin has answered in full without reading it, and keeps
// sending it while the plugin streams an answer as it reads.
func TestBodyStopsOnceAnswered(t *testing.T) {
	const id = 1
	body := pattern(16 * wire.PieceBytes)

	t.Run("answered in full", func(t *testing.T) {
		h := newHarness(t, 1)
		fake := h.fakes[0]
		rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "POST", Path: "/", Body: [][]byte{body}})
		if f := fake.recv(); f.GetRequest() == nil || !f.GetRequest().GetMore() {
			t.Fatalf("first frame = %v, want a request head with more body", f)
		}
		// The host is writing the body, or blocked writing it: the socket
		// holds a few pieces. It learns of the answer long before the
		// fake has read them.
		fake.send(head(id, http.StatusRequestEntityTooLarge, []byte("no"), false, 0))
		frames := make(chan *pluginv1.Frame, 64)
		go func() {
			defer close(frames)
			for {
				f, err := fake.c.Recv()
				if err != nil {
					return
				}
				frames <- f
			}
		}()
		res := await(t, rt, "RoundTrip")
		if res.err != nil {
			t.Fatalf("RoundTrip() = %v", res.err)
		}
		res.resp.Close()
		// A second request on the connection: its head comes after the
		// pieces the host sent before it stopped, far fewer than all 15.
		rt2 := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/next"})
		pieces := 0
		for f := range frames {
			if f.GetRequest() != nil {
				break
			}
			pieces++
		}
		if pieces >= 15 {
			t.Errorf("the host sent %d more body pieces after a full answer, want it to stop", pieces)
		}
		fake.send(head(2, http.StatusOK, nil, false, 0))
		if res := await(t, rt2, "RoundTrip(/next)"); res.err != nil {
			t.Errorf("RoundTrip(/next) = %v", res.err)
		} else {
			res.resp.Close()
		}
	})

	t.Run("streaming while it reads", func(t *testing.T) {
		h := newHarness(t, 1)
		fake := h.fakes[0]
		rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "POST", Path: "/", Body: [][]byte{body}, Streaming: true})
		if f := fake.recv(); f.GetRequest() == nil {
			t.Fatalf("first frame = %v, want the request head", f)
		}
		fake.send(head(id, http.StatusOK, nil, true, 0))
		n := len(body) - wire.PieceBytes
		for n > 0 {
			n -= len(fake.recv().GetBody().GetData())
		}
		if n != 0 {
			t.Errorf("the body arrived %d bytes off", n)
		}
		res := await(t, rt, "RoundTrip")
		if res.err != nil {
			t.Fatalf("RoundTrip() = %v", res.err)
		}
		res.resp.Close()
	})
}
