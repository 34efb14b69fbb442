package dataplane_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	host "github.com/plughost/plughost/host/dataplane"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/internal/dataplane"
	"github.com/plughost/plughost/sdk/internal/wiretest"
	"github.com/plughost/plughost/sdk/wire"
)

// whereHandler reads the body, answers where it ran ("reader" or
// "worker") and the body's length in headers, and writes respLen bytes.
func whereHandler(respLen int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		where := "worker"
		if dataplane.RunsInline(w) {
			where = "reader"
		}
		w.Header().Set("X-Where", where)
		w.Header().Set("X-Body-Len", strconv.FormatInt(n, 10))
		_, _ = w.Write(pattern(respLen))
	})
}

// TestInline checks where a request runs: an inline route's on the
// connection's reader, unless more of its body is still to come or it
// streams; any other route's on a worker.
func TestInline(t *testing.T) {
	inline := func(pattern string) bool { return pattern == "POST /inline" }
	tests := []struct {
		name      string
		pattern   string
		body      int
		streaming bool
		want      string
	}{
		{"inline route", "POST /inline", 100, false, "reader"},
		{"inline route, a body of a whole piece", "POST /inline", wire.PieceBytes, false, "reader"},
		{"inline route, a body in two frames", "POST /inline", wire.PieceBytes + 1, false, "worker"},
		{"inline route, streaming", "POST /inline", 0, true, "worker"},
		{"another route", "POST /other", 100, false, "worker"},
	}
	p := servePlaneInline(t, whereHandler(10), inline)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A deadline, so that a handler run on the reader while its
			// body is still to come fails rather than hangs.
			ctx, cancel := context.WithTimeout(t.Context(), waitTime)
			defer cancel()
			r, err := p.do(ctx, &host.Request{Method: "POST", Path: "/", Pattern: tt.pattern, Streaming: tt.streaming,
				Body: [][]byte{pattern(tt.body)}})
			if err != nil || r.status != http.StatusOK {
				t.Fatalf("do = %v; want 200", err)
			}
			if got := r.header.Get("X-Where"); got != tt.want {
				t.Errorf("handler ran on the %s, want the %s", got, tt.want)
			}
			if got := r.header.Get("X-Body-Len"); got != strconv.Itoa(tt.body) {
				t.Errorf("handler read %s bytes of body, want %d", got, tt.body)
			}
			if !bytes.Equal(r.body(), pattern(10)) {
				t.Errorf("response body has %d bytes, want the 10 written", len(r.body()))
			}
		})
	}
}

// TestInlineOverWindow checks that an inline handler's response larger
// than the response window, whose credit comes in Window frames only the
// reader reads, is sent whole by a worker while the reader goes on
// reading, and that the connection serves on.
func TestInlineOverWindow(t *testing.T) {
	const big = wire.ResponseWindow + wire.PieceBytes + 5
	bigH, smallH := whereHandler(big), whereHandler(10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			bigH.ServeHTTP(w, r)
			return
		}
		smallH.ServeHTTP(w, r)
	})
	p := servePlaneInline(t, h, func(string) bool { return true })
	ctx, cancel := context.WithTimeout(t.Context(), waitTime)
	defer cancel()
	r, err := p.do(ctx, &host.Request{Method: "GET", Path: "/big", Pattern: "GET /big"})
	if err != nil {
		t.Fatalf("a response of %d bytes from an inline route: %v, want it whole", big, err)
	}
	if r.status != http.StatusOK || r.header.Get("X-Where") != "reader" || !bytes.Equal(r.body(), pattern(big)) {
		t.Errorf("the large response = %d (handler on the %s) with %d bytes, want 200 from the reader with the %d written",
			r.status, r.header.Get("X-Where"), len(r.body()), big)
	}
	// The reader is free again.
	r, err = p.do(t.Context(), &host.Request{Method: "GET", Path: "/small", Pattern: "GET /small"})
	if err != nil {
		t.Fatalf("the next request: %v, want 200", err)
	}
	if r.status != http.StatusOK || r.header.Get("X-Where") != "reader" {
		t.Errorf("the next request = %d on the %q, want 200 on the reader", r.status, r.header.Get("X-Where"))
	}
}

// countWrites counts the writes to the socket under it.
type countWrites struct {
	net.Conn
	n *atomic.Int64
}

