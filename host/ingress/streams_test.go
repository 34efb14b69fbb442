package ingress_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plughost/plughost/host/ingress"
)

// TestJittered checks that a stream's lifetime moves by at most 10% of
// stream_max_lifetime either way, and over the whole of that range.
func TestJittered(t *testing.T) {
	const d = 30 * time.Minute
	for _, tt := range []struct {
		u    float64
		want time.Duration
	}{
		{0, 27 * time.Minute},
		{0.5, d},
		{0.999999, 33 * time.Minute},
	} {
		if got := ingress.Jittered(d, tt.u); got < tt.want-time.Second || got > tt.want+time.Second {
			t.Errorf("Jittered(%v, %v) = %v, want %v", d, tt.u, got, tt.want)
		}
	}
}

// openStreamFrom sends GET path from the loopback address local and reads
// the answer's head, leaving the connection open and an admitted
// stream's body unread, so that the stream lasts until the test closes
// conn or ends. A refusal's body is read whole.
func (f *fixture) openStreamFrom(t *testing.T, local, path string) (net.Conn, response) {
	t.Helper()
	conn := f.dialFrom(t, local)
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read the head of GET %s from %s: %v", path, local, err)
	}
	r := response{code: resp.StatusCode, header: resp.Header}
	if resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("read the body of GET %s from %s: %v", path, local, err)
		}
		r.body = string(b)
	}
	return conn, r
}

// TestMaxStreamsPerIP checks that one client address holds at most
// max_streams_per_ip streams at once: one more is answered 429
// too_many_streams with Retry-After and counted, another address still
// opens its own, and a stream that ends gives its slot back.
func TestMaxStreamsPerIP(t *testing.T) {
	const perIP = 3
	limits := defaultLimits
	limits.MaxStreamsPerIP = perIP
	f := newFixture(t, limits, faulty())
	const path = "/faulty/stream?n=1000000" // an event every 20 ms, for longer than the test

	var held []net.Conn
	for i := range perIP {
		conn, r := f.openStreamFrom(t, "127.0.0.1", path)
		if r.code != http.StatusOK {
			t.Fatalf("stream %d from 127.0.0.1: GET %s = %d %s, want 200", i+1, path, r.code, r.body)
		}
		held = append(held, conn)
	}
	_, r := f.openStreamFrom(t, "127.0.0.1", path)
	if r.code != http.StatusTooManyRequests || r.errorCode() != "too_many_streams" ||
		!strings.Contains(r.body, fmt.Sprint(perIP)) || r.header.Get("Retry-After") == "" {
		t.Errorf("stream %d from 127.0.0.1: GET %s = %d %s (Retry-After %q), want 429 too_many_streams naming the limit of %d, with Retry-After",
			perIP+1, path, r.code, r.body, r.header.Get("Retry-After"), perIP)
	}
	series := f.m.Conns.StreamRejections.WithLabelValues("faulty", "max_streams_per_ip")
	if got := testutil.ToFloat64(series); got != 1 {
		t.Errorf(`plughost_stream_rejections_total{plugin="faulty",reason="max_streams_per_ip"} = %v, want 1`, got)
	}

	if _, r := f.openStreamFrom(t, "127.0.0.2", path); r.code != http.StatusOK {
		t.Errorf("stream from 127.0.0.2 while 127.0.0.1 holds %d: GET %s = %d %s, want 200", perIP, path, r.code, r.body)
	}

	// The slot comes back once the ingress has seen the client go and
	// the stream's handler has returned; until then 127.0.0.1 is refused
	// as before.
	held[0].Close()
	waitFor(t, 30*time.Second, "127.0.0.1 to open a stream again once one of its own has ended", func() bool {
		conn, r := f.openStreamFrom(t, "127.0.0.1", path)
		if r.code == http.StatusOK {
			return true
		}
		if r.code != http.StatusTooManyRequests || r.errorCode() != "too_many_streams" {
			t.Fatalf("stream from 127.0.0.1 after one of its own ended: GET %s = %d %s, want 200, or 429 too_many_streams until the slot is back",
				path, r.code, r.body)
		}
		conn.Close()
		return false
	})
}
