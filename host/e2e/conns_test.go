package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// heldConn is a keep-alive connection to the ingress that has served one
// request and is left idle, holding its slot.
type heldConn struct {
	c  net.Conn
	br *bufio.Reader
}

// sendGet opens a connection to base (an http:// URL), closed when the
// test ends, and sends GET path on it with a 10 s deadline, which the
// caller clears once it has read what it needs.
func sendGet(t *testing.T, base, path string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", base, err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: test\r\n\r\n", path); err != nil {
		t.Fatalf("send GET %s: %v", path, err)
	}
	return c
}

// dialGet opens a connection to base (an http:// URL), sends GET path on
// it and reads the answer, leaving the connection open.
func dialGet(t *testing.T, base, path string) (*heldConn, *http.Response) {
	t.Helper()
	c := sendGet(t, base, path)
	hc := &heldConn{c: c, br: bufio.NewReader(c)}
	resp, err := http.ReadResponse(hc.br, nil)
	if err != nil {
		t.Fatalf("read the answer to GET %s: %v", path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	_ = c.SetDeadline(time.Time{})
	return hc, resp
}

// TestConnCaps holds connections open up to max_conns (with
// max_conns_per_ip = 0, no per-client cap, since they come from one
// address) and up to max_conns_per_ip: one more is answered 503 with
// Retry-After and closed, the admin listener keeps answering, and a freed
// slot serves again.
func TestConnCaps(t *testing.T) {
	tests := []struct {
		name   string
		limits string
		hold   int
		reason string
	}{
		{"max_conns", "max_conns = 50\n  max_conns_per_ip = 0", 50, "max_conns"},
		{"max_conns_per_ip", "max_conns = 50\n  max_conns_per_ip = 5", 5, "max_conns_per_ip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := strings.Replace(baseConfig("2s"), "limits {", "limits {\n  "+tt.limits, 1)
			h := startHost(t, cfg+pluginBlock("hello", "hello", ""))
			held := make([]*heldConn, 0, tt.hold)
			for i := range tt.hold {
				hc, resp := dialGet(t, h.ingress, "/healthz")
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("connection %d: GET /healthz = %d, want 200", i+1, resp.StatusCode)
				}
				held = append(held, hc)
			}
			if v, _ := h.metric(`plughost_connections{listener="ingress"}`); v != float64(tt.hold) {
				t.Errorf(`plughost_connections{listener="ingress"} = %v, want %d`, v, tt.hold)
			}

			_, resp := dialGet(t, h.ingress, "/hello/")
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
				errorCode(string(body)) != "too_many_connections" {
				t.Errorf("connection %d: GET /hello/ = %d (Retry-After %q) %s, want 503 too_many_connections with Retry-After",
					tt.hold+1, resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
			for _, path := range []string{"/metrics", "/v1/plugins"} {
				if code, body := h.get(h.admin + path); code != http.StatusOK {
					t.Errorf("admin GET %s with the ingress full = %d %s, want 200", path, code, body)
				}
			}
			series := fmt.Sprintf(`plughost_connections_refused_total{listener="ingress",reason=%q}`, tt.reason)
			if v, _ := h.metric(series); v < 1 {
				t.Errorf("%s = %v, want at least 1", series, v)
			}

			// A connection that closes frees its slot.
			held[0].c.Close()
			waitFor(t, 10*time.Second, "a freed connection slot", func() bool {
				_, resp := dialGet(t, h.ingress, "/hello/")
				return resp.StatusCode == http.StatusOK
			})
		})
	}
}

// TestConnCapsAtFDLimit runs the host with a hard limit of 512 file
// descriptors, as a small container or a careless unit file would give
// it. The host says at start that max_conns (10000 by default) does not
// fit, lowers it, and reports both limits. Connections are then opened
// until the ingress refuses one, and beyond: the admin listener, on its
// own allowance, keeps answering /metrics and /v1/plugins.
func TestConnCapsAtFDLimit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs sh's ulimit -n to set the hard limit")
	}
	const limit = 512
	wrapper := []string{"sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$@"`, limit), "sh"}
	// One address fills the ingress: no per-client cap.
	cfg := strings.Replace(baseConfig("2s"), "limits {", "limits {\n  max_conns_per_ip = 0", 1)
	h := waitServing(t, launchHostVia(t, cfg+pluginBlock("hello", "hello", ""), nil, wrapper))
	readyPlugin(t, h, "hello")

	log := h.log.String()
	lowered := regexp.MustCompile(`max_conns exceeds what the file descriptor limit allows; lowering it: .*lowered_to=(\d+) fd_soft_limit=512 fd_hard_limit=512`).FindStringSubmatch(log)
	if lowered == nil {
		t.Fatalf("host log does not warn that max_conns is lowered to fit 512 descriptors:\n%s", log)
	}
	maxConns, _ := strconv.Atoi(lowered[1])
	if maxConns <= 0 || maxConns >= limit {
		t.Fatalf("max_conns lowered to %d, want between 0 and the limit %d", maxConns, limit)
	}
	if !strings.Contains(log, fmt.Sprintf("file descriptor limit: soft=512 hard=512 max_conns=%d max_conns_per_ip=0", maxConns)) {
		t.Errorf("host log does not report both descriptor limits, max_conns %d and max_conns_per_ip 0", maxConns)
	}
	for _, which := range []string{"soft", "hard"} {
		if v, _ := h.metric(fmt.Sprintf(`plughost_fd_limit{limit=%q}`, which)); v != limit {
			t.Errorf(`plughost_fd_limit{limit=%q} = %v, want %d`, which, v, limit)
		}
	}

	// Fill the ingress: every connection until the first refusal is held.
	held := 0
	for {
		_, resp := dialGet(t, h.ingress, "/healthz")
		if resp.StatusCode == http.StatusServiceUnavailable {
			body, _ := io.ReadAll(resp.Body)
			if errorCode(string(body)) != "too_many_connections" {
				t.Fatalf("connection %d: GET /healthz = 503 %s, want too_many_connections", held+1, body)
			}
			break
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d: GET /healthz = %d, want 200 or 503", held+1, resp.StatusCode)
		}
		held++
		if held > maxConns {
			t.Fatalf("%d connections held, more than max_conns %d", held, maxConns)
		}
	}
	if held != maxConns {
		t.Errorf("connections held before the first refusal = %d, want max_conns %d", held, maxConns)
	}
	// Then as many again, each refused, while the admin listener answers.
	for i := range limit - maxConns {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(h.ingress, "http://"), 5*time.Second)
		if err != nil {
			t.Fatalf("extra connection %d: %v", i+1, err)
		}
		t.Cleanup(func() { c.Close() })
	}
	// Each on a new connection, which the admin listener must accept.
	fresh := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, path := range []string{"/metrics", "/v1/plugins"} {
		resp, err := fresh.Get(h.admin + path)
		if err != nil {
			t.Errorf("admin GET %s on a new connection with the ingress full at 512 descriptors: %v", path, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("admin GET %s on a new connection with the ingress full at 512 descriptors = %d, want 200", path, resp.StatusCode)
		}
	}
	if v, _ := h.metric(`plughost_connections_refused_total{listener="ingress",reason="max_conns"}`); v < 1 {
		t.Errorf(`plughost_connections_refused_total{listener="ingress",reason="max_conns"} = %v, want at least 1`, v)
	}
	if strings.Contains(h.log.String(), "too many open files") {
		t.Errorf("host ran out of descriptors:\n%s", h.log.String())
	}
}

// clientFrom returns an HTTP client whose connections come from the
// loopback address local (Linux routes all of 127/8 to lo).
func clientFrom(t *testing.T, local string) *http.Client {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
	t.Cleanup(cl.CloseIdleConnections)
	return cl
}

// TestAdminListenerPerClient holds eight idle connections to the admin
// listener from one address, sending nothing: a ninth from that address is
// answered 503 too_many_connections, while /metrics answers another
// address at once, and the first address again once the host has closed
// the idle connections at the admin listener's header timeout.
func TestAdminListenerPerClient(t *testing.T) {
	const perIP = 8
	h := startHost(t, baseConfig("2s")+pluginBlock("hello", "hello", ""))
	other := clientFrom(t, "127.0.0.2")
	metricsFrom := func(cl *http.Client) (int, string) {
		resp, err := cl.Get(h.admin + "/metrics")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	addr := strings.TrimPrefix(h.admin, "http://")
	held := make([]net.Conn, 0, perIP)
	for range perIP {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial the admin listener: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		held = append(held, c)
	}
	// The held connections and the other address's one.
	want := fmt.Sprintf(`plughost_connections{listener="admin"} %d`, perIP+1)
	waitFor(t, 5*time.Second, "the admin listener to count the held connections", func() bool {
		code, body := metricsFrom(other)
		return code == http.StatusOK && strings.Contains(body, want+"\n")
	})

	_, resp := dialGet(t, h.admin, "/metrics")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || errorCode(string(body)) != "too_many_connections" ||
		!strings.Contains(string(body), "max_conns_per_ip") || resp.Header.Get("Retry-After") == "" {
		t.Errorf("admin GET /metrics on connection %d from one address = %d (Retry-After %q) %s, want 503 too_many_connections (max_conns_per_ip) with Retry-After",
			perIP+1, resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if code, body := metricsFrom(other); code != http.StatusOK ||
		!strings.Contains(body, `plughost_connections_refused_total{listener="admin",reason="max_conns_per_ip"} 1`) {
		t.Errorf("admin GET /metrics from another address = %d, want 200 counting one refusal at max_conns_per_ip", code)
	}

	// The host closes connections that send no request within its header
	// timeout (5s), and the address has its slots back.
	start := time.Now()
	for i, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("idle admin connection %d: read = %d, %v; want the host to close it (EOF)", i+1, n, err)
		}
	}
	if took := time.Since(start); took > 12*time.Second {
		t.Errorf("the host closed the idle admin connections after %v, want about 5s", took)
	}
	if code, body := h.get(h.admin + "/metrics"); code != http.StatusOK {
		t.Errorf("admin GET /metrics once the idle connections are closed = %d %.200s, want 200", code, body)
	}
}

// TestConnsPerIPDefault runs the host at max_conns = 200 with
// max_conns_per_ip left at its default, a quarter: 50. One address,
// 127.0.0.2, holds 50 idle keep-alive connections, and every one of the
// 170 more it opens is answered 503 too_many_connections
// (max_conns_per_ip) and closed; another address, 127.0.0.3, still gets
// 200 from hello.
func TestConnsPerIPDefault(t *testing.T) {
	const maxConns, perIP, tries = 200, 50, 220
	cfg := strings.Replace(baseConfig("2s"), "limits {", fmt.Sprintf("limits {\n  max_conns = %d", maxConns), 1)
	h := startHost(t, cfg+pluginBlock("hello", "hello", ""))
	addr := strings.TrimPrefix(h.ingress, "http://")
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}

	// get sends GET /healthz from 127.0.0.2 on a new connection and reads
	// the answer; the caller closes the connection.
	get := func(i int) (net.Conn, int, string) {
		c, err := d.DialContext(t.Context(), "tcp", addr)
		if err != nil {
			t.Fatalf("connection %d from 127.0.0.2: dial: %v", i, err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
			c.Close()
			t.Fatalf("connection %d from 127.0.0.2: send: %v", i, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			t.Fatalf("connection %d from 127.0.0.2: read the answer: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = c.SetDeadline(time.Time{})
		return c, resp.StatusCode, string(body)
	}

	refused := 0
	for i := 1; i <= tries; i++ {
		c, code, body := get(i)
		if i <= perIP {
			t.Cleanup(func() { c.Close() })
			if code != http.StatusOK {
				t.Fatalf("connection %d from 127.0.0.2: GET /healthz = %d %s, want 200", i, code, body)
			}
			continue
		}
		c.Close()
		if code != http.StatusServiceUnavailable || errorCode(body) != "too_many_connections" ||
			!strings.Contains(body, "max_conns_per_ip") {
			t.Fatalf("connection %d from 127.0.0.2: GET /healthz = %d %s, want 503 too_many_connections (max_conns_per_ip)", i, code, body)
		}
		refused++
	}

	other := clientFrom(t, "127.0.0.3")
	resp, err := other.Get(h.ingress + "/hello/")
	if err != nil {
		t.Fatalf("GET /hello/ from 127.0.0.3: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /hello/ from 127.0.0.3 while 127.0.0.2 holds %d connections = %d %s, want 200", perIP, resp.StatusCode, body)
	}
	if v, _ := h.metric(`plughost_connections_refused_total{listener="ingress",reason="max_conns_per_ip"}`); v != float64(refused) {
		t.Errorf(`plughost_connections_refused_total{listener="ingress",reason="max_conns_per_ip"} = %v, want %d`, v, refused)
	}
	if v, _ := h.metric(`plughost_connections_refused_total{listener="ingress",reason="max_conns"}`); v != 0 {
		t.Errorf(`plughost_connections_refused_total{listener="ingress",reason="max_conns"} = %v, want 0`, v)
	}
}

// TestConnFloodAtDefaults runs the host at its default connection caps
// (no max_conns and no max_conns_per_ip in the file: 10000, and a
// quarter of it, 2500, per address) while one address, 127.0.0.1,
// attempts 20,000 connections. Its first 2500 are idle keep-alive
// connections, each answered once, which is the longest a slot can be
// held at the defaults (idle_timeout, 60s; a connection that sends no
// whole request head is closed at read_timeout, 5s). Each of the 17,500
// more sends nothing or a request head without its end, and is refused:
// answered 503 too_many_connections (max_conns_per_ip), or, beyond the
// refusals the host answers at once, closed unanswered. While they are
// held another address, 127.0.0.2, gets 200 from hello; the host holds
// the 2500 and no more, counts every refusal, and gives back the
// descriptors of the refused connections.
//
// A host whose descriptor limit cannot fit max_conns lowers it at start
// (TestConnCapsAtFDLimit); the test then runs at the lowered default,
// and says so.
func TestConnFloodAtDefaults(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs all of 127/8 routed to lo, and /proc to count the host's descriptors")
	}
	const (
		attempts = 20000
		workers  = 32
		// attemptBudget is what each attempt adds to the flood's
		// deadline: generous, since workers of them run at once.
		attemptBudget = time.Millisecond
	)
	cfg := regexp.MustCompile(`(?s)\nlimits \{.*?\n\}\n`).ReplaceAllString(baseConfig("2s"), "\n")
	if strings.Contains(cfg, "limits") {
		t.Fatalf("the config still has a limits block:\n%s", cfg)
	}
	h := startHost(t, cfg+pluginBlock("hello", "hello", ""))
	readyPlugin(t, h, "hello")
	perIP := defaultConnCaps(t, h)
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if need := uint64(perIP + workers + 256); rl.Cur < need {
		t.Skipf("the test's descriptor limit, %d, cannot hold the %d connections one address may: want at least %d", rl.Cur, perIP, need)
	}
	pid := h.cmd.Process.Pid
	baseFDs := countFDs(t, pid)

	// The flood's deadline grows with its work, and ends well before
	// idle_timeout would close the held connections.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second+attempts*attemptBudget)
	defer cancel()
	deadline, _ := ctx.Deadline()
	addr := strings.TrimPrefix(h.ingress, "http://")
	flooder := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}

	// Hold perIP connections, each answered once and then idle.
	var mu sync.Mutex
	held := make([]net.Conn, 0, perIP)
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	start := time.Now()
	err := fanOut(perIP, workers, func(int) error {
		c, err := flooder.DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("dial: %w", err)
		}
		mu.Lock()
		held = append(held, c)
		mu.Unlock()
		_ = c.SetDeadline(deadline)
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
			return fmt.Errorf("send GET /healthz: %w", err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return fmt.Errorf("read the answer to GET /healthz: %w", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /healthz = %d, want 200", resp.StatusCode)
		}
		return c.SetDeadline(time.Time{})
	})
	if err != nil {
		t.Fatalf("holding %d connections from 127.0.0.1: %v", perIP, err)
	}
	t.Logf("127.0.0.1 holds %d idle connections after %v", perIP, time.Since(start).Round(time.Millisecond))
	if v, _ := h.metric(`plughost_connections{listener="ingress"}`); v != float64(perIP) {
		t.Errorf(`plughost_connections{listener="ingress"} with 127.0.0.1's connections held = %v, want %d`, v, perIP)
	}

	// Another address asks hello on a new connection each time, until the
	// flood ends and once after.
	other := clientFrom(t, "127.0.0.2")
	other.Transport.(*http.Transport).DisableKeepAlives = true
	helloFrom := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.ingress+"/hello/", nil)
		if err != nil {
			return err
		}
		resp, err := other.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /hello/ = %d %s, want 200", resp.StatusCode, body)
		}
		return nil
	}
	flooded := make(chan struct{})
	var probes, probeFails int
	var probeErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			err := helloFrom()
			probes++
			if err != nil {
				probeFails++
				probeErr = err
			}
			select {
			case <-flooded:
				return
			default:
			}
		}
	})

	// The rest of the attempts, each of which must be refused.
	wantMsg := fmt.Sprintf("at its limit of %d connections (max_conns_per_ip)", perIP)
	var answered, unanswered atomic.Int64
	start = time.Now()
	err = fanOut(attempts-perIP, workers, func(i int) error {
		c, err := flooder.DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("dial: %w", err)
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		if i%2 == 1 {
			if _, err := io.WriteString(c, "GET /hello/ HTTP/1.1\r\nHost: test\r\n"); err != nil {
				if closedUnanswered(err) {
					unanswered.Add(1)
					return nil
				}
				return fmt.Errorf("send a request head without its end: %w", err)
			}
		}
		b, err := io.ReadAll(c)
		if len(b) == 0 && (err == nil || closedUnanswered(err)) {
			unanswered.Add(1)
			return nil
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && len(b) == 0 {
			return fmt.Errorf("neither answered nor closed by the flood's deadline: the host holds it (%w)", err)
		}
		if err != nil {
			return fmt.Errorf("read the answer: %w, after %q", err, b)
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(b)), nil)
		if err != nil {
			return fmt.Errorf("read the answer: %w: %q", err, b)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
			errorCode(string(body)) != "too_many_connections" || !strings.Contains(string(body), wantMsg) {
			return fmt.Errorf("answer = %d (Retry-After %q) %s, want 503 too_many_connections %q with Retry-After",
				resp.StatusCode, resp.Header.Get("Retry-After"), body, wantMsg)
		}
		answered.Add(1)
		return nil
	})
	close(flooded)
	wg.Wait()
	if err != nil {
		v, _ := h.metric(`plughost_connections{listener="ingress"}`)
		t.Fatalf("127.0.0.1's connections beyond its %d: %v\n(%d answered 503 and %d closed unanswered before; the ingress holds %v connections)",
			perIP, err, answered.Load(), unanswered.Load(), v)
	}
	t.Logf("127.0.0.1's %d connections beyond its %d refused in %v: %d answered 503, %d closed unanswered; 127.0.0.2 asked hello %d times meanwhile",
		attempts-perIP, perIP, time.Since(start).Round(time.Millisecond), answered.Load(), unanswered.Load(), probes)
	if answered.Load() == 0 {
		t.Errorf("none of the %d refused connections was answered 503, want most", attempts-perIP)
	}
	if probeFails > 0 {
		t.Errorf("127.0.0.2 during the flood: %d of %d GET /hello/ failed, the last: %v", probeFails, probes, probeErr)
	}
	if err := helloFrom(); err != nil {
		t.Errorf("127.0.0.2 after the flood, 127.0.0.1 holding %d connections: %v", perIP, err)
	}

	// The host holds 127.0.0.1's connections and no more, once the other
	// address's are closed; it counted each refusal, and closed each
	// refused connection.
	waitFor(t, 5*time.Second, fmt.Sprintf("the ingress to hold %d connections", perIP), func() bool {
		v, _ := h.metric(`plughost_connections{listener="ingress"}`)
		return v == float64(perIP)
	})
	if v, _ := h.metric(`plughost_connections_refused_total{listener="ingress",reason="max_conns_per_ip"}`); v != attempts-float64(perIP) {
		t.Errorf(`plughost_connections_refused_total{listener="ingress",reason="max_conns_per_ip"} = %v, want %d`, v, attempts-perIP)
	}
	if v, _ := h.metric(`plughost_connections_refused_total{listener="ingress",reason="max_conns"}`); v != 0 {
		t.Errorf(`plughost_connections_refused_total{listener="ingress",reason="max_conns"} = %v, want 0`, v)
	}
	// The refused connections' descriptors, and no more but a few the
	// other address's requests to hello may leave to the plugin.
	const slack = 32
	fds := countFDs(t, pid)
	for wait := time.Now().Add(5 * time.Second); fds > baseFDs+perIP+slack && time.Now().Before(wait); fds = countFDs(t, pid) {
		time.Sleep(20 * time.Millisecond)
	}
	if fds > baseFDs+perIP+slack {
		t.Errorf("host has %d descriptors open holding %d connections, %d before the flood: want at most %d more than the connections",
			fds, perIP, baseFDs, slack)
	}
	t.Logf("host descriptors: %d before the flood, %d holding %d connections after it", baseFDs, fds, perIP)
	if strings.Contains(h.log.String(), "too many open files") {
		t.Errorf("host ran out of descriptors")
	}
}

