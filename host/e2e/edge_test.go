package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawExchange sends raw, a whole HTTP/1.1 request as bytes, on a new
// loopback connection to the host at base, writing all of it before it
// reads, and returns the answer with its body read. It is for requests
// net/http's client will not send, and for clients that do not read
// until they have sent everything.
func rawExchange(t *testing.T, base string, raw []byte) (*http.Response, []byte, error) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		return nil, nil, err
	}
	if _, err := conn.Write(raw); err != nil {
		return nil, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// sendRaw dials base's host, writes raw on the connection, and returns it
// with its deadline set d ahead; it is closed when the test ends.
func sendRaw(t *testing.T, base, raw string, d time.Duration) net.Conn {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	return conn
}

// aboveDebug matches a host log line at info level or above.
var aboveDebug = regexp.MustCompile(`(?m)^.*\[(INFO|WARN|ERROR)\].*$`)

// TestMalformedRequests checks that bytes a plugin must never see are the
// client's fault: 400 JSON from the host, nothing in its log above debug,
// and no effect on the plugin; that heads the host's HTTP server cannot
// read get a JSON error too; and that a path with an encoded slash does
// not reach the route its decoded form names.
func TestMalformedRequests(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("hello", "hello", "")+pluginBlock("faulty", "faulty", ""))
	tests := []struct {
		name       string
		request    string // a raw request up to the blank line; Host and Connection added
		wantStatus int
		wantCode   string
	}{
		{"raw byte in path", "GET /hello/\xff HTTP/1.1\r\n", 400, "bad_request"},
		{"encoded invalid UTF-8 in path", "GET /hello/%C3%28 HTTP/1.1\r\n", 400, "bad_request"},
		{"encoded NUL in path", "GET /hello/sleep%00?ms=1 HTTP/1.1\r\n", 400, "bad_request"},
		{"raw byte in query", "GET /hello/sleep?ms=1&x=\xfe HTTP/1.1\r\n", 400, "bad_request"},
		{"encoded invalid byte in query", "GET /hello/sleep?ms=1&x=%ff HTTP/1.1\r\n", 400, "bad_request"},
		{"encoded NUL in query", "GET /hello/sleep?ms=1%00 HTTP/1.1\r\n", 400, "bad_request"},
		{"malformed escape in query", "GET /hello/sleep?ms=1&x=%zz HTTP/1.1\r\n", 400, "bad_request"},
		{"header not UTF-8", "GET /hello/ HTTP/1.1\r\nX-Name: caf\xe9\r\n", 400, "bad_request"},
		{"header with a C1 control", "GET /hello/ HTTP/1.1\r\nX-Name: a\xc2\x85b\r\n", 400, "bad_request"},
		{"encoded slash after the mount", "GET /hello%2Fsleep?ms=1 HTTP/1.1\r\n", 404, "not_found"},
		{"encoded slash inside the plugin's path", "POST /faulty%2fecho HTTP/1.1\r\nContent-Length: 4\r\n", 404, "not_found"},
	}
	mark := len(h.log.String())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := tt.request + "Host: plughost\r\nConnection: close\r\n\r\n"
			if strings.HasPrefix(raw, "POST") {
				raw += "ping"
			}
			resp, body, err := rawExchange(t, h.ingress, []byte(raw))
			if err != nil {
				t.Fatalf("%q: %v", tt.request, err)
			}
			checkJSONError(t, tt.name, resp, body, tt.wantStatus, tt.wantCode)
		})
	}
	// Heads the host's HTTP servers cannot read at all get the same JSON
	// error, with the status net/http gives them, and not its plain text,
	// on the ingress and on the admin listener.
	heads := []struct {
		name, head string
		wantStatus int
		wantCode   string
	}{
		{"header line without a colon", "GET /hello/ HTTP/1.1\r\nHost: plughost\r\nBad Header\r\n\r\n", 400, "bad_request"},
		{"Content-Length not a number", "POST /faulty/echo HTTP/1.1\r\nHost: plughost\r\nContent-Length: abc\r\n\r\n", 400, "bad_request"},
		{"no request line", "GARBAGE\r\n\r\n", 400, "bad_request"},
		{"no Host", "GET /hello/ HTTP/1.1\r\n\r\n", 400, "bad_request"},
		{"unsupported Transfer-Encoding", "POST /faulty/echo HTTP/1.1\r\nHost: plughost\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "unsupported_transfer_encoding"},
		{"HTTP/9.1", "GET /hello/ HTTP/9.1\r\nHost: plughost\r\n\r\n", 505, "unsupported_version"},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "unsupported_version"},
		{"head over 64 KiB", "GET /hello/ HTTP/1.1\r\nHost: plughost\r\nX-Big: " + strings.Repeat("a", 80<<10) + "\r\n\r\n", 431, "head_too_large"},
		{"Expect other than 100-continue", "POST /faulty/echo HTTP/1.1\r\nHost: plughost\r\nExpect: teapot\r\nContent-Length: 4\r\n\r\nping", 417, "expectation_failed"},
	}
	for _, tt := range heads {
		for _, l := range []struct{ name, base string }{{"ingress", h.ingress}, {"admin", h.admin}} {
			if l.name == "admin" && tt.wantStatus == http.StatusRequestHeaderFieldsTooLarge {
				continue // the admin server keeps net/http's limit on heads, 1 MiB
			}
			t.Run(l.name+"/"+tt.name, func(t *testing.T) {
				resp, body, err := rawExchange(t, l.base, []byte(tt.head))
				if err != nil {
					t.Fatalf("%.60q: %v", tt.head, err)
				}
				checkJSONError(t, tt.name, resp, body, tt.wantStatus, tt.wantCode)
				if !resp.Close {
					t.Errorf("%s: the answer keeps the connection; want Connection: close", tt.name)
				}
			})
		}
	}
	if lines := aboveDebug.FindAllString(h.log.String()[mark:], -1); len(lines) > 0 {
		t.Errorf("the host logged above debug for malformed requests:\n%s", strings.Join(lines, "\n"))
	}

	// A target that names no endpoint on either listener: a CONNECT.
	for _, raw := range []string{"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n"} {
		for _, l := range []struct{ name, base string }{{"ingress", h.ingress}, {"admin", h.admin}} {
			resp, body, err := rawExchange(t, l.base, []byte(raw))
			if err != nil {
				t.Fatalf("%s: %.30q: %v", l.name, raw, err)
			}
			checkJSONError(t, fmt.Sprintf("%s: %.30q", l.name, raw), resp, body, http.StatusNotFound, "not_found")
		}
	}

	// A plugin's answer made of the bytes net/http answers a bad head with
	// reaches the client as the plugin wrote it. The bodies' lengths sweep
	// the point where net/http's 4 KiB write buffer splits the answer, so
	// that for one of them the last write is exactly net/http's 400.
	const err400 = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"
	for n := 3800; n <= 4300; n++ {
		body := strings.Repeat("x", n-len(err400)) + err400
		raw := fmt.Sprintf("POST /faulty/echo/large HTTP/1.1\r\nHost: plughost\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", n, body)
		resp, got, err := rawExchange(t, h.ingress, []byte(raw))
		if err != nil {
			t.Fatalf("POST /faulty/echo/large of %d bytes ending in net/http's 400: %v", n, err)
		}
		if resp.StatusCode != http.StatusOK || string(got) != body {
			t.Fatalf("POST /faulty/echo/large of %d bytes ending in net/http's 400 = %d, %d bytes ending %q; want 200 and the same bytes",
				n, resp.StatusCode, len(got), got[max(0, len(got)-120):])
		}
	}

	// The same requests without the bad bytes reach the plugins: the
	// cases above were refused for their bytes, not their routes.
	for _, good := range []string{
		"GET /hello/sleep?ms=1 HTTP/1.1\r\n",
		"GET /hello/sleep?ms=1&x=%E2%82%AC+%3B HTTP/1.1\r\n",
		"GET /hello/%C3%A9t%C3%A9 HTTP/1.1\r\n", // UTF-8, no such route: the plugin's 404
		"POST /faulty/echo HTTP/1.1\r\nContent-Length: 4\r\n",
	} {
		raw := good + "Host: plughost\r\nConnection: close\r\n\r\n"
		if strings.HasPrefix(raw, "POST") {
			raw += "ping"
		}
		resp, body, err := rawExchange(t, h.ingress, []byte(raw))
		if err != nil {
			t.Fatalf("%q: %v", good, err)
		}
		want := http.StatusOK
		if strings.Contains(good, "%C3") {
			want = http.StatusNotFound
			if !bytes.Contains(body, []byte(`has no route`)) {
				t.Errorf("%q = %d %s, want the ingress's 404 for a route hello lacks", good, resp.StatusCode, body)
			}
		}
		if resp.StatusCode != want {
			t.Errorf("%q = %d %s, want %d", good, resp.StatusCode, body, want)
		}
	}
}

