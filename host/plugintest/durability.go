package plugintest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/host/supervisor"
)

// Do sends one request to the plugin under test, its target
// ("/path?query") relative to the plugin's mount, and returns the
// answer's status and body.
type Do func(ctx context.Context, method, target string, header http.Header, body []byte) (status int, respBody []byte, err error)

// Durability adds the durability check: the kit starts the plugin with
// a data dir, runs write from 8 goroutines with increasing i (0, 1, 2, …)
// until at least 100 writes are acknowledged, kills the plugin process
// with SIGKILL while they are still writing, starts it again on the same
// data dir, and calls read for every i whose write returned nil. write
// makes the plugin store write i and returns nil once the plugin has
// acknowledged it (a 2xx, say), an error otherwise; read returns nil if
// write i is there, an error saying what it found if not. A good plugin
// makes a write durable before it acknowledges it.
func Durability(write, read func(ctx context.Context, do Do, i int) error) Option {
	return func(c *conformance) { c.durability = &durability{write: write, read: read} }
}

type durability struct {
	write, read func(ctx context.Context, do Do, i int) error
}

// Bounds of the durability check.
const (
	durableWriters = 8
	durableAcks    = 100
	durableBudget  = 30 * time.Second
)

func (c *conformance) durable(t *testing.T) {
	dir := t.TempDir()
	p := c.readyIn(t, dir)
	ctx, cancel := context.WithTimeout(t.Context(), durableBudget)
	defer cancel()
	do := doer(p)

	var (
		mu      sync.Mutex
		acked   []int
		next    int
		lastErr error
	)
	enough := make(chan struct{})
	var once sync.Once
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range durableWriters {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				err := c.durability.write(ctx, do, i)
				mu.Lock()
				if err == nil {
					acked = append(acked, i)
					if len(acked) >= durableAcks {
						once.Do(func() { close(enough) })
					}
				} else {
					lastErr = err
				}
				mu.Unlock()
				if ctx.Err() != nil {
					return
				}
			}
		})
	}
	select {
	case <-enough:
	case <-ctx.Done():
		close(stop)
		wg.Wait()
		t.Fatalf("fewer than %d writes acknowledged in %v (last error: %v); a good plugin acknowledges a write in well under a second", durableAcks, durableBudget, lastErr)
	}
	pid := p.Status().Pid
	if pid <= 0 {
		t.Fatal("the supervisor reports no process to kill")
	}
	// The writers are still writing: the kill lands among them.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 the plugin (pid %d): %v", pid, err)
	}
	close(stop)
	wg.Wait()
	for alive(pid) {
		if ctx.Err() != nil {
			t.Fatalf("plugin process %d still alive after SIGKILL", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.Stop(time.Now())

	again := c.readyIn(t, dir)
	do = doer(again)
	mu.Lock()
	defer mu.Unlock()
	lost := 0
	for _, i := range acked {
		if err := c.durability.read(ctx, do, i); err != nil {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged write %d is gone after kill -9 and a restart: %v", i, err)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged writes lost after kill -9; a good plugin makes a write durable (fdatasync) before it answers", lost, len(acked))
	}
	t.Logf("%d writes acknowledged before kill -9 (of %d started), all checked after the restart", len(acked), next)
}

// doer sends requests to p's current endpoint.
func doer(p *supervisor.Process) Do {
	return func(ctx context.Context, method, target string, header http.Header, body []byte) (int, []byte, error) {
		conn := p.Endpoint()
		if conn == nil {
			return 0, nil, errors.New("the plugin is not running")
		}
		u, err := url.Parse(target)
		if err != nil {
			return 0, nil, fmt.Errorf("target %q: %w", target, err)
		}
		if header == nil {
			header = http.Header{}
		}
		resp, err := conn.RoundTrip(ctx, &dataplane.Request{Method: method, Path: u.Path, RawQuery: u.RawQuery, Header: header,
			Body: [][]byte{body}, RemoteAddr: "192.0.2.1:1234", Host: "conformance"})
		if err != nil {
			return 0, nil, err
		}
		defer resp.Close()
		var b []byte
		for {
			chunk, err := resp.Next()
			b = append(b, chunk...)
			if errors.Is(err, io.EOF) {
				return resp.Status, b, nil
			}
			if err != nil {
				return resp.Status, b, err
			}
		}
	}
}
