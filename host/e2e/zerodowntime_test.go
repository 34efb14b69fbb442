package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// loadTarget is what one steadyLoad worker sends, again and again.
type loadTarget struct {
	method, path string
	// post, when set, makes the i-th request a wallet POST with this
	// body and Idempotency-Key.
	post func(worker, i int) (key, body string)
}

var (
	helloLoad       = loadTarget{method: http.MethodGet, path: "/hello/"}
	walletReadLoad  = loadTarget{method: http.MethodGet, path: "/wallet/v1/supply"}
	walletIssueLoad = loadTarget{method: http.MethodPost, path: "/wallet/v1/issue", post: func(w, i int) (string, string) {
		return fmt.Sprintf("steady-%d-%d", w, i), `{"to":"steady","amount":1}`
	}}
)

// loadSample is one answered request: when it ended and how long it took.
type loadSample struct {
	end time.Time
	lat time.Duration
}

// steadyLoad is a closed loop of requests from one goroutine per target
// to the ingress on 127.0.0.1, each goroutine on its own keep-alive
// connection. It is bounded: each goroutine sends at most maxPerWorker
// requests and none after its deadline. It counts every answer by
// request and status; anything but a 2xx, transport errors included, is
// a failure.
type steadyLoad struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	counts   map[string]int // "GET /hello/ 200"
	failed   int
	failures []string // the first few
	samples  []loadSample
}

func startSteadyLoad(tb testing.TB, ingress string, targets []loadTarget, maxPerWorker int, d time.Duration) *steadyLoad {
	tb.Helper()
	l := &steadyLoad{stop: make(chan struct{}), counts: map[string]int{}}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	for w, tg := range targets {
		tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
		cl := &http.Client{Transport: tr, Timeout: 30 * time.Second}
		l.wg.Go(func() {
			defer tr.CloseIdleConnections()
			for i := range maxPerWorker {
				select {
				case <-l.stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				l.one(ctx, cl, ingress, tg, w, i)
			}
		})
	}
	tb.Cleanup(func() {
		l.halt()
		cancel()
	})
	return l
}

// one sends target's i-th request and records its outcome.
func (l *steadyLoad) one(ctx context.Context, cl *http.Client, ingress string, tg loadTarget, w, i int) {
	var body io.Reader
	var key string
	if tg.post != nil {
		var b string
		key, b = tg.post(w, i)
		body = strings.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, tg.method, ingress+tg.path, body)
	if err != nil {
		l.record(tg, 0, err.Error(), time.Now(), 0)
		return
	}
	if key != "" {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
	}
	start := time.Now()
	resp, err := cl.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return // the load's own deadline, not an answer
		}
		l.record(tg, 0, err.Error(), time.Now(), time.Since(start))
		return
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	end := time.Now()
	msg := strings.TrimSpace(string(b))
	if err != nil {
		msg = "read body: " + err.Error()
		resp.StatusCode = 0
	}
	l.record(tg, resp.StatusCode, msg, end, end.Sub(start))
}

func (l *steadyLoad) record(tg loadTarget, code int, msg string, end time.Time, lat time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts[fmt.Sprintf("%s %s %d", tg.method, tg.path, code)]++
	if code < 200 || code > 299 {
		l.failed++
		if len(l.failures) < 5 {
			l.failures = append(l.failures, fmt.Sprintf("%s %s at %s = %d %s", tg.method, tg.path, end.Format("15:04:05.000"), code, msg))
		}
		return
	}
	l.samples = append(l.samples, loadSample{end: end, lat: lat})
}

// halt stops the load and waits for its goroutines; safe to call again.
func (l *steadyLoad) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// answered returns how many requests got a 2xx so far.
func (l *steadyLoad) answered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.samples)
}

// check fails t for every request that did not get a 2xx.
func (l *steadyLoad) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("steady load: %d answered 2xx, %d failed; by request and status: %v", len(l.samples), l.failed, l.counts)
	if l.failed > 0 {
		t.Errorf("%d requests under the steady load did not get a 2xx, want 0; the first: %q", l.failed, l.failures)
	}
}

// latencies returns the latencies of the requests that ended within
// [from, to), sorted.
func (l *steadyLoad) latencies(from, to time.Time) []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Duration
	for _, s := range l.samples {
		if !s.end.Before(from) && s.end.Before(to) {
			out = append(out, s.lat)
		}
	}
	slices.Sort(out)
	return out
}

