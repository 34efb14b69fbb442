package wire_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/internal/wiretest"
	"github.com/plughost/plughost/sdk/wire"
)

// frames returns one frame of each kind, one of them larger than a Conn's
// buffers.
func frames() []*pluginv1.Frame {
	return []*pluginv1.Frame{
		{Id: 1, Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{
			Request: &pluginv1.HTTPRequest{
				Method: "POST", Path: "/wallet/v1/transfer", RawQuery: "a=b",
				Headers: []*pluginv1.Header{{Name: "Idempotency-Key", Values: []string{"k1"}}},
				Body:    []byte(`{"from":"a","to":"b","amount":1,"nonce":1}`),
			},
			DeadlineUnixNano: 1234567890,
		}}},
		{Id: 2, Kind: &pluginv1.Frame_Cancel{Cancel: &pluginv1.Cancel{}}},
		{Id: 3, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{
			Response: &pluginv1.HTTPResponse{Status: 200, Body: bytes.Repeat([]byte("x"), 100<<10)},
		}}},
		{Id: 4, Kind: &pluginv1.Frame_Abort{Abort: &pluginv1.Abort{}}},
		{Id: 6, Kind: &pluginv1.Frame_Body{Body: &pluginv1.Body{Data: []byte("rest"), End: true}}},
		{Id: 7, Kind: &pluginv1.Frame_Window{Window: &pluginv1.Window{Bytes: 4096}}},
		{Id: 5, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{
			Response: &pluginv1.HTTPResponse{Status: 204},
		}}},
	}
}

// TestConnRoundTrip sends frames unflushed but the last, from several
// goroutines, and checks that each arrives whole.
func TestConnRoundTrip(t *testing.T) {
	a, b := wiretest.SocketPair(t)
	send, recv := wire.NewConn(a), wire.NewConn(b)
	want := frames()
	var wg sync.WaitGroup
	for i, f := range want {
		wg.Go(func() {
			fr, err := send.Encode(f)
			if err != nil {
				t.Errorf("Encode(frame %d) = %v", f.GetId(), err)
				return
			}
			// Only the last flushes, once the others are in the buffer
			// (or written, when it overflowed).
			if i == len(want)-1 {
				return
			}
			if err := send.Send(fr, false); err != nil {
				t.Errorf("Send(frame %d) = %v", f.GetId(), err)
			}
		})
	}
	wg.Wait()
	last, err := send.Encode(want[len(want)-1])
	if err != nil {
		t.Fatal(err)
	}
	if err := send.Send(last, true); err != nil {
		t.Fatalf("Send(last frame) = %v", err)
	}
	got := map[uint64]*pluginv1.Frame{}
	for range want {
		f, err := recv.Recv()
		if err != nil {
			t.Fatalf("Recv() = %v after %d frames", err, len(got))
		}
		got[f.GetId()] = f
	}
	// Compared after all were read: a frame decoded from the read buffer
	// must not change when the buffer is reused.
	for _, w := range want {
		if !proto.Equal(got[w.GetId()], w) {
			t.Errorf("frame %d arrived as %v, want %v", w.GetId(), got[w.GetId()], w)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if f, err := recv.Recv(); err != io.EOF {
		t.Errorf("Recv() after the peer closed between frames = %v, %v, want io.EOF", f, err)
	}
}

func TestConnRecvErrors(t *testing.T) {
	valid, err := proto.Marshal(frames()[0])
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		input []byte
		want  error // errors.Is; nil means any non-nil error
	}{
		{name: "length over the limit", input: header(wire.MaxMessageBytes + 1), want: wire.ErrFrameTooLarge},
		{name: "largest length", input: header(1<<32 - 1), want: wire.ErrFrameTooLarge},
		{name: "cut inside the length", input: []byte{0, 0}, want: io.ErrUnexpectedEOF},
		{name: "cut inside the frame", input: append(header(len(valid)), valid[:len(valid)-1]...), want: io.ErrUnexpectedEOF},
		{name: "cut inside a large frame", input: append(header(1<<20), valid...), want: io.ErrUnexpectedEOF},
		{name: "not protobuf", input: append(header(3), 0xff, 0xff, 0xff)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := wiretest.SocketPair(t)
			if _, err := a.Write(tt.input); err != nil {
				t.Fatal(err)
			}
			if err := a.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			f, err := wire.NewConn(b).Recv()
			if err == nil || err == io.EOF || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Errorf("Recv() of %q... = %v, %v, want an error that is %v", tt.input[:min(8, len(tt.input))], f, err, tt.want)
			}
		})
	}
}