// TestFrontDoorOneConnection sends, pipelined on one connection to the
// host binary, requests its front door serves itself (GET and HEAD
// without a body) and then one it hands to net/http with the connection
// (a POST with a body), and one more after it: every answer comes back
// whole and in order, and a plugin's hop-by-hop headers are in none.
func TestFrontDoorOneConnection(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("hello", "hello", "")+pluginBlock("faulty", "faulty", ""))
	u, err := url.Parse(h.ingress)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	reqs := []struct {
		raw, method string
		want        int
		body        string // a part of the answer's body
	}{
		{"GET /hello/ HTTP/1.1\r\nHost: plughost\r\n\r\n", "GET", 200, "greeting"},
		{"HEAD /hello/ HTTP/1.1\r\nHost: plughost\r\n\r\n", "HEAD", 200, ""},
		{"GET /faulty/hop HTTP/1.1\r\nHost: plughost\r\n\r\n", "GET", 200, "hop"},
		{"POST /faulty/echo HTTP/1.1\r\nHost: plughost\r\nContent-Length: 4\r\n\r\nping", "POST", 200, "ping"},
		{"GET /hello/ HTTP/1.1\r\nHost: plughost\r\n\r\n", "GET", 200, "greeting"},
	}
	var all strings.Builder
	for _, r := range reqs {
		all.WriteString(r.raw)
	}
	if _, err := io.WriteString(conn, all.String()); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	for i, r := range reqs {
		resp, err := http.ReadResponse(br, &http.Request{Method: r.method})
		if err != nil {
			t.Fatalf("answer %d (%s): %v", i, strings.Fields(r.raw)[1], err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("answer %d's body: %v", i, err)
		}
		if resp.StatusCode != r.want || !strings.Contains(string(body), r.body) {
			t.Errorf("answer %d (%s %s) = %d %q, want %d with %q", i, r.method, strings.Fields(r.raw)[1], resp.StatusCode, body, r.want, r.body)
		}
		for _, k := range []string{"X-Named", "Keep-Alive", "Upgrade", "Trailer", "Proxy-Authenticate"} {
			if v, ok := resp.Header[k]; ok {
				t.Errorf("answer %d carries the plugin's %s: %q", i, k, v)
			}
		}
		if resp.Close {
			t.Fatalf("answer %d closes the connection; want it kept for the next", i)
		}
	}
}

