package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// slowStream opens GET path, a server-sent events route, on the host's
// ingress from a raw connection whose receive buffer is 4 KiB, and reads
// only the answer's head, which must be 200 within 10s. The test then
// reads nothing, so that the stream's consumer falls behind, until it
// reads resp.Body with a read deadline of its own on conn; the small
// reader takes little off the socket meanwhile. conn closes at cleanup.
func slowStream(t *testing.T, h *hostProc, path string) (conn net.Conn, resp *http.Response) {
	t.Helper()
	addr := strings.TrimPrefix(h.ingress, "http://")
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.Join(err, serr)
	}}
	conn, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", path, addr)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err = http.ReadResponse(bufio.NewReaderSize(conn, 512), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("slow stream GET %s: %v %v", path, resp, err)
	}
	return conn, resp
}

// follower reads a stream from a goroutine the test waits for at
// cleanup: last is the id of its last event, and bad, once set, says why
// it stopped early: an id not after the one before, or, for a stream
// that must never lag, a gap in the ids or a lagged event. A stream that
// may lag (drop-oldest) must account for every gap in its ids with the
// "missed" counts of its lagged events: missed and gaps add them up.
type follower struct {
	mayLag       bool
	last         atomic.Uint64
	missed, gaps atomic.Uint64
	bad          atomic.Value
}

// follow opens GET url, a server-sent events route that must never lag,
// for at most d, and follows it until it ends, goes wrong or the test
// ends.
func follow(t *testing.T, url string, d time.Duration) *follower {
	return followStream(t, url, d, &follower{})
}

// followLagging is follow for a drop-oldest stream, whose reader may fall
// behind on a loaded machine: its lagged events must account for its
// gaps.
func followLagging(t *testing.T, url string, d time.Duration) *follower {
	return followStream(t, url, d, &follower{mayLag: true})
}

func followStream(t *testing.T, url string, d time.Duration, f *follower) *follower {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxTimeout(t, d), "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(func() { resp.Body.Close() })
	wg.Go(func() {
		sc := bufio.NewScanner(resp.Body)
		lagged := false
		for sc.Scan() {
			l := sc.Text()
			switch {
			case l == "event: lagged" && !f.mayLag:
				f.bad.Store("a lagged event")
				return
			case l == "event: lagged":
				lagged = true
			case lagged && strings.HasPrefix(l, "data: "):
				var lag struct {
					Missed uint64 `json:"missed"`
				}
				if json.Unmarshal([]byte(l[len("data: "):]), &lag) != nil || lag.Missed == 0 {
					f.bad.Store(fmt.Sprintf("lagged event %q", l))
					return
				}
				f.missed.Add(lag.Missed)
				lagged = false
			case strings.HasPrefix(l, "id: "):
				n, _ := strconv.ParseUint(l[len("id: "):], 10, 64)
				prev := f.last.Load()
				switch {
				case n <= prev:
					f.bad.Store(fmt.Sprintf("id %d after %d", n, prev))
					return
				case n != prev+1 && !f.mayLag:
					f.bad.Store(fmt.Sprintf("id %d after %d", n, prev))
					return
				}
				f.gaps.Add(n - prev - 1)
				f.last.Store(n)
			}
		}
	})
	return f
}

// busLagged reports whether bus_lagged_total{consumer} has moved.
func (h *hostProc) busLagged(consumer string) bool {
	_, body := h.get(h.admin + "/metrics")
	for l := range strings.Lines(body) {
		if strings.HasPrefix(l, "bus_lagged_total{") && strings.Contains(l, `consumer="`+consumer+`"`) && !strings.HasSuffix(strings.TrimSpace(l), " 0") {
			return true
		}
	}
	return false
}
