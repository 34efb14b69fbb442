package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// errorBody is the platform's JSON error shape.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// errorCode returns the code of a JSON error body, or "" when body is not
// one.
func errorCode(body string) string {
	var e errorBody
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		return ""
	}
	return e.Error.Code
}

// waitLog polls the host log until it contains every one of want.
func waitLog(t *testing.T, h *hostProc, d time.Duration, want ...string) {
	t.Helper()
	waitFor(t, d, fmt.Sprintf("host log to contain %q", want), func() bool {
		log := h.log.String()
		for _, w := range want {
			if !strings.Contains(log, w) {
				return false
			}
		}
		return true
	})
}

// readyPlugin waits until plugin name is ready and returns its status.
func readyPlugin(t *testing.T, h *hostProc, name string) pluginStatus {
	t.Helper()
	var st pluginStatus
	waitFor(t, 15*time.Second, name+" to be ready", func() bool {
		st = h.plugins()[name]
		return st.State == "ready" && st.Pid > 0
	})
	return st
}

// result is one request made by the load generator.
type result struct {
	start, end time.Time
	code       int
	retryAfter string
	errCode    string // of a JSON error body
	err        error
}

// results collects load results from many goroutines.
type results struct {
	mu  sync.Mutex
	all []result
}

func (r *results) add(res result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, res)
}

func (r *results) snapshot() []result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]result(nil), r.all...)
}

func (r *results) count(code int) int {
	n := 0
	for _, res := range r.snapshot() {
		if res.err == nil && res.code == code {
			n++
		}
	}
	return n
}

// firstOKAfter returns how long after t0 the first 200 arrived among the
// requests that started after t0. A request that started after a kill
// cannot have been answered by the killed process.
func (r *results) firstOKAfter(t0 time.Time) (time.Duration, bool) {
	var best time.Duration
	found := false
	for _, res := range r.snapshot() {
		if res.err != nil || res.code != http.StatusOK || !res.start.After(t0) {
			continue
		}
		if d := res.end.Sub(t0); !found || d < best {
			best, found = d, true
		}
	}
	return best, found
}

// getOnce makes one GET with c and records what came back.
func getOnce(c *http.Client, url string) result {
	res := result{start: time.Now()}
	resp, err := c.Get(url)
	if err != nil {
		res.err, res.end = err, time.Now()
		return res
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	res.end = time.Now()
	res.code = resp.StatusCode
	res.retryAfter = resp.Header.Get("Retry-After")
	res.err = err
	if res.code != http.StatusOK {
		res.errCode = errorCode(string(b))
	}
	return res
}

// getEvery starts a goroutine, counted in wg, that sends GET url with lc
// every pace until stop is closed, and adds each answer to res.
func getEvery(wg *sync.WaitGroup, stop <-chan struct{}, lc *http.Client, url string, pace time.Duration, res *results) {
	wg.Go(func() {
		tick := time.NewTicker(pace)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				res.add(getOnce(lc, url))
			}
		}
	})
}