// TestFrontDoorClientLeaves checks, against the host binary, the two
// ways a client can leave a connection the front door serves: during a
// request, which is cancelled in the plugin long before its handler would
// have answered (the host counts a 499 and nothing stays in flight); and
// within a request head, which is answered 400 as net/http answers it.
func TestFrontDoorClientLeaves(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("hello", "hello", ""))
	u, err := url.Parse(h.ingress)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() net.Conn {
		t.Helper()
		conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		return conn
	}

	// A handler that would sleep for a minute, left once it runs.
	conn := dial()
	if _, err := io.WriteString(conn, "GET /hello/sleep?ms=60000 HTTP/1.1\r\nHost: plughost\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	inflight := `plughost_inflight_requests{plugin="hello"}`
	waitFor(t, 10*time.Second, "the sleep to be in flight", func() bool {
		v, _ := h.metric(inflight)
		return v == 1
	})
	conn.Close()
	waitFor(t, 20*time.Second, "the sleep to be cancelled and counted as 499", func() bool {
		n, _ := h.metric(`plughost_http_requests_total{code="499",plugin="hello"}`)
		v, _ := h.metric(inflight)
		return n == 1 && v == 0
	})

	// A head cut short by the client's end of the connection.
	conn = dial()
	if _, err := io.WriteString(conn, "GET /hello/ HTTP/1.1\r\nHo"); err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("a head cut short: %v, want a 400", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a head cut short = %s, want 400", resp.Status)
	}

	if code, body := h.get(h.ingress + "/hello/"); code != http.StatusOK {
		t.Errorf("GET /hello/ after both = %d %s, want 200", code, body)
	}
}

