package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// openStream opens a connection to base, sends GET path and reads the
// answer's head, leaving the connection open and its body unread. A
// non-200 answer's body is read whole into body.
func openStream(t *testing.T, base, path string) (c net.Conn, resp *http.Response, body string) {
	t.Helper()
	c = sendGet(t, base, path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read the head of GET %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
	}
	_ = c.SetDeadline(time.Time{})
	return c, resp, body
}

// TestStreamsDoNotDenyWallet holds idle event streams open to the wallet:
// 512 of them (as many as max_inflight), and max_streams of them with one
// more. The one beyond max_streams gets 429 with Retry-After, and the
// wallet's ordinary routes keep answering: streams never take their
// in-flight slots.
func TestStreamsDoNotDenyWallet(t *testing.T) {
	tests := []struct {
		name   string
		limits string // lines for the limits block
		plugin string // lines for the wallet's block
		hold   int
		reject string // the cap one more stream hits, or ""
	}{
		{"512 idle streams", "", "  max_inflight = 512\n", 512, ""},
		{"max_streams + 1", "", "  max_streams = 16\n", 16, "max_streams"},
		{"max_streams_per_ip + 1", "  max_streams_per_ip = 4\n", "", 4, "max_streams_per_ip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := strings.Replace(baseConfig("2s"), "limits {\n", "limits {\n"+tt.limits, 1)
			h := startHost(t, cfg+pluginBlock("wallet", "wallet", tt.plugin))
			readyPlugin(t, h, "wallet")
			for i := range tt.hold {
				_, resp, body := openStream(t, h.ingress, "/wallet/v1/events")
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("stream %d: GET /wallet/v1/events = %d %s, want 200", i+1, resp.StatusCode, body)
				}
			}
			if v, _ := h.metric(`plughost_streams{plugin="wallet"}`); v != float64(tt.hold) {
				t.Errorf(`plughost_streams{plugin="wallet"} = %v, want %d`, v, tt.hold)
			}
			if tt.reject != "" {
				_, resp, body := openStream(t, h.ingress, "/wallet/v1/events")
				if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
					errorCode(body) != "too_many_streams" {
					t.Errorf("stream %d: GET /wallet/v1/events = %d (Retry-After %q) %s, want 429 too_many_streams with Retry-After",
						tt.hold+1, resp.StatusCode, resp.Header.Get("Retry-After"), body)
				}
				series := fmt.Sprintf(`plughost_stream_rejections_total{plugin="wallet",reason=%q}`, tt.reject)
				if v, _ := h.metric(series); v != 1 {
					t.Errorf("%s = %v, want 1", series, v)
				}
			}
			for i := range 20 {
				rc := walletIssue(t, h, fmt.Sprintf("issue-%d", i), "alice", 1)
				walletAccount(t, h, "alice", rc.Seq)
			}
		})
	}
}

// TestStreamMaxLifetime checks that a stream ends cleanly at
// stream_max_lifetime, so that its client sees a complete response, and
// that the end is counted.
func TestStreamMaxLifetime(t *testing.T) {
	cfg := strings.Replace(baseConfig("2s"), "limits {\n", "limits {\n  stream_max_lifetime = \"1s\"\n", 1)
	h := startHost(t, cfg+walletBlock(""))
	readyPlugin(t, h, "wallet")
	req, err := http.NewRequestWithContext(ctxTimeout(t, 15*time.Second), http.MethodGet, h.ingress+"/wallet/v1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET /wallet/v1/events: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), ": subscribed") {
		t.Fatalf("GET /wallet/v1/events = %d %q, %v; want 200 with the subscription comment, ended cleanly", resp.StatusCode, b, err)
	}
	if d := time.Since(start); d < 900*time.Millisecond || d > 10*time.Second {
		t.Errorf("the stream lasted %v, want about stream_max_lifetime (1s, ±10%%)", d)
	}
	series := `plughost_streams_cut_total{plugin="wallet",reason="lifetime"}`
	waitFor(t, 5*time.Second, series+" = 1", func() bool {
		v, _ := h.metric(series)
		return v == 1
	})
}

// rssBytes returns a process's resident set size.
func rssBytes(t *testing.T, pid int) int64 { return int64(procMB(t, pid, "VmRSS") * (1 << 20)) }