func TestKill9PluginUnderLoad(t *testing.T) {
	const (
		workers      = 8
		maxPerWorker = 5000 // bounds the load even if the test stalls
		// initialBackoff is baseConfig's restart.initial_backoff.
		initialBackoff = 100 * time.Millisecond
	)
	h := startHost(t, baseConfig("2s")+pluginBlock("hello", "hello", ""))
	old := readyPlugin(t, h, "hello")

	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	t.Cleanup(tr.CloseIdleConnections)
	lc := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	var load, health results
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range maxPerWorker {
				select {
				case <-stop:
					return
				default:
				}
				load.add(getOnce(lc, h.ingress+"/hello/"))
			}
		}()
	}
	getEvery(&wg, stop, lc, h.ingress+"/healthz", 20*time.Millisecond, &health)
	stopLoad := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	t.Cleanup(stopLoad)

	waitFor(t, 10*time.Second, "load to reach hello", func() bool { return load.count(http.StatusOK) >= 50 })
	killed := time.Now()
	if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", old.Pid, err)
	}
	waitFor(t, 10*time.Second, "hello to serve the load again", func() bool {
		_, ok := load.firstOKAfter(killed)
		return ok
	})
	// Keep the load on for a while after the recovery.
	n := load.count(http.StatusOK)
	waitFor(t, 10*time.Second, "more load after the restart", func() bool { return load.count(http.StatusOK) >= n+50 })
	stopLoad()

	all := load.snapshot()
	codes := map[int]int{}
	var bad []string
	for _, res := range all {
		switch {
		case res.err != nil:
			bad = append(bad, fmt.Sprintf("request at +%v: %v", res.start.Sub(killed), res.err))
		case res.code == http.StatusOK:
		case res.code == http.StatusServiceUnavailable:
			if res.retryAfter == "" || res.errCode == "" {
				bad = append(bad, fmt.Sprintf("503 at +%v: Retry-After %q, error code %q, want both set", res.start.Sub(killed), res.retryAfter, res.errCode))
			}
		default:
			bad = append(bad, fmt.Sprintf("request at +%v: status %d (%s), want 200 or 503", res.start.Sub(killed), res.code, res.errCode))
		}
		if res.err == nil {
			codes[res.code]++
		}
	}
	t.Logf("%d requests: %v", len(all), codes)
	if len(bad) > 0 {
		t.Errorf("%d of %d requests failed; first ones:\n%s", len(bad), len(all), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	if codes[http.StatusServiceUnavailable] == 0 {
		t.Errorf("got no 503 while hello was down, want the requests in the gap answered with 503")
	}
	for _, res := range health.snapshot() {
		if res.err != nil || res.code != http.StatusOK {
			t.Errorf("GET /healthz at +%v = %d, %v; want 200 throughout", res.start.Sub(killed), res.code, res.err)
		}
	}

	back, _ := load.firstOKAfter(killed)
	t.Logf("hello served again %v after kill -9", back)
	if limit := initialBackoff + time.Second; back > limit {
		t.Errorf("hello served again %v after kill -9, want within initial_backoff + 1s = %v", back, limit)
	}
	st := h.plugins()["hello"]
	if st.Pid == old.Pid || st.Pid == 0 {
		t.Errorf("hello pid after restart = %d, want a new pid (old %d)", st.Pid, old.Pid)
	}
	if st.Restarts < 1 {
		t.Errorf("/v1/plugins hello restarts = %d, want >= 1", st.Restarts)
	}
	if v, ok := h.metric(`plughost_plugin_restarts_total{plugin="hello",reason="failure"}`); !ok || v < 1 {
		t.Errorf("plughost_plugin_restarts_total{plugin=\"hello\",reason=\"failure\"} = %v (found %v), want >= 1", v, ok)
	}
	if code, body := h.get(h.ingress + "/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz after the test = %d %s, want 200", code, body)
	}
}

var backoffRE = regexp.MustCompile(`restarting plugin after backoff.*\bbackoff=(\S+)`)

// backoffs returns the restart delays the host logged for plugin.
func backoffs(t *testing.T, log, plugin string) []time.Duration {
	t.Helper()
	var out []time.Duration
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "plugin="+plugin+" ") && !strings.HasSuffix(line, "plugin="+plugin) {
			continue
		}
		m := backoffRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		d, err := time.ParseDuration(m[1])
		if err != nil {
			t.Fatalf("backoff %q in log line %q: %v", m[1], line, err)
		}
		out = append(out, d)
	}
	return out
}

type readyzBody struct {
	Ready    bool           `json:"ready"`
	Draining bool           `json:"draining"`
	Plugins  []pluginStatus `json:"plugins"`
}

func readyz(t *testing.T, h *hostProc) (int, readyzBody) {
	t.Helper()
	code, body := h.get(h.ingress + "/readyz")
	var rb readyzBody
	if err := json.Unmarshal([]byte(body), &rb); err != nil {
		t.Fatalf("decode /readyz: %v: %s", err, body)
	}
	return code, rb
}

