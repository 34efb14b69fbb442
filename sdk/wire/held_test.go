//go:build unix

package wire_test

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/internal/wiretest"
	"github.com/plughost/plughost/sdk/wire"
)

func cancelFrame(t *testing.T, c *wire.Conn, id uint64) wire.Frame {
	t.Helper()
	fr, err := c.Encode(&pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Cancel{Cancel: &pluginv1.Cancel{}}})
	if err != nil {
		t.Fatal(err)
	}
	return fr
}

// TestSendHeld checks that held frames stay in the write buffer until a
// flush, that only the first frames held since the last flush report it,
// and that any flush (Flush, SendAll, a flushing Send) sends them.
func TestSendHeld(t *testing.T) {
	a, b := wiretest.SocketPair(t)
	send, recv := wire.NewConn(a), wire.NewConn(b)
	// nothingSent reports whether the socket is empty: what a flush writes
	// is in it when the flush returns.
	nothingSent := func() bool {
		t.Helper()
		if err := b.SetReadDeadline(time.Now()); err != nil {
			t.Fatal(err)
		}
		defer b.SetReadDeadline(time.Time{})
		var p [1]byte
		_, err := b.Read(p[:])
		return errors.Is(err, os.ErrDeadlineExceeded)
	}
	flushes := []struct {
		name  string
		flush func() error
	}{
		{"Flush", send.Flush},
		{"SendAll", func() error { return send.SendAll([]wire.Frame{cancelFrame(t, send, 99)}) }},
		{"Send", func() error { return send.Send(cancelFrame(t, send, 99), true) }},
	}
	for _, fl := range flushes {
		first, err := send.SendHeld([]wire.Frame{cancelFrame(t, send, 1), cancelFrame(t, send, 2)})
		if err != nil || !first {
			t.Fatalf("SendHeld = %v, %v; want the first held", first, err)
		}
		if first, err := send.SendHeld([]wire.Frame{cancelFrame(t, send, 3)}); err != nil || first {
			t.Fatalf("second SendHeld = %v, %v; want frames held before it", first, err)
		}
		if !nothingSent() {
			t.Fatalf("held frames reached the socket before %s", fl.name)
		}
		if err := fl.flush(); err != nil {
			t.Fatalf("%s = %v", fl.name, err)
		}
		for want := uint64(1); want <= 3; want++ {
			f, err := recv.Recv()
			if err != nil || f.GetId() != want {
				t.Fatalf("after %s: Recv = frame %d, %v; want frame %d", fl.name, f.GetId(), err, want)
			}
		}
		if fl.name != "Flush" {
			if f, err := recv.Recv(); err != nil || f.GetId() != 99 {
				t.Fatalf("after %s: Recv = frame %d, %v; want its own frame", fl.name, f.GetId(), err)
			}
		}
	}
	if !nothingSent() {
		t.Fatal("a flush sent more than the frames given")
	}
}

// TestFrameBuffered checks that FrameBuffered tells a whole frame in the
// read buffer from part of one.
func TestFrameBuffered(t *testing.T) {
	a, b := wiretest.SocketPair(t)
	recv := wire.NewConn(b)
	frame := func(id uint64) []byte {
		p, err := proto.Marshal(&pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Cancel{Cancel: &pluginv1.Cancel{}}})
		if err != nil {
			t.Fatal(err)
		}
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(p))), p...)
	}
	one, two, three := frame(1), frame(2), frame(3)
	// Three frames, the last cut short, in one write: Recv's first read
	// takes all of it.
	if _, err := a.Write(append(append(one, two...), three[:len(three)-1]...)); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if _, err := recv.Recv(); err != nil {
			t.Fatal(err)
		}
		if got := recv.FrameBuffered(); got != want { // after frame 2: frame 3 but its last byte
			t.Errorf("FrameBuffered after frame %d = %v, want %v", i+1, got, want)
		}
	}
	if _, err := a.Write(three[len(three)-1:]); err != nil {
		t.Fatal(err)
	}
	if f, err := recv.Recv(); err != nil || f.GetId() != 3 {
		t.Fatalf("Recv = frame %d, %v; want frame 3", f.GetId(), err)
	}
	// Nothing left in the buffer.
	if recv.FrameBuffered() {
		t.Error("FrameBuffered with nothing buffered = true")
	}
}