// edgeConfig is baseConfig with the limits block replaced by limits.
func edgeConfig(limits string) string {
	return fmt.Sprintf(`
listen         = "127.0.0.1:0"
data_dir       = "./data"
plugin_dir     = %q
drain_deadline = "2s"
admin {
  listen = "127.0.0.1:0"
}
limits {
%s
}
health {
  interval = "1s"
  timeout  = "1s"
  failures = 3
}
`, bins.plugins, limits)
}

// TestBodyOverCapIsReadable checks that a client sending 8 MiB to a
// route capped at 1 MiB receives the 413 JSON, written the ordinary way
// (net/http's client) or sending the whole body before it reads.
func TestBodyOverCapIsReadable(t *testing.T) {
	h := startHost(t, edgeConfig("  max_body_bytes = 1048576")+pluginBlock("faulty", "faulty", ""))
	big := bytes.Repeat([]byte("z"), 8<<20)

	resp, body, err := request(t, http.MethodPost, h.ingress+"/faulty/echo", bytes.NewReader(big), nil)
	if err != nil {
		t.Fatalf("net/http client: POST /faulty/echo with 8 MiB: %v", err)
	}
	checkJSONError(t, "net/http client: POST /faulty/echo with 8 MiB", resp, body, http.StatusRequestEntityTooLarge, "body_too_large")

	resp, body, err = request(t, http.MethodPost, h.ingress+"/faulty/echo", unsized{bytes.NewReader(big)}, nil)
	if err != nil {
		t.Fatalf("net/http client: POST /faulty/echo with 8 MiB chunked: %v", err)
	}
	checkJSONError(t, "net/http client: POST /faulty/echo with 8 MiB chunked", resp, body, http.StatusRequestEntityTooLarge, "body_too_large")

	raw := append([]byte(fmt.Sprintf("POST /faulty/echo HTTP/1.1\r\nHost: plughost\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", len(big))), big...)
	for i := range 3 {
		resp, body, err := rawExchange(t, h.ingress, raw)
		if err != nil {
			t.Fatalf("raw socket, attempt %d: POST /faulty/echo with 8 MiB, sent before reading: %v", i+1, err)
		}
		checkJSONError(t, "raw socket: POST /faulty/echo with 8 MiB", resp, body, http.StatusRequestEntityTooLarge, "body_too_large")
	}
}