func TestNotAPluginFails(t *testing.T) {
	const maxRestarts = 3
	base := baseConfig("2s")
	cfg := strings.Replace(base, "max_restarts    = 5", fmt.Sprintf("max_restarts    = %d", maxRestarts), 1)
	if cfg == base {
		t.Fatal("baseConfig no longer sets max_restarts = 5; update this test")
	}
	for _, tc := range []struct {
		name      string
		required  bool
		wantReady int
	}{
		{"required", true, http.StatusServiceUnavailable},
		{"optional", false, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startHost(t, cfg+
				pluginBlock("hello", "hello", "  required = true")+
				pluginBlock("broken", "crasher", fmt.Sprintf("  required = %v", tc.required)))
			readyPlugin(t, h, "hello")

			var broken pluginStatus
			polls := 0
			waitFor(t, 20*time.Second, "broken to fail", func() bool {
				// hello keeps serving while broken crashes and backs off.
				if code, body := h.get(h.ingress + "/hello/"); code != http.StatusOK {
					t.Fatalf("GET /hello/ while broken restarts = %d %s, want 200", code, body)
				}
				polls++
				broken = h.plugins()["broken"]
				return broken.State == "failed"
			})
			t.Logf("broken failed after %d polls: %+v", polls, broken)
			if broken.Restarts < maxRestarts {
				t.Errorf("broken restarts = %d, want >= max_restarts = %d", broken.Restarts, maxRestarts)
			}
			if broken.LastError == "" {
				t.Errorf("broken last_error is empty, want why it failed")
			}
			if v, ok := h.metric(`plughost_plugin_restarts_total{plugin="broken",reason="failure"}`); !ok || v < maxRestarts {
				t.Errorf("plughost_plugin_restarts_total{plugin=\"broken\",reason=\"failure\"} = %v (found %v), want >= %d", v, ok, maxRestarts)
			}
			if v, ok := h.metric(`plughost_plugin_state{plugin="broken",state="failed"}`); !ok || v != 1 {
				t.Errorf("plughost_plugin_state{plugin=\"broken\",state=\"failed\"} = %v (found %v), want 1", v, ok)
			}

			delays := backoffs(t, h.log.String(), "broken")
			t.Logf("backoffs for broken: %v", delays)
			if len(delays) < 2 {
				t.Fatalf("got %d backoff log lines for broken, want at least 2", len(delays))
			}
			// baseConfig: initial_backoff 100ms, max_backoff 1s; each
			// delay d is jittered into [0.8·d, d], so these ranges do not
			// overlap and a backoff that does not double fails.
			for i, got := range delays {
				d := min(100*time.Millisecond<<i, time.Second)
				if lo := d * 8 / 10; got < lo || got > d {
					t.Errorf("backoff %d = %v, want within [%v, %v] (all: %v)", i, got, lo, d, delays)
				}
			}

			code, rb := readyz(t, h)
			if code != tc.wantReady {
				t.Errorf("GET /readyz = %d %+v, want %d", code, rb, tc.wantReady)
			}
			states := map[string]string{}
			for _, p := range rb.Plugins {
				states[p.Name] = p.State
			}
			if states["broken"] != "failed" || states["hello"] != "ready" {
				t.Errorf("/readyz plugin states = %v, want broken failed and hello ready", states)
			}
			if code, body := h.get(h.ingress + "/hello/"); code != http.StatusOK {
				t.Errorf("GET /hello/ after broken failed = %d %s, want 200", code, body)
			}
			if code, _ := h.get(h.ingress + "/healthz"); code != http.StatusOK {
				t.Errorf("GET /healthz = %d, want 200", code)
			}
		})
	}
}

func TestHandlerPanic(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("faulty", "faulty", ""))
	before := readyPlugin(t, h, "faulty")

	code, body := h.get(h.ingress + "/faulty/panic")
	if code != http.StatusInternalServerError || errorCode(body) == "" {
		t.Fatalf("GET /faulty/panic = %d %s, want 500 with a JSON error", code, body)
	}
	waitLog(t, h, 10*time.Second, "handler panicked", "faulty: deliberate panic", "goroutine ", "main.main.func")

	if code, body := h.get(h.ingress + "/faulty/ok"); code != http.StatusOK {
		t.Errorf("GET /faulty/ok after the panic = %d %s, want 200", code, body)
	}
	after := h.plugins()["faulty"]
	if after.Pid != before.Pid || after.Restarts != before.Restarts {
		t.Errorf("faulty after the panic: pid %d restarts %d, want pid %d restarts %d (no restart)",
			after.Pid, after.Restarts, before.Pid, before.Restarts)
	}
}