var fdLimitLogRE = regexp.MustCompile(`file descriptor limit: soft=(\d+) hard=(\d+) max_conns=(\d+) max_conns_per_ip=(\d+)`)

// defaultConnCaps returns the per-address cap that h, run without
// max_conns and max_conns_per_ip, reports at start: 2500, a quarter of
// max_conns' 10000, or a quarter of the max_conns it lowered to fit its
// descriptor limit.
func defaultConnCaps(t *testing.T, h *hostProc) int {
	t.Helper()
	log := h.log.String()
	m := fdLimitLogRE.FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("host log does not report its descriptor limit and connection caps:\n%s", log)
	}
	maxConns, _ := strconv.Atoi(m[3])
	perIP, _ := strconv.Atoi(m[4])
	lowered := strings.Contains(log, "max_conns exceeds what the file descriptor limit allows; lowering it")
	switch {
	case maxConns == 10000 && !lowered:
	case maxConns < 10000 && lowered:
		t.Logf("the host's descriptor limit (soft %s, hard %s) lowers max_conns to %d: testing at its default per address", m[1], m[2], maxConns)
	default:
		t.Fatalf("host reports max_conns %d (lowered: %v), want 10000, or less with a warning that it was lowered", maxConns, lowered)
	}
	if want := (maxConns + 3) / 4; perIP != want {
		t.Fatalf("host reports max_conns_per_ip %d at max_conns %d, want a quarter, rounded up: %d", perIP, maxConns, want)
	}
	return perIP
}

// fanOut calls f(0) to f(n-1) from workers goroutines, and stops at the
// first error, which it returns with the index of its call.
func fanOut(n, workers int, f func(i int) error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				mu.Lock()
				stop := first != nil
				mu.Unlock()
				if stop {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("connection %d: %w", i+1, err)
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// closedUnanswered reports whether err is how a connection closed by its
// peer without an answer shows: a reset, or a broken pipe to a write.
func closedUnanswered(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// countFDs returns how many file descriptors process pid has open.
func countFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("count the descriptors of process %d: %v", pid, err)
	}
	return len(ents)
}