// copyPlugins copies the named plugin binaries from the test build into
// a new plugin_dir, so that a test may rewrite them.
func copyPlugins(t testing.TB, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		installBinary(t, filepath.Join(bins.plugins, n), filepath.Join(dir, n), nil)
	}
	return dir
}

// installBinary writes src's bytes, then extra, to dst through a rename,
// as an operator installs a new build: a process running the old file
// keeps it. Extra bytes after an ELF binary change its sha256, not what
// it runs.
func installBinary(t testing.TB, src, dst string, extra []byte) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, append(b, extra...), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// zeroDowntimeConfig is baseConfig with hello and the wallet, the
// binaries taken from pluginDir.
func zeroDowntimeConfig(pluginDir, greeting, ttl string) string {
	base := strings.Replace(baseConfig("5s"), fmt.Sprintf("plugin_dir     = %q", bins.plugins), fmt.Sprintf("plugin_dir     = %q", pluginDir), 1)
	return base + helloWith(greeting) + walletBlock(fmt.Sprintf("    idempotency_ttl = %q", ttl))
}

// upgrade posts an upgrade of name and waits until a new process serves
// it, or until its last_error mentions wantErr when that is set.
func (h *hostProc) upgrade(name, wantErr string) pluginStatus {
	h.t.Helper()
	before := h.plugins()[name]
	if code, body := do(h.t, http.MethodPost, h.admin+"/v1/plugins/"+name+"/upgrade", nil, nil); code != http.StatusAccepted {
		h.t.Fatalf("POST /v1/plugins/%s/upgrade = %d %s, want 202", name, code, body)
	}
	var st pluginStatus
	waitFor(h.t, 30*time.Second, name+" to be upgraded", func() bool {
		st = h.plugins()[name]
		if wantErr != "" {
			return st.State == "ready" && st.LastError != before.LastError && strings.Contains(st.LastError, wantErr)
		}
		return st.State == "ready" && st.Pid != before.Pid
	})
	return st
}