// TestSlowBodies holds 1,000 connections that send a POST body at one
// byte a second, as slowhttptest -B does, and checks that the plugin
// keeps answering everyone else, and that each slow one gets 408 at
// body_timeout. Its load is loopback only and ends with body_timeout.
func TestSlowBodies(t *testing.T) {
	const (
		conns       = 1000
		bodyTimeout = 2 * time.Second
	)
	h := startHost(t, edgeConfig(fmt.Sprintf("  max_body_bytes = 1048576\n  body_timeout = %q", bodyTimeout))+
		pluginBlock("faulty", "faulty", "  max_inflight = 64"))
	u, err := url.Parse(h.ingress)
	if err != nil {
		t.Fatal(err)
	}
	type slow struct {
		conn  net.Conn
		start time.Time
	}
	var slows []slow
	t.Cleanup(func() {
		for _, s := range slows {
			s.conn.Close()
		}
	})
	for i := range conns {
		conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
		if err != nil {
			t.Fatalf("dial slow connection %d: %v", i, err)
		}
		slows = append(slows, slow{conn: conn, start: time.Now()})
		if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintf(conn, "POST /faulty/echo HTTP/1.1\r\nHost: plughost\r\nContent-Length: 8192\r\n\r\nx"); err != nil {
			t.Fatalf("slow connection %d: %v", i, err)
		}
	}
	// One byte a second on each, until body_timeout has passed for all.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				for _, s := range slows {
					_, _ = s.conn.Write([]byte("x")) // fails once answered and closed
				}
			}
		}
	})
	defer wg.Wait()
	defer close(done)

	// Meanwhile the plugin answers others, with a body and without.
	probes := 0
	for time.Since(slows[len(slows)-1].start) < bodyTimeout {
		resp, body, err := request(t, http.MethodPost, h.ingress+"/faulty/echo", strings.NewReader("ping"), nil)
		if err != nil || resp.StatusCode != http.StatusOK || string(body) != "ping" {
			t.Errorf("POST /faulty/echo during the slow-body attack = %v %s %v, want 200 ping", status(resp), body, err)
		}
		if code, body := h.get(h.ingress + "/faulty/ok"); code != http.StatusOK {
			t.Errorf("GET /faulty/ok during the slow-body attack = %d %s, want 200", code, body)
		}
		probes++
	}
	if probes == 0 {
		t.Fatal("no probe ran while the slow bodies were held")
	}

	late := 0
	for i, s := range slows {
		resp, err := http.ReadResponse(bufio.NewReader(s.conn), nil)
		if err != nil {
			t.Fatalf("slow connection %d: read the answer: %v", i, err)
		}
		took := time.Since(s.start)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		checkJSONError(t, fmt.Sprintf("slow connection %d", i), resp, body, http.StatusRequestTimeout, "body_timeout")
		if took < bodyTimeout {
			t.Errorf("slow connection %d answered after %v, before body_timeout %v", i, took, bodyTimeout)
		}
		if took > bodyTimeout+10*time.Second {
			late++
		}
		if t.Failed() {
			break
		}
	}
	if late > 0 {
		t.Errorf("%d slow connections were answered more than 10s after body_timeout", late)
	}
	t.Logf("%d probes answered 200 while %d slow bodies were held", probes, conns)
}

func status(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

// procMB returns a /proc/PID/status figure in MiB, such as "VmHWM".
func procMB(t *testing.T, pid int, key string) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				t.Fatalf("parse %s %q: %v", key, rest, err)
			}
			return kb / 1024
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return 0
}

