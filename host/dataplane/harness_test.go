//go:build unix

package dataplane_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plughost/plughost/host/dataplane"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

// The tests here drive the host's side against fakePlugin, which writes
// raw frames, to reach the protocol's edges that a real plugin never
// walks. The tests of sdk/internal/dataplane run both real sides together.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitTime bounds every wait in these tests; it only keeps a broken
// transport from hanging them.
const waitTime = 10 * time.Second

// fakePlugin is a fake of a plugin's side of one data-plane connection:
// the test reads the host's frames and writes the plugin's by hand.
type fakePlugin struct {
	t   *testing.T
	raw net.Conn
	c   *wire.Conn
}

// harness is a Transport over socket pairs whose other ends are fakes.
type harness struct {
	tr    dataplane.Transport
	fakes []*fakePlugin
	// calls waits for the goroutines of goRoundTrip and goNext.
	calls sync.WaitGroup
}

// newHarness returns a Transport over n socket pairs with a fakePlugin on
// the other end of each. Cleanup closes the Transport and the fakes and
// waits for the calls started with goRoundTrip.
func newHarness(t *testing.T, n int) *harness {
	t.Helper()
	return newWrappedHarness(t, n, func(c net.Conn) net.Conn { return c })
}

// newWrappedHarness is newHarness with the host's end of each socket pair
// wrapped by wrap.
func newWrappedHarness(t *testing.T, n int, wrap func(net.Conn) net.Conn) *harness {
	t.Helper()
	h := &harness{}
	var conns []*wire.Conn
	for range n {
		hc, f, err := wire.SocketPair()
		if err != nil {
			t.Fatal(err)
		}
		pc, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			_ = hc.Close()
			t.Fatalf("net.FileConn: %v", err)
		}
		conns = append(conns, wire.NewConn(wrap(hc)))
		h.fakes = append(h.fakes, &fakePlugin{t: t, raw: pc, c: wire.NewConn(pc)})
	}
	h.tr = dataplane.New(conns)
	t.Cleanup(func() {
		h.tr.Close()
		for _, f := range h.fakes {
			_ = f.c.Close()
		}
		h.calls.Wait()
	})
	return h
}

// result is what a RoundTrip or Next started in a goroutine returned.
type result struct {
	resp  *dataplane.Response
	piece []byte
	err   error
}

// goRoundTrip starts a RoundTrip; the harness's cleanup waits for it.
func (h *harness) goRoundTrip(ctx context.Context, req *dataplane.Request) <-chan result {
	ch := make(chan result, 1)
	h.calls.Go(func() {
		resp, err := h.tr.RoundTrip(ctx, req)
		ch <- result{resp: resp, err: err}
	})
	return ch
}

// goNext starts a resp.Next; the harness's cleanup waits for it.
func (h *harness) goNext(resp *dataplane.Response) <-chan result {
	ch := make(chan result, 1)
	h.calls.Go(func() {
		p, err := resp.Next()
		ch <- result{piece: p, err: err}
	})
	return ch
}

// await returns what ch receives, failing the test after waitTime.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTime):
		t.Fatalf("timed out after %v waiting for %s", waitTime, what)
		var zero T
		return zero
	}
}

// recv reads the host's next frame.
func (p *fakePlugin) recv() *pluginv1.Frame {
	p.t.Helper()
	_ = p.raw.SetReadDeadline(time.Now().Add(waitTime))
	f, err := p.c.Recv()
	if err != nil {
		p.t.Fatalf("fake plugin: Recv() = %v", err)
	}
	return f
}

// recvRequest reads a request: its head and, if it has more, its Body
// frames. It returns the id, the head, and the whole body.
func (p *fakePlugin) recvRequest() (uint64, *pluginv1.RequestHead, []byte) {
	p.t.Helper()
	f := p.recv()
	head := f.GetRequest()
	if head == nil {
		p.t.Fatalf("fake plugin: got frame %v, want a request head", f)
	}
	body := bytes.Clone(head.GetRequest().GetBody())
	for more := head.GetMore(); more; {
		b := p.recv()
		if b.GetId() != f.GetId() || b.GetBody() == nil {
			p.t.Fatalf("fake plugin: got frame %v, want a body piece of request %d", b, f.GetId())
		}
		body = append(body, b.GetBody().GetData()...)
		more = !b.GetBody().GetEnd()
	}
	return f.GetId(), head, body
}

// recvCancel reads frames, skipping Window frames, and fails unless the
// next other one cancels id.
func (p *fakePlugin) recvCancel(id uint64) {
	p.t.Helper()
	for {
		f := p.recv()
		if f.GetWindow() != nil {
			continue
		}
		if f.GetId() != id || f.GetCancel() == nil {
			p.t.Fatalf("fake plugin: got frame %v, want a cancel of request %d", f, id)
		}
		return
	}
}

// send writes frames as the plugin.
func (p *fakePlugin) send(fs ...*pluginv1.Frame) {
	p.t.Helper()
	for _, f := range fs {
		fr, err := p.c.Encode(f)
		if err != nil {
			p.t.Fatalf("fake plugin: Encode(%v) = %v", f, err)
		}
		if err := p.c.Send(fr, true); err != nil {
			p.t.Fatalf("fake plugin: Send() = %v", err)
		}
	}
}

// answer answers request id whole with status 200 and body.
func (p *fakePlugin) answer(id uint64, body string) {
	p.t.Helper()
	p.send(head(id, 200, []byte(body), false, 0))
}

func head(id uint64, status int, body []byte, more bool, size int64) *pluginv1.Frame {
	return &pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{
		Response: &pluginv1.HTTPResponse{Status: int32(status), Body: body},
		More:     more,
		Size:     size,
	}}}
}

func piece(id uint64, data []byte, end bool) *pluginv1.Frame {
	return &pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Body{Body: &pluginv1.Body{Data: data, End: end}}}
}

func abort(id uint64) *pluginv1.Frame {
	return &pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Abort{Abort: &pluginv1.Abort{}}}
}

// readAll reads resp's body with Next to its end, and returns the pieces
// and the error that ended them (nil for io.EOF).
func readAll(t *testing.T, resp *dataplane.Response) ([][]byte, error) {
	t.Helper()
	var pieces [][]byte
	for {
		p, err := resp.Next()
		if err == io.EOF {
			return pieces, nil
		}
		if err != nil {
			return pieces, err
		}
		pieces = append(pieces, p)
	}
}

// pattern returns n bytes of a pattern that shows where a piece went
// astray.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}