func header(n int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }

func TestConnEncodeTooLarge(t *testing.T) {
	a, _ := wiretest.SocketPair(t)
	f := &pluginv1.Frame{Id: 1, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{
		Response: &pluginv1.HTTPResponse{Status: 200, Body: make([]byte, wire.MaxMessageBytes)},
	}}}
	if _, err := wire.NewConn(a).Encode(f); !errors.Is(err, wire.ErrFrameTooLarge) {
		t.Errorf("Encode(frame over the limit) = %v, want %v", err, wire.ErrFrameTooLarge)
	}
}

func TestConnSendAfterPeerClosed(t *testing.T) {
	a, b := wiretest.SocketPair(t)
	c := wire.NewConn(a)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	fr, err := c.Encode(frames()[1])
	if err != nil {
		t.Fatal(err)
	}
	first := c.Send(fr, true)
	if first == nil {
		t.Fatal("Send() to a closed peer = nil, want an error")
	}
	// A frame is of no use after its Send: sending it again would put
	// its pooled buffer back twice.
	if fr, err = c.Encode(frames()[1]); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(fr, true); err == nil {
		t.Errorf("second Send() after %v = nil, want the error again", first)
	}
}

// FuzzConnRecv feeds arbitrary bytes to a Conn, as a plugin could: Recv
// must fail cleanly or return frames that survive a round trip.
func FuzzConnRecv(f *testing.F) {
	for _, fr := range frames() {
		b, err := proto.Marshal(fr)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append(header(len(b)), b...))
	}
	f.Add(header(wire.MaxMessageBytes + 1))
	f.Add([]byte{0, 0, 0, 2, 0x08})
	f.Add(append(header(0), header(0)...))
	f.Fuzz(func(t *testing.T, input []byte) {
		a, b := wiretest.SocketPair(t)
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() {
			_, _ = a.Write(input) // fails only once b is closed
			_ = a.CloseWrite()
		})
		defer b.Close()
		c := wire.NewConn(b)
		for {
			fr, err := c.Recv()
			if err != nil {
				return
			}
			enc, err := proto.Marshal(fr)
			if err != nil {
				t.Fatalf("re-encoding a received frame: %v", err)
			}
			var back pluginv1.Frame
			if err := proto.Unmarshal(enc, &back); err != nil || !proto.Equal(&back, fr) {
				t.Fatalf("frame %v did not survive a round trip: %v", fr, err)
			}
		}
	})
}

// enteredConn tells, on entered, each time a Read begins.
type enteredConn struct {
	net.Conn
	entered chan struct{}
}

func (c enteredConn) Read(p []byte) (int, error) {
	c.entered <- struct{}{}
	return c.Conn.Read(p)
}

// TestConnRecvClaimedLengthHoldsLittle checks that a peer that sends the
// largest length and then stalls does not make Recv hold that much memory.
func TestConnRecvClaimedLengthHoldsLittle(t *testing.T) {
	a, b := wiretest.SocketPair(t)
	if _, err := a.Write(append(header(wire.MaxMessageBytes), "abc"...)); err != nil {
		t.Fatal(err)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	entered := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		_, err := wire.NewConn(enteredConn{Conn: b, entered: entered}).Recv()
		done <- err
	}()
	// The first read takes what was sent; the second waits for the rest.
	for range 2 {
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("Recv did not read within 10s")
		}
	}
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	_ = b.Close()
	<-done
	if grew := int64(during.HeapAlloc) - int64(before.HeapAlloc); grew > 8<<20 {
		t.Errorf("heap grew by %d bytes while Recv waited for a frame that claimed %d bytes and sent 3, want under 8 MiB", grew, wire.MaxMessageBytes)
	}
}