// TestBodyMemoryBound sends 500 concurrent bodies of max_body_bytes to a
// plugin and checks that the peak resident memory each process gained
// stays within what docs/config.md states: per plugin, max_inflight ×
// max_body_bytes of live bodies on each side, times the Go collector's
// headroom (1 + GOGC/100; 200 in the host, 100 in the plugin), plus
// 256 KiB per client connection in the host. Without the bound on bodies
// still arriving, the host would hold all 500.
func TestBodyMemoryBound(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	const (
		maxInflight = 64
		maxBody     = 1 << 20
		clients     = 500
	)
	h := startHost(t, edgeConfig(fmt.Sprintf("  max_body_bytes = %d\n  body_timeout = \"30s\"\n  request_timeout = \"30s\"", maxBody))+
		pluginBlock("bodies", "bodies", fmt.Sprintf("  max_inflight = %d", maxInflight)))
	hostPid, pluginPid := h.cmd.Process.Pid, h.plugins()["bodies"].Pid
	hostBase, pluginBase := procMB(t, hostPid, "VmRSS"), procMB(t, pluginPid, "VmRSS")

	body := bytes.Repeat([]byte("m"), maxBody)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		codes   = map[int]int{}
		errs    = map[string]int{}
		retries int
	)
	// The clients come from eight loopback addresses (Linux routes all of
	// 127/8 to lo): one address may hold only a quarter of the budget.
	var cls []*http.Client
	for i := range 8 {
		d := &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i))}}
		cl := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients, DialContext: d.DialContext}}
		t.Cleanup(cl.CloseIdleConnections)
		cls = append(cls, cl)
	}
	// post sends one body and returns the answer's status, sending it
	// again after a failure in transport. The 500 clients are part of
	// the load: on a busy machine one may be held off the CPU past the
	// host's read timeout, or be writing its body when the host, having
	// answered 429 early, closes the connection; a client then sends
	// again, as this one does. What the test checks is what the host
	// answers and the memory it holds, not the clients' luck.
	post := func(cl *http.Client) int {
		const attempts = 20
		for range attempts {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, h.ingress+"/bodies/sum", bytes.NewReader(body))
			if err != nil {
				return 0
			}
			resp, err := cl.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			mu.Lock()
			errs[err.Error()]++
			retries++
			mu.Unlock()
			if t.Context().Err() != nil {
				return 0
			}
		}
		return 0
	}
	for i := range clients {
		cl := cls[i%len(cls)]
		wg.Go(func() {
			for range 2 {
				code := post(cl)
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if retries > 0 {
		t.Logf("%d sends failed in transport and were sent again: %v", retries, errs)
	}
	if codes[http.StatusOK] == 0 || codes[http.StatusOK]+codes[http.StatusTooManyRequests] != 2*clients {
		t.Errorf("answers to %d POST /bodies/sum of %d bytes = %v (0: failed in transport 20 times; errors %v), want only 200 and 429, some 200", 2*clients, maxBody, codes, errs)
	}
	live := float64(maxInflight*maxBody) / (1 << 20)
	hostGain, pluginGain := procMB(t, hostPid, "VmHWM")-hostBase, procMB(t, pluginPid, "VmHWM")-pluginBase
	t.Logf("answers %v; peak RSS gain: host %.0f MiB, plugin %.0f MiB; live bound %.0f MiB per side", codes, hostGain, pluginGain, live)
	// The host also holds each client connection's buffers and goroutine
	// and the data plane's frames: docs/config.md allows 256 KiB per
	// connection for them.
	if bound := 3*live + clients*256.0/1024; hostGain > bound {
		t.Errorf("host peak RSS grew by %.0f MiB, want at most (1 + 200/100) × %d × %d B + %d connections × 256 KiB = %.0f MiB",
			hostGain, maxInflight, maxBody, clients, bound)
	}
	if bound := 2 * live; pluginGain > bound {
		t.Errorf("plugin peak RSS grew by %.0f MiB, want at most (1 + 100/100) × %d × %d B = %.0f MiB", pluginGain, maxInflight, maxBody, bound)
	}
}

// TestNoRequestSmuggling: a request whose body net/http frames one way
// and a proxy in front of the host could frame another gets its answer
// and the connection closes, so that what follows it on the connection
// is never served as a request: an HTTP/1.0 request with a chunked body
// (net/http reads it as empty), and a chunked request, with or without a
// Content-Length, on the ingress and the admin listener. A request framed
// by Content-Length alone keeps its connection.
func TestNoRequestSmuggling(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("hello", "hello", "")+pluginBlock("faulty", "faulty", ""))
	const next = "POST /faulty/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nSMUGGLED"
	chunk := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len("ping"), "ping")
	for _, tt := range []struct {
		name, base, raw string
		answers         int
	}{
		{"HTTP/1.0 with a chunked body", h.ingress,
			"POST /faulty/echo HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n" + next, 1},
		{"chunked with a Content-Length", h.ingress,
			"POST /faulty/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk + next, 1},
		{"chunked", h.ingress,
			"POST /faulty/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk + next, 1},
		{"HTTP/1.0 with a chunked body on the admin listener", h.admin,
			"GET /v1/plugins HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\nGET /v1/status?SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n", 1},
		{"Content-Length, then a request", h.ingress,
			"POST /faulty/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nping" +
				"POST /faulty/echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 8\r\n\r\npipeline", 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReader(sendRaw(t, tt.base, tt.raw, 20*time.Second))
			var answers []string
			for {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					if err != io.EOF && err != io.ErrUnexpectedEOF {
						t.Fatalf("after %q: %v, want the connection closed", answers, err)
					}
					break
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answers = append(answers, fmt.Sprintf("%d %s", resp.StatusCode, body))
				if strings.Contains(string(body), "SMUGGLED") {
					t.Fatalf("the bytes after the request were served as a request: %q", answers)
				}
			}
			if len(answers) != tt.answers {
				t.Errorf("answers %q, want %d, then the connection closed", answers, tt.answers)
			}
		})
	}
}

// TestAdminCookieHiddenFromPlugins: the admin listener's session cookie,
// which a browser sends to the ingress too (cookies ignore ports), never
// reaches a plugin, on the front door's path and on net/http's; the
// request's other cookies do.
func TestAdminCookieHiddenFromPlugins(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("faulty", "faulty", ""))
	for _, tt := range []struct{ name, extra string }{
		{"front door", ""},
		{"net/http", "Content-Length: 0\r\n"}, // a length the front door leaves to net/http
	} {
		t.Run(tt.name, func(t *testing.T) {
			raw := "GET /faulty/cookies HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + tt.extra +
				"Cookie: a=1; plughost_admin=s3cret; b=2\r\nCookie: plughost_admin=s3cret\r\n\r\n"
			resp, body, err := rawExchange(t, h.ingress, []byte(raw))
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || string(body) != "a=1; b=2\n" {
				t.Errorf("the plugin got cookies %d %q, want \"a=1; b=2\" alone", resp.StatusCode, body)
			}
		})
	}
}

// TestPluginStatuses: a plugin's interim 103 is dropped and its final
// status sent; a 101, or a 1xx as its only status, which would tell the
// client the connection switched protocols or sent nothing final, is 502
// bad_status, and the connection goes on as HTTP/1.1: the next pipelined
// request is answered. On the front door's path and on net/http's.
func TestPluginStatuses(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("faulty", "faulty", ""))
	for _, path := range []struct{ name, extra string }{
		{"front door", ""},
		{"net/http", "Content-Length: 0\r\n"},
	} {
		t.Run(path.name, func(t *testing.T) {
			for _, tt := range []struct {
				query      string
				wantStatus int
				wantBody   string
			}{
				{"c=404&early=1", 404, "coded"},
				{"c=500&early=1", 500, "coded"},
				{"c=101", 502, `"bad_status"`},
			} {
				raw := "GET /faulty/code?" + tt.query + " HTTP/1.1\r\nHost: x\r\n" + path.extra + "\r\n" +
					"GET /faulty/ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
				conn := sendRaw(t, h.ingress, raw, 20*time.Second)
				br := bufio.NewReader(conn)
				var got []string
				for range 2 {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						break
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					got = append(got, fmt.Sprintf("%d %s", resp.StatusCode, b))
				}
				conn.Close()
				if len(got) != 2 || !strings.HasPrefix(got[0], fmt.Sprint(tt.wantStatus)) || !strings.Contains(got[0], tt.wantBody) || got[1] != "200 ok\n" {
					t.Errorf("code?%s then /ok: answers %q, want %d with %s, then 200 ok", tt.query, got, tt.wantStatus, tt.wantBody)
				}
			}
		})
	}
}

