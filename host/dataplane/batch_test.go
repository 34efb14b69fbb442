//go:build unix

package dataplane_test

import (
	"bytes"
	"net"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/sdk/wire"
)

// writeCounter counts the writes to the socket under it.
type writeCounter struct {
	net.Conn
	n *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// TestHeadGoesWithItsBody checks that a request's head goes out with the
// Body frames that follow it within a piece's worth of body: a body that
// fits the connection's write buffer costs one write to the socket
// however many pieces it arrived in. (Larger bodies take the writes the
// buffer's size makes.)
func TestHeadGoesWithItsBody(t *testing.T) {
	big := pattern(wire.PieceBytes)
	tests := []struct {
		name   string
		body   [][]byte
		writes int64
	}{
		{"no body", nil, 1},
		{"a body in one piece", [][]byte{big[:14<<10]}, 1},
		// The pieces of a 14 KiB body as the ingress reads it.
		{"a body in pieces", [][]byte{big[:4<<10], big[4<<10 : 8<<10], big[8<<10 : 14<<10]}, 1},
		{"many small pieces", [][]byte{big[:100], big[100:200], big[200:300], big[300:400], big[400:500]}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var writes atomic.Int64
			h := newWrappedHarness(t, 1, func(c net.Conn) net.Conn { return writeCounter{Conn: c, n: &writes} })
			rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "PUT", Path: "/blob", Body: tt.body})
			id, _, body := h.fakes[0].recvRequest()
			if sent := bytes.Join(tt.body, nil); !bytes.Equal(body, sent) {
				t.Fatalf("plugin got a body of %d bytes, want the %d sent", len(body), len(sent))
			}
			if got := writes.Load(); got != tt.writes {
				t.Errorf("the request took %d writes to the socket, want %d", got, tt.writes)
			}
			h.fakes[0].answer(id, "ok")
			if res := await(t, rt, "RoundTrip"); res.err != nil {
				t.Fatalf("RoundTrip() = %v", res.err)
			} else {
				res.resp.Close()
			}
		})
	}
}

// TestRequestsTogetherShareAWrite checks that the heads of requests made
// at once go out in fewer writes than there are requests: the flusher
// yields to the requests already runnable before it writes. One P makes
// the order fixed: the eight goroutines are all runnable before the first
// of them wakes the flusher.
func TestRequestsTogetherShareAWrite(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const n = 8
	var writes atomic.Int64
	h := newWrappedHarness(t, 1, func(c net.Conn) net.Conn { return writeCounter{Conn: c, n: &writes} })
	var rts []<-chan result
	for range n {
		rts = append(rts, h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"}))
	}
	var ids []uint64
	for range n {
		id, _, _ := h.fakes[0].recvRequest()
		ids = append(ids, id)
	}
	if got := writes.Load(); got >= n {
		t.Errorf("%d requests made at once took %d writes to the socket, want fewer", n, got)
	}
	for _, id := range ids {
		h.fakes[0].answer(id, "ok")
	}
	for _, rt := range rts {
		if res := await(t, rt, "RoundTrip"); res.err != nil {
			t.Fatalf("RoundTrip() = %v", res.err)
		} else {
			res.resp.Close()
		}
	}
}

// TestLoneRequestNotHeldBack checks that the flusher writes a request
// alone on its connection out at once, without yielding to the goroutines
// already runnable (which could hold it for a time slice each), and
// yields when others are in flight.
func TestLoneRequestNotHeldBack(t *testing.T) {
	yields := dataplane.CountYields(t)
	h := newHarness(t, 1)
	rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
	id, _, _ := h.fakes[0].recvRequest()
	if n := yields.Load(); n != 0 {
		t.Errorf("the flusher yielded %d times before writing a lone request, want 0", n)
	}
	// A second request while the first awaits its answer.
	rt2 := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
	id2, _, _ := h.fakes[0].recvRequest()
	if n := yields.Load(); n != 1 {
		t.Errorf("the flusher yielded %d times before writing a request beside another, want 1", n)
	}
	h.fakes[0].answer(id, "ok")
	h.fakes[0].answer(id2, "ok")
	for _, ch := range []<-chan result{rt, rt2} {
		if res := await(t, ch, "RoundTrip"); res.err != nil {
			t.Fatalf("RoundTrip() = %v", res.err)
		} else {
			res.resp.Close()
		}
	}
}