func (c countWrites) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// rawPlane serves h, every route inline, on one end of a socket pair
// whose writes it counts, and returns the host's end as a bare Conn.
func rawPlane(t *testing.T, h http.Handler) (hostEnd net.Conn, c *wire.Conn, writes *atomic.Int64) {
	t.Helper()
	hc, pc := wiretest.SocketPair(t)
	writes = &atomic.Int64{}
	served := make(chan error, 1)
	go func() {
		served <- dataplane.Serve(context.Background(), wire.NewConn(countWrites{Conn: pc, n: writes}), dataplane.Options{
			Handler: h,
			Error:   writeError,
			Logger:  hclog.NewNullLogger(),
			Inline:  func(string) bool { return true },
		})
	}()
	t.Cleanup(func() {
		_ = hc.Close()
		if err := await(t, served, "Serve to return"); err != nil {
			t.Errorf("Serve = %v", err)
		}
	})
	if err := hc.SetReadDeadline(time.Now().Add(waitTime)); err != nil {
		t.Fatal(err)
	}
	return hc, wire.NewConn(hc), writes
}

// requestBytes returns a GET request's frame as it goes on the wire.
func requestBytes(t *testing.T, id uint64) []byte {
	t.Helper()
	p, err := proto.Marshal(&pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{
		Request: &pluginv1.HTTPRequest{Method: "GET", Path: "/", Pattern: "GET /"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(p))), p...)
}

// recvAnswer reads one whole answer and returns its id.
func recvAnswer(t *testing.T, c *wire.Conn) uint64 {
	t.Helper()
	f, err := c.Recv()
	if err != nil {
		t.Fatalf("Recv = %v", err)
	}
	if f.GetResponse().GetMore() || f.GetResponse().GetResponse().GetStatus() != http.StatusOK {
		t.Fatalf("answer %d = %v, want a whole 200", f.GetId(), f)
	}
	return f.GetId()
}

// TestInlineAnswersShareAWrite checks that the reader holds the answers to
// the requests that arrived together until it has read them all, and
// sends them in one write.
func TestInlineAnswersShareAWrite(t *testing.T) {
	const n = 6
	hc, c, writes := rawPlane(t, whereHandler(10))
	var batch []byte
	for id := range uint64(n) {
		batch = append(batch, requestBytes(t, id+1)...)
	}
	if _, err := hc.Write(batch); err != nil {
		t.Fatal(err)
	}
	for want := range uint64(n) {
		if got := recvAnswer(t, c); got != want+1 {
			t.Fatalf("answer for request %d came where request %d's was due", got, want+1)
		}
	}
	if got := writes.Load(); got != 1 {
		t.Errorf("the answers to %d requests that arrived together took %d writes, want 1", n, got)
	}
}

// TestInlineAnswerNotHeldForPartOfAFrame checks that an answer is not held
// back for a request whose frame has only partly arrived: the reader
// would block reading the rest with the answer unsent.
func TestInlineAnswerNotHeldForPartOfAFrame(t *testing.T) {
	hc, c, _ := rawPlane(t, whereHandler(10))
	next := requestBytes(t, 2)
	if _, err := hc.Write(append(requestBytes(t, 1), next[:len(next)/2]...)); err != nil {
		t.Fatal(err)
	}
	if got := recvAnswer(t, c); got != 1 {
		t.Fatalf("answer for request %d, want 1", got)
	}
	if _, err := hc.Write(next[len(next)/2:]); err != nil {
		t.Fatal(err)
	}
	if got := recvAnswer(t, c); got != 2 {
		t.Fatalf("answer for request %d, want 2", got)
	}
}

// TestCleanCloseWithHeldAnswers checks that a host that sends inline
// requests and closes its end still gets Serve's nil for a clean close,
// though the answers the reader held back cannot be written.
func TestCleanCloseWithHeldAnswers(t *testing.T) {
	hc, pc := wiretest.SocketPair(t)
	if _, err := hc.Write(append(requestBytes(t, 1), requestBytes(t, 2)...)); err != nil {
		t.Fatal(err)
	}
	if err := hc.Close(); err != nil {
		t.Fatal(err)
	}
	err := dataplane.Serve(context.Background(), wire.NewConn(pc), dataplane.Options{
		Handler: whereHandler(10),
		Error:   writeError,
		Logger:  hclog.NewNullLogger(),
		Inline:  func(string) bool { return true },
	})
	if err != nil {
		t.Errorf("Serve after the host closed its end cleanly = %v, want nil", err)
	}
}