// TestReloadZeroDowntime checks that replacing plugins under a steady
// load fails no request: a SIGHUP that changes hello's and the wallet's
// config, an upgrade of each to a rebuilt binary, and replacements that
// fail (a config hello's Configure refuses, a binary that is not a
// plugin), which leave the running process serving. hello runs its new
// process beside the old one; the wallet, single-instance, is drained
// first while its requests wait.
func TestReloadZeroDowntime(t *testing.T) {
	dir := copyPlugins(t, "hello", "wallet")
	h := startHost(t, zeroDowntimeConfig(dir, "one", "24h"))
	readyPlugin(t, h, "hello")
	readyPlugin(t, h, "wallet")
	load := startSteadyLoad(t, h.ingress, []loadTarget{helloLoad, helloLoad, helloLoad, walletReadLoad, walletIssueLoad, walletIssueLoad}, 50000, 2*time.Minute)
	warm := func(what string) {
		t.Helper()
		n := load.answered()
		waitFor(t, 10*time.Second, "requests to be answered "+what, func() bool { return load.answered() > n+50 })
	}
	warm("before the first reload")
	before := h.plugins()

	// 1. SIGHUP with a changed config for both.
	h.reload(zeroDowntimeConfig(dir, "two", "12h"), "config reloaded")
	after := h.plugins()
	for _, name := range []string{"hello", "wallet"} {
		if after[name].Pid == before[name].Pid || after[name].State != "ready" {
			t.Errorf("%s after a reload that changed its config = %+v, want a new ready process (was pid %d)", name, after[name], before[name].Pid)
		}
		if !waitGone(before[name].Pid, 10*time.Second) {
			t.Errorf("%s's old process %d still alive 10s after the reload", name, before[name].Pid)
		}
	}
	if code, body := h.greeting(); code != http.StatusOK || !strings.Contains(body, `"greeting":"two"`) {
		t.Errorf("GET /hello/ after the reload = %d %s, want greeting two", code, body)
	}
	warm("after the reload")

	// 2. An upgrade of each to a rebuilt binary; a SIGHUP after it, with
	// the same config, replaces nothing more.
	for _, name := range []string{"hello", "wallet"} {
		installBinary(t, filepath.Join(bins.plugins, name), filepath.Join(dir, name), []byte("\x00rebuilt"))
		h.upgrade(name, "")
		for reason, want := range map[string]float64{"upgrade": 1, "failure": 0} {
			series := fmt.Sprintf(`plughost_plugin_restarts_total{plugin=%q,reason=%q}`, name, reason)
			if v, ok := h.metric(series); !ok || v != want {
				t.Errorf("%s after an upgrade = %v (found %v), want %v: an upgrade is no failure to alert on", series, v, ok, want)
			}
		}
	}
	upgraded := h.plugins()
	h.reload(zeroDowntimeConfig(dir, "two", "12h"), "config reloaded")
	for name, st := range h.plugins() {
		if st.Pid != upgraded[name].Pid {
			t.Errorf("%s pid after a reload that changed nothing = %d, want %d unchanged since the upgrade", name, st.Pid, upgraded[name].Pid)
		}
	}
	warm("after the upgrades")

	// 3. Replacements that fail leave the plugin served. hello: its
	// Configure refuses an empty greeting; the old process stays.
	pid := h.plugins()["hello"].Pid
	h.reload(zeroDowntimeConfig(dir, "", "12h"), "plugins refused their new config")
	if st := h.plugins()["hello"]; st.Pid != pid || !strings.Contains(st.LastError, "greeting") {
		t.Errorf("hello after a reload its Configure refused = %+v, want pid %d still serving and last_error about the greeting", st, pid)
	}
	if code, body := h.greeting(); code != http.StatusOK || !strings.Contains(body, `"greeting":"two"`) {
		t.Errorf("GET /hello/ after a refused reload = %d %s, want greeting two", code, body)
	}
	// Binaries that are not plugins: each fails before the running
	// process is touched (the wallet's at its Describe-only launch), so
	// both keep their processes.
	h.reload(zeroDowntimeConfig(dir, "two", "12h"), "config reloaded")
	for _, name := range []string{"hello", "wallet"} {
		pid := h.plugins()[name].Pid
		installBinary(t, filepath.Join(bins.plugins, "crasher"), filepath.Join(dir, name), nil)
		st := h.upgrade(name, "replace plugin")
		if name == "hello" && st.Pid != pid {
			t.Errorf("hello after an upgrade to a binary that is not a plugin = %+v, want pid %d still serving", st, pid)
		}
	}
	warm("after the failed upgrades")
	if code, body := h.greeting(); code != http.StatusOK || !strings.Contains(body, `"greeting":"two"`) {
		t.Errorf("GET /hello/ after a failed upgrade = %d %s, want greeting two", code, body)
	}
	load.halt()
	load.check(t)
}

// TestSingleInstanceUpgradeFallsBack upgrades the wallet, a
// single-instance plugin, to a build that describes itself but refuses its
// config: the host must stop the running wallet before starting the new
// one, and then start the previous binary again, although the file at the
// wallet's path is now the new build. The ledger is intact afterwards.
func TestSingleInstanceUpgradeFallsBack(t *testing.T) {
	dir := copyPlugins(t, "hello", "wallet")
	h := startHost(t, zeroDowntimeConfig(dir, "one", "24h"))
	before := readyPlugin(t, h, "wallet")
	hdr := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"fallback-1"}}
	if code, body := do(t, http.MethodPost, h.ingress+"/wallet/v1/issue", strings.NewReader(`{"to":"alice","amount":100}`), hdr); code != http.StatusOK {
		t.Fatalf("POST /wallet/v1/issue = %d %s, want 200", code, body)
	}
	installBinary(t, filepath.Join(bins.plugins, "refuser"), filepath.Join(dir, "wallet"), nil)
	st := h.upgrade("wallet", "the previous process is started again")
	if st.Pid == before.Pid || st.State != "ready" {
		t.Errorf("wallet after a failed upgrade = %+v, want a new process of the previous binary, ready", st)
	}
	if code, body := h.get(h.ingress + "/wallet/v1/accounts/alice"); code != http.StatusOK || !strings.Contains(body, `"balance":100`) {
		t.Errorf("GET /wallet/v1/accounts/alice after a failed upgrade = %d %s, want the balance of 100", code, body)
	}
}