// TestBodyCutShort: a body that ends before its Content-Length, or before
// its last chunk, because the client closed its side, is answered 400
// bad_body (the client may still read), and never reaches the plugin.
func TestBodyCutShort(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("faulty", "faulty", ""))
	for _, tt := range []struct{ name, raw string }{
		{"Content-Length", "POST /faulty/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + strings.Repeat("a", 300)},
		{"chunked", "POST /faulty/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n" + strings.Repeat("a", 300)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn := sendRaw(t, h.ingress, tt.raw, 20*time.Second)
			if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer to a body cut short: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			checkJSONError(t, tt.name, resp, body, http.StatusBadRequest, "bad_body")
		})
	}
}

// TestRequestLineWithoutVersion: a request line without its version
// (HTTP/0.9's "GET /path") is answered 400 as soon as it arrives, not
// after the head's timeout, with the connection left open by the client.
func TestRequestLineWithoutVersion(t *testing.T) {
	h := startHost(t, strings.Replace(baseConfig("2s"), "limits {\n", "limits {\n  read_timeout = \"10m\"\n", 1)+pluginBlock("hello", "hello", ""))
	// Far inside the 10-minute head timeout: an answer at all shows it
	// did not wait for it.
	conn := sendRaw(t, h.ingress, "GET /hello/\r\n", time.Minute)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a request line without its version: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkJSONError(t, "GET /hello/ without a version", resp, body, http.StatusBadRequest, "bad_request")
}
