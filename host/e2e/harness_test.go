package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plughost/plughost/host/internal/testbin"
)

// bins holds the binaries TestMain built.
var bins struct {
	dir     string // holds plughost
	plugins string // holds every plugin, as plugin_dir
}

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "plughost-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bins.dir = dir
	bins.plugins = filepath.Join(dir, "plugins")
	if err := build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build:", err)
		return 1
	}
	return m.Run()
}

// build compiles the host, every plugin in plugins/, the test plugins,
// the catalog's envdump and BenchmarkPeers's server.
func build(dir string) error {
	root, err := filepath.Abs("../..")
	if err != nil {
		return err
	}
	targets := map[string]string{filepath.Join(dir, "plughost"): "./host"}
	shipped, err := os.ReadDir(filepath.Join(root, "plugins"))
	if err != nil {
		return err
	}
	for _, e := range shipped {
		if e.IsDir() {
			targets[filepath.Join(dir, "plugins", e.Name())] = "./plugins/" + e.Name()
		}
	}
	// Every directory in testdata/plugins is a test plugin.
	testPlugins, err := os.ReadDir(filepath.Join(root, "host/e2e/testdata/plugins"))
	if err != nil {
		return err
	}
	for _, e := range testPlugins {
		if e.IsDir() {
			targets[filepath.Join(dir, "plugins", e.Name())] = "./host/e2e/testdata/plugins/" + e.Name()
		}
	}
	targets[filepath.Join(dir, "plugins", "envdump")] = "./host/catalog/testdata/envdump"
	targets[filepath.Join(dir, "peerserver")] = "./host/e2e/testdata/peerserver"
	for out, pkg := range targets {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	return nil
}

// hostProc is a running plughost process.
type hostProc struct {
	t       *testing.T
	cmd     *exec.Cmd
	cfgPath string
	dir     string
	log     *testbin.SyncBuffer
	ingress string // base URL
	admin   string // base URL
	exited  chan struct{}
	exitErr error
}

// baseConfig returns the config top used by most tests; plugin blocks are
// appended by the caller.
//
// Its health checks are not tight: tests count restarts exactly, and a
// plugin that missed three checks in a row (as it could with a 150ms
// timeout on a loaded machine) would be restarted behind their backs.
func baseConfig(drain string) string {
	return fmt.Sprintf(`
listen         = "127.0.0.1:0"
data_dir       = "./data"
plugin_dir     = %q
drain_deadline = %q
admin {
  listen = "127.0.0.1:0"
}
limits {
  max_body_bytes  = 4096
  request_timeout = "5s"
}
restart {
  initial_backoff = "100ms"
  max_backoff     = "1s"
  max_restarts    = 5
  window          = "1m"
}
health {
  interval = "1s"
  timeout  = "1s"
  failures = 3
}
`, bins.plugins, drain)
}

var listenRE = regexp.MustCompile(`plughost running: .*listen=(\S+) admin=(\S+)`)

// tokenConfig writes token to a file only its owner can read and
// returns baseConfig(drain) with admin.token_file set to it, and the
// file's path.
func tokenConfig(t *testing.T, drain, token string) (cfg, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return strings.Replace(baseConfig(drain), "admin {\n", "admin {\n  token_file = \""+path+"\"\n", 1), path
}

// startHost writes cfg to a file and runs `plughost run` on it until the
// host reports that it is serving. The host is killed on cleanup.
func startHost(t *testing.T, cfg string) *hostProc {
	t.Helper()
	return waitServing(t, launchHost(t, cfg))
}

// startHostInGroup is startHost with the host leading a process group of
// its own, which its plugins join, so that a test can signal the group
// (signalGroup) as systemd and timeout(1) do, without signalling itself.
func startHostInGroup(t *testing.T, cfg string) *hostProc {
	t.Helper()
	return waitServing(t, launchHostWith(t, cfg, &syscall.SysProcAttr{Setpgid: true}))
}

// waitServing waits until h reports that it is serving.
func waitServing(t *testing.T, h *hostProc) *hostProc {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := listenRE.FindStringSubmatch(h.log.String()); m != nil {
			h.ingress, h.admin = "http://"+m[1], "http://"+m[2]
			return h
		}
		select {
		case <-h.exited:
			t.Fatalf("plughost exited before serving: %v\n%s", h.exitErr, h.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("plughost did not start serving in time:\n%s", h.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// launchHost starts `plughost run` without waiting for it.
func launchHost(t *testing.T, cfg string, args ...string) *hostProc {
	t.Helper()
	return launchHostWith(t, cfg, nil, args...)
}

// launchHostWith is launchHost with the host's process attributes.
func launchHostWith(t *testing.T, cfg string, attr *syscall.SysProcAttr, args ...string) *hostProc {
	t.Helper()
	return launchHostVia(t, cfg, attr, nil, args...)
}

// launchHostVia is launchHostWith with the host run through wrapper, a
// command that sets something up and then execs the rest of its
// arguments (the host keeps the wrapper's pid), such as sh -c 'ulimit
// ...; exec "$@"'.
func launchHostVia(t *testing.T, cfg string, attr *syscall.SysProcAttr, wrapper []string, args ...string) *hostProc {
	t.Helper()
	return launchHostCmd(t, cfg, func(bin string, run []string) *exec.Cmd {
		argv := append(append(slices.Clone(wrapper), bin), append(run, args...)...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.SysProcAttr = attr
		return cmd
	})
}

// launchHostCmd starts the command that mk returns for the host binary
// and its `run` arguments, without waiting for it. The command must
// become the host process (exec it), so that signals and kills reach
// the host.
func launchHostCmd(t *testing.T, cfg string, mk func(bin string, run []string) *exec.Cmd) *hostProc {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.hcl")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	h := &hostProc{t: t, cfgPath: path, dir: dir, log: &testbin.SyncBuffer{}, exited: make(chan struct{})}
	h.cmd = mk(filepath.Join(bins.dir, "plughost"), []string{"run", "-config", path, "-log-level", "debug"})
	h.cmd.Stdout = h.log
	h.cmd.Stderr = h.log
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		h.exitErr = h.cmd.Wait()
		close(h.exited)
	}()
	t.Cleanup(func() {
		pids := h.pluginPidsFromLog()
		_ = h.cmd.Process.Kill()
		<-h.exited
		// The plugins die with the host; make sure, so no test leaks one.
		for _, pid := range pids {
			waitGone(pid, 5*time.Second)
		}
		if t.Failed() {
			t.Logf("plughost log:\n%s", h.log.String())
		}
	})
	return h
}

var readyPidRE = regexp.MustCompile(`plugin ready: plugin=\S+ pid=(\d+)`)

// pluginPidsFromLog lists every plugin pid the host has reported.
func (h *hostProc) pluginPidsFromLog() []int {
	var pids []int
	for _, m := range readyPidRE.FindAllStringSubmatch(h.log.String(), -1) {
		if pid, err := strconv.Atoi(m[1]); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// signal sends sig to the host.
func (h *hostProc) signal(sig os.Signal) {
	h.t.Helper()
	if err := h.cmd.Process.Signal(sig); err != nil {
		h.t.Fatalf("signal %v: %v", sig, err)
	}
}

// signalGroup sends sig to the host's process group: the host and its
// plugins. The host must have been started by startHostInGroup.
func (h *hostProc) signalGroup(sig syscall.Signal) {
	h.t.Helper()
	if err := syscall.Kill(-h.cmd.Process.Pid, sig); err != nil {
		h.t.Fatalf("signal %v to process group %d: %v", sig, h.cmd.Process.Pid, err)
	}
}

// waitExit waits up to d for the host to exit and returns its exit code.
func (h *hostProc) waitExit(d time.Duration) (int, bool) {
	select {
	case <-h.exited:
		return h.cmd.ProcessState.ExitCode(), true
	case <-time.After(d):
		return 0, false
	}
}

// pluginStatus is one entry of GET /v1/plugins.
type pluginStatus struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	Pid       int    `json:"pid"`
	Restarts  int    `json:"restarts"`
	Version   string `json:"version"`
	LastError string `json:"last_error"`
	// DataPlaneConns is how many data-plane connections carry the
	// plugin's requests.
	DataPlaneConns int `json:"data_plane_conns"`
}

func (h *hostProc) plugins() map[string]pluginStatus {
	h.t.Helper()
	var list []pluginStatus
	code, body := h.get(h.admin + "/v1/plugins")
	if code != http.StatusOK {
		h.t.Fatalf("GET /v1/plugins = %d %s", code, body)
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		h.t.Fatalf("decode /v1/plugins: %v: %s", err, body)
	}
	out := map[string]pluginStatus{}
	for _, p := range list {
		out[p.Name] = p
	}
	return out
}

// waitFor polls cond every 20ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var client = &http.Client{Timeout: 30 * time.Second}

// get returns the status and body of a GET.
func (h *hostProc) get(url string) (int, string) {
	h.t.Helper()
	return do(h.t, http.MethodGet, url, nil, nil)
}

func do(t *testing.T, method, url string, body io.Reader, hdr http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	code, _, b := send(t, req)
	return code, b
}

// send sends req with the shared client and returns the answer, its body
// read to its end or to the first error.
func send(t *testing.T, req *http.Request) (int, http.Header, string) {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// metric returns the value of the first exposition line that starts with
// series, e.g. `plughost_plugin_restarts_total{plugin="hello",reason="failure"}`.
func (h *hostProc) metric(series string) (float64, bool) {
	h.t.Helper()
	_, body := h.get(h.admin + "/metrics")
	return parseMetric(body, series)
}

// parseMetric returns the value of the first line of the exposition body
// that starts with series.
func parseMetric(body, series string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// alive reports whether pid is a live (non-zombie) process.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	if runtime.GOOS != "linux" {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for alive(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// pluginBlock returns a plugin block for config.
func pluginBlock(name, path, extra string) string {
	return fmt.Sprintf("plugin %q {\n  path = %q\n%s\n}\n", name, path, extra)
}

// ctxTimeout is a helper for per-request deadlines in tests.
func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