func TestPluginOutputReachesHostLog(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("faulty", "faulty", ""))
	msg := fmt.Sprintf("marker-%d", time.Now().UnixNano())
	if code, body := h.get(h.ingress + "/faulty/print?msg=" + msg); code != http.StatusOK {
		t.Fatalf("GET /faulty/print = %d %s, want 200", code, body)
	}
	waitLog(t, h, 10*time.Second, "stdout: "+msg, "stderr: "+msg)
}

func TestUnhealthyPluginRestarted(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("faulty", "faulty", ""))
	old := readyPlugin(t, h, "faulty")

	if code, body := do(t, http.MethodPost, h.ingress+"/faulty/sick", nil, nil); code != http.StatusOK {
		t.Fatalf("POST /faulty/sick = %d %s, want 200", code, body)
	}
	var st pluginStatus
	waitFor(t, 20*time.Second, "faulty to be restarted", func() bool {
		st = h.plugins()["faulty"]
		return st.State == "ready" && st.Pid > 0 && st.Pid != old.Pid
	})
	if st.Restarts < 1 {
		t.Errorf("faulty restarts = %d, want >= 1", st.Restarts)
	}
	if !strings.Contains(st.LastError, "unhealthy") {
		t.Errorf("faulty last_error = %q, want it to say the plugin was unhealthy", st.LastError)
	}
	if code, body := h.get(h.ingress + "/faulty/ok"); code != http.StatusOK {
		t.Errorf("GET /faulty/ok after the restart = %d %s, want 200", code, body)
	}
}

func TestProtocolMismatch(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("old", "badproto", "  required = false"))
	var st pluginStatus
	waitFor(t, 15*time.Second, "badproto to be refused", func() bool {
		st = h.plugins()["old"]
		return (st.State == "backoff" || st.State == "failed") && st.LastError != ""
	})
	t.Logf("badproto refused: %s", st.LastError)
	if !strings.Contains(st.LastError, "plugin speaks plughost plugin protocol 1") || !strings.Contains(st.LastError, "host speaks protocol 2") {
		t.Errorf("badproto last_error = %q, want it to name the plugin's version 1 and the host's version 2", st.LastError)
	}
	if code, body := h.get(h.ingress + "/old/"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /old/ = %d %s, want 503", code, body)
	}
}

// readEvent reads one server-sent event (up to its blank line).
func readEvent(r *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := r.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\n" {
			return b.String(), nil
		}
	}
}

func TestStreamingThroughHost(t *testing.T) {
	h := startHost(t, baseConfig("2s")+
		pluginBlock("faulty", "faulty", "")+
		pluginBlock("gate", "gate", ""))
	readyPlugin(t, h, "faulty")
	readyPlugin(t, h, "gate")

	t.Run("events", func(t *testing.T) {
		req, err := http.NewRequestWithContext(ctxTimeout(t, 10*time.Second), http.MethodGet, h.ingress+"/faulty/stream?n=5", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET /faulty/stream: %v", err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("GET /faulty/stream = %d %q, want 200 text/event-stream", resp.StatusCode, ct)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("read stream: %v", err)
		}
		want := "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n"
		if string(b) != want {
			t.Errorf("stream body = %q, want %q", b, want)
		}
	})

	// gate holds its stream open after the first event until it is
	// released, so the first event can only arrive before the end if the
	// host forwards it as it comes.
	t.Run("incremental", func(t *testing.T) {
		req, err := http.NewRequestWithContext(ctxTimeout(t, 15*time.Second), http.MethodGet, h.ingress+"/gate/stream", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET /gate/stream: %v (the head must arrive before the stream ends)", err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("GET /gate/stream = %d %q, want 200 text/event-stream", resp.StatusCode, ct)
		}
		r := bufio.NewReader(resp.Body)
		first, err := readEvent(r)
		if err != nil || first != "data: first\n\n" {
			t.Fatalf("first event = %q, %v; want %q while the stream is held open", first, err, "data: first\n\n")
		}
		if code, body := do(t, http.MethodPost, h.ingress+"/gate/release", nil, nil); code != http.StatusOK {
			t.Fatalf("POST /gate/release = %d %s, want 200", code, body)
		}
		rest, err := io.ReadAll(r)
		if err != nil || string(rest) != "data: last\n\n" {
			t.Errorf("rest of the stream = %q, %v; want %q", rest, err, "data: last\n\n")
		}
	})
}