// TestNonReadingStreamsAreCut opens 200 event streams to the wallet whose
// client sends its request and never reads, while transfers run. Each
// stream's events pile up until the host can write no more: the host
// buffers at most stream_buffer per stream, the wallet's handler waits
// for credit, and after stream_write_timeout the host cuts the stream,
// counts it and cancels the handler. Host and wallet each grow by less
// than 64 MB meanwhile, and once the streams are cut the wallet holds no
// events for them.
func TestNonReadingStreamsAreCut(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads RSS from /proc")
	}
	const (
		streams = 200
		limit   = 64 << 20
	)
	cfg := strings.Replace(baseConfig("2s"), "limits {", "limits {\n  stream_write_timeout = \"2s\"", 1)
	h := startHost(t, cfg+walletBlock(""))
	wallet := readyPlugin(t, h, "wallet")

	// Warm up, so the baseline holds what a busy host holds anyway.
	const workers = 4
	for i := range workers {
		walletIssue(t, h, fmt.Sprintf("fund-%d", i), fmt.Sprintf("payer%d", i), 1<<40)
	}
	var nonces [workers]atomic.Uint64 // each payer's last nonce
	load := func(ctx context.Context, n int) (ok, failed int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				c := &http.Client{Timeout: 10 * time.Second}
				for i := 0; ctx.Err() == nil && (n == 0 || i < n); i++ {
					nonce := nonces[w].Add(1)
					body := fmt.Sprintf(`{"from":"payer%d","to":"payee","amount":1,"nonce":%d}`, w, nonce)
					r, err := walletPost(ctx, c, h.ingress+"/wallet/v1/transfer", fmt.Sprintf("t%d-%d", w, nonce), body)
					mu.Lock()
					if err == nil && r.code == http.StatusOK {
						ok++
					} else if ctx.Err() == nil {
						failed++
						t.Errorf("transfer %s = %v, %v; want 200", body, r, err)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return ok, failed
	}
	load(t.Context(), 200)
	hostBase, walletBase := rssBytes(t, h.cmd.Process.Pid), rssBytes(t, wallet.Pid)

	for i := range streams {
		_, resp, body := openStream(t, h.ingress, "/wallet/v1/events")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: GET /wallet/v1/events = %d %s, want 200", i+1, resp.StatusCode, body)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var transfers int
	wg.Go(func() { transfers, _ = load(ctx, 0) })
	var hostPeak, walletPeak int64
	cut := `plughost_streams_cut_total{plugin="wallet",reason="write_timeout"}`
	for ctx.Err() == nil {
		hostPeak = max(hostPeak, rssBytes(t, h.cmd.Process.Pid))
		walletPeak = max(walletPeak, rssBytes(t, wallet.Pid))
		if v, _ := h.metric(cut); v >= streams {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	stopped := ctx.Err() != nil
	cancel()
	wg.Wait()
	if stopped {
		v, _ := h.metric(cut)
		t.Fatalf("after 90s of transfers, %s = %v, want %d", cut, v, streams)
	}
	t.Logf("%d transfers; host RSS %d MB -> peak %d MB; wallet RSS %d MB -> peak %d MB",
		transfers, hostBase>>20, hostPeak>>20, walletBase>>20, walletPeak>>20)
	if d := hostPeak - hostBase; d >= limit {
		t.Errorf("host RSS grew by %d MB with %d non-reading streams, want < 64 MB", d>>20, streams)
	}
	if d := walletPeak - walletBase; d >= limit {
		t.Errorf("wallet RSS grew by %d MB with %d non-reading streams, want < 64 MB", d>>20, streams)
	}
	waitFor(t, 10*time.Second, "every stream to end in host and wallet", func() bool {
		open, _ := h.metric(`plughost_streams{plugin="wallet"}`)
		depth, _ := h.metric(`queue_depth{plugin="wallet",queue="events"}`)
		return open == 0 && depth == 0
	})
}

// TestStreamClosesItsConnection checks that a connection closes after a
// stream, whose socket send buffer the host shrank to stream_buffer, so
// that no later request on it is served with that buffer, while a
// connection that served an ordinary request stays open for the next.
func TestStreamClosesItsConnection(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("faulty", "faulty", ""))
	for _, tt := range []struct {
		path      string
		wantClose bool
	}{
		{"/faulty/ok", false},
		{"/faulty/stream?n=3", true},
	} {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(h.ingress, "http://"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: test\r\n\r\n", tt.path); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", tt.path, err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d %q, %v; want 200", tt.path, resp.StatusCode, b, err)
		}
		if resp.Close != tt.wantClose {
			t.Errorf("GET %s: Connection: close = %t, want %t", tt.path, resp.Close, tt.wantClose)
		}
		// A second request on the connection: answered on a kept one,
		// and the end of the connection after a stream.
		_, werr := fmt.Fprintf(c, "GET /faulty/ok HTTP/1.1\r\nHost: test\r\n\r\n")
		resp2, rerr := http.ReadResponse(br, nil)
		switch {
		case tt.wantClose && rerr == nil:
			t.Errorf("GET /faulty/ok after GET %s on the same connection = %d, want the connection closed", tt.path, resp2.StatusCode)
		case !tt.wantClose && (werr != nil || rerr != nil || resp2.StatusCode != http.StatusOK):
			t.Errorf("GET /faulty/ok after GET %s on the same connection: %v, %v; want 200", tt.path, werr, rerr)
		}
	}
}
