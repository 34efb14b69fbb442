package supervisor_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/host/internal/testbin"
	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// bin is the directory TestMain builds the plugin binaries into.
var bin string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testbin.BuildFirst(m, "supervisor", &bin,
		"./plugins/hello",
		"./host/e2e/testdata/plugins/crasher",
		"./host/e2e/testdata/plugins/faulty",
		"./host/e2e/testdata/plugins/frail",
	))
}

// recorder remembers the states a plugin passed through, as OnChange saw
// them.
type recorder struct {
	p atomic.Pointer[supervisor.Process]

	mu     sync.Mutex
	states []supervisor.State
	calls  int
}

func (r *recorder) onChange() {
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	p := r.p.Load()
	if p == nil {
		return // Start has not returned yet
	}
	st := p.Status().State
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.states); n == 0 || r.states[n-1] != st {
		r.states = append(r.states, st)
	}
}

// since returns the states recorded from index i on.
func (r *recorder) since(i int) []supervisor.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.states[min(i, len(r.states)):])
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.states)
}

// fixture is one supervised plugin and what the test observes it with.
type fixture struct {
	p       *supervisor.Process
	rec     *recorder
	metrics *metrics.Host
	log     *testbin.SyncBuffer
}

// testPolicy restarts fast and health-checks gently, so that a loaded
// machine does not fail health checks by accident.
func testPolicy() supervisor.Policy {
	return supervisor.Policy{
		InitialBackoff: 10 * time.Millisecond,
		MaxBackoff:     100 * time.Millisecond,
		MaxRestarts:    5,
		Window:         time.Minute,
		StableAfter:    time.Minute,
		HealthInterval: 500 * time.Millisecond,
		HealthTimeout:  10 * time.Second,
		HealthFailures: 3,
		StartTimeout:   30 * time.Second,
		Limits:         &pluginv1.Limits{MaxBodyBytes: 1 << 20, RequestTimeoutMs: 5000},
	}
}

// staticConfig is a Decode that always returns js.
func staticConfig(js string) func(*pluginv1.Schema) ([]byte, error) {
	return func(*pluginv1.Schema) ([]byte, error) { return []byte(js), nil }
}

func spec(t *testing.T, name, binary, config string) supervisor.Spec {
	t.Helper()
	return supervisor.Spec{
		Name:     name,
		Path:     filepath.Join(bin, binary),
		Mount:    "/" + name,
		Required: true,
		DataDir:  filepath.Join(t.TempDir(), name),
		Decode:   staticConfig(config),
	}
}

func helloSpec(t *testing.T) supervisor.Spec {
	t.Helper()
	return spec(t, "hello", "hello", `{"greeting":"hi"}`)
}

func options(t *testing.T, pol supervisor.Policy) (supervisor.Options, *recorder, *testbin.SyncBuffer) {
	t.Helper()
	log := &testbin.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("supervisor log:\n%s", log.String())
		}
	})
	rec := &recorder{}
	return supervisor.Options{
		Logger:   hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: log}),
		Metrics:  metrics.New(),
		Policy:   pol,
		OnChange: rec.onChange,
	}, rec, log
}

// start supervises s and stops it when the test ends.
func start(t *testing.T, s supervisor.Spec, pol supervisor.Policy) *fixture {
	t.Helper()
	return startWith(t, s, pol, false)
}

// startWith is start, with Options.RetryConfigure set to retry (the
// host sets it).
func startWith(t *testing.T, s supervisor.Spec, pol supervisor.Policy, retry bool) *fixture {
	t.Helper()
	opts, rec, log := options(t, pol)
	opts.RetryConfigure = retry
	p, err := supervisor.Start(t.Context(), s, opts)
	if err != nil {
		t.Fatalf("Start(%s) = %v, want nil", s.Name, err)
	}
	t.Cleanup(func() { p.Stop(time.Now().Add(10 * time.Second)) })
	rec.p.Store(p)
	return &fixture{p: p, rec: rec, metrics: opts.Metrics, log: log}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitState(t *testing.T, p *supervisor.Process, want supervisor.State) supervisor.Status {
	t.Helper()
	var st supervisor.Status
	waitFor(t, 30*time.Second, fmt.Sprintf("%s to be %s", p.Name(), want), func() bool {
		st = p.Status()
		return st.State == want
	})
	return st
}

func waitReady(t *testing.T, p *supervisor.Process) supervisor.Status {
	t.Helper()
	waitFor(t, 30*time.Second, p.Name()+" to be ready", p.Ready)
	return p.Status()
}

// alive reports whether a process with this pid exists (a zombie counts).
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func waitGone(t *testing.T, pid int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("process %d to be gone", pid), func() bool { return !alive(pid) })
}

// children returns the pids of this process's children, zombies included.
func children(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc to list child processes: %v", err)
	}
	self := strconv.Itoa(os.Getpid())
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == self {
			out = append(out, pid)
		}
	}
	return out
}

func gauge(t *testing.T, m *metrics.Host, state supervisor.State, plugin string) float64 {
	t.Helper()
	return testutil.ToFloat64(m.PluginState.WithLabelValues(plugin, string(state)))
}

// restarts returns plughost_plugin_restarts_total for plugin by reason,
// and fails the test when a reason in metrics.RestartReasons has no series.
func restarts(t *testing.T, m *metrics.Host, plugin string) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "plughost_plugin_restarts_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range s.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["plugin"] == plugin {
				out[labels["reason"]] = s.GetCounter().GetValue()
			}
		}
	}
	for _, r := range metrics.RestartReasons {
		if _, ok := out[r]; !ok {
			t.Errorf("plughost_plugin_restarts_total{plugin=%q, reason=%q} is not exported", plugin, r)
		}
	}
	return out
}

// sleepsServed reads hello's own hello_sleeps_total through Families.
func sleepsServed(t *testing.T, p *supervisor.Process) float64 {
	t.Helper()
	raw, err := p.Families(t.Context())
	if err != nil {
		return -1
	}
	for _, b := range raw {
		var mf dto.MetricFamily
		if err := proto.Unmarshal(b, &mf); err != nil {
			t.Fatalf("decode metric family: %v", err)
		}
		if mf.GetName() == "hello_sleeps_total" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

func TestStartReady(t *testing.T) {
	s := helloSpec(t)
	f := start(t, s, testPolicy())
	st := waitReady(t, f.p)

	want := supervisor.Status{Name: "hello", State: supervisor.StateReady, Pid: st.Pid, Started: st.Started, Version: "0.1.0", Required: true, Mount: "/hello",
		DataPlaneConns: min(runtime.GOMAXPROCS(0), 16)} // one per host CPU
	if st.Started.IsZero() || st.Started.After(time.Now()) {
		t.Errorf("Status().Started = %v, want when the process was launched", st.Started)
	}
	if st != want {
		t.Errorf("Status() = %+v, want %+v", st, want)
	}
	if st.Pid <= 0 || !alive(st.Pid) {
		t.Errorf("Status().Pid = %d, want a running process", st.Pid)
	}
	if f.p.Name() != "hello" || f.p.Spec().Mount != "/hello" {
		t.Errorf("Name(), Spec().Mount = %q, %q, want hello, /hello", f.p.Name(), f.p.Spec().Mount)
	}
	if m := f.p.Manifest(); m.GetName() != "hello" || len(m.GetRoutes()) != 2 {
		t.Errorf("Manifest() = %v, want hello with 2 routes", m)
	}
	if fi, err := os.Stat(s.DataDir); err != nil || !fi.IsDir() {
		t.Errorf("data dir %s: %v, want a directory created before Configure", s.DataDir, err)
	}

	c := f.p.Endpoint()
	if c == nil {
		t.Fatal("Conn() = nil for a ready plugin")
	}
	if c.Aborted() {
		t.Error("Conn().Aborted() = true for a running plugin")
	}
	if code, body, err := do(t.Context(), c, "GET", "/", ""); err != nil || code != 200 || !strings.Contains(string(body), `"greeting":"hi"`) {
		t.Errorf("GET / = %d %s, %v, want 200 with the configured greeting", code, body, err)
	}
	if got := sleepsServed(t, f.p); got != 0 {
		t.Errorf("hello_sleeps_total from Families() = %v, want 0", got)
	}

	if got := testutil.ToFloat64(f.metrics.PluginUp.WithLabelValues("hello")); got != 1 {
		t.Errorf("plughost_plugin_up{plugin=hello} = %v, want 1", got)
	}
	for _, s := range supervisor.States {
		want := 0.0
		if s == supervisor.StateReady {
			want = 1
		}
		if got := gauge(t, f.metrics, s, "hello"); got != want {
			t.Errorf("plughost_plugin_state{state=%q} = %v, want %v", s, got, want)
		}
	}
	f.rec.mu.Lock()
	calls := f.rec.calls
	f.rec.mu.Unlock()
	if calls == 0 {
		t.Error("OnChange was never called")
	}
}

func TestRestartAfterKill(t *testing.T) {
	f := start(t, helloSpec(t), testPolicy())
	old := waitReady(t, f.p)
	mark := f.rec.len()

	if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", old.Pid, err)
	}
	var st supervisor.Status
	waitFor(t, 30*time.Second, "hello to come back with a new process", func() bool {
		st = f.p.Status()
		return st.State == supervisor.StateReady && st.Pid != old.Pid && f.p.Ready()
	})
	if st.Restarts != 1 || st.RestartsInWindow != 1 {
		t.Errorf("Status().Restarts, RestartsInWindow = %d, %d after one crash, want 1, 1", st.Restarts, st.RestartsInWindow)
	}
	if !st.Started.After(old.Started) {
		t.Errorf("Status().Started = %v after a restart, want after the first process's %v", st.Started, old.Started)
	}
	if !strings.Contains(st.LastError, "exited") {
		t.Errorf("Status().LastError = %q, want why it went down (exited)", st.LastError)
	}
	states := f.rec.since(mark)
	i := slices.Index(states, supervisor.StateBackoff)
	if i < 0 || !slices.Contains(states[i:], supervisor.StateStarting) || states[len(states)-1] != supervisor.StateReady {
		t.Errorf("states after the crash = %v, want backoff, then starting, ending ready", states)
	}
	if got, want := restarts(t, f.metrics, "hello"), (map[string]float64{"failure": 1, "operator": 0, "upgrade": 0}); !maps.Equal(got, want) {
		t.Errorf("plughost_plugin_restarts_total{plugin=hello} by reason = %v after a crash, want %v", got, want)
	}
	if got := testutil.ToFloat64(f.metrics.PluginHungKills.WithLabelValues("hello")); got != 0 {
		t.Errorf("plughost_plugin_hung_kills_total{plugin=hello} = %v after a crash, want 0: only failed health checks kill a process as hung", got)
	}
	waitGone(t, old.Pid)
	if code, body, err := do(t.Context(), f.p.Endpoint(), "GET", "/", ""); err != nil || code != 200 {
		t.Errorf("GET / on the new process = %d %s, %v, want 200", code, body, err)
	}
}

func TestOperatorRestart(t *testing.T) {
	f := start(t, helloSpec(t), testPolicy())
	old := waitReady(t, f.p)
	oldConn := f.p.Endpoint()

	f.p.Restart(time.Now().Add(10 * time.Second))
	var st supervisor.Status
	waitFor(t, 30*time.Second, "hello to restart", func() bool {
		st = f.p.Status()
		return st.State == supervisor.StateReady && st.Pid != old.Pid && f.p.Ready()
	})
	if st.Restarts != 1 || st.RestartsInWindow != 0 || st.LastError != "" {
		t.Errorf("Status() after Restart = %+v, want restarts 1, none in the window (an operator's restart spends no budget) and no error", st)
	}
	if got, want := restarts(t, f.metrics, "hello"), (map[string]float64{"failure": 0, "operator": 1, "upgrade": 0}); !maps.Equal(got, want) {
		t.Errorf("plughost_plugin_restarts_total{plugin=hello} by reason = %v after an operator's restart, want %v: alerts count failures only", got, want)
	}
	if oldConn.Aborted() {
		t.Error("old Conn().Aborted() = true after a drain with nothing in flight")
	}
	waitGone(t, old.Pid)
}

func TestCrasherFails(t *testing.T) {
	pol := testPolicy()
	pol.MaxRestarts = 2
	f := start(t, spec(t, "crasher", "crasher", `{}`), pol)

	st := waitState(t, f.p, supervisor.StateFailed)
	// The crash that exceeds the budget is not a restart: none follows it.
	if st.Restarts != pol.MaxRestarts {
		t.Errorf("Status().Restarts = %d when failed, want %d", st.Restarts, pol.MaxRestarts)
	}
	if !strings.Contains(st.LastError, "handshake") {
		t.Errorf("Status().LastError = %q, want the handshake failure", st.LastError)
	}
	if st.Pid != 0 || f.p.Endpoint() != nil || f.p.Ready() {
		t.Errorf("failed plugin: Pid %d, Conn %v, Ready %t; want 0, nil, false", st.Pid, f.p.Endpoint(), f.p.Ready())
	}
	if _, err := f.p.Families(t.Context()); err == nil {
		t.Error("Families() on a failed plugin = nil error, want an error")
	}
	if got := gauge(t, f.metrics, supervisor.StateFailed, "crasher"); got != 1 {
		t.Errorf("plughost_plugin_state{state=failed} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.metrics.PluginUp.WithLabelValues("crasher")); got != 0 {
		t.Errorf("plughost_plugin_up{plugin=crasher} = %v, want 0", got)
	}

	// An operator restart starts it again from failed; crasher then fails
	// again, after as many restarts.
	mark := f.rec.len()
	f.p.Restart(time.Now().Add(time.Second))
	waitFor(t, 30*time.Second, "crasher to start again and fail again", func() bool {
		states := f.rec.since(mark)
		return slices.Contains(states, supervisor.StateStarting) && f.p.Status().State == supervisor.StateFailed
	})
	if states := f.rec.since(mark); states[0] != supervisor.StateStarting {
		t.Errorf("states after Restart from failed = %v, want starting first", states)
	}
	if again := f.p.Status(); again.Restarts <= st.Restarts {
		t.Errorf("Status().Restarts = %d after restarting from failed, want more than %d", again.Restarts, st.Restarts)
	}
}

// TestOldRestartsLeaveWindow: max_restarts counts only the restarts within
// window. With a budget of one, a plugin killed each time after window has
// passed since its last restart is restarted every time; were old restarts
// kept, the second kill would mark it failed.
func TestOldRestartsLeaveWindow(t *testing.T) {
	pol := testPolicy()
	pol.MaxRestarts = 1
	pol.Window = 300 * time.Millisecond
	f := start(t, helloSpec(t), pol)
	old := waitReady(t, f.p)

	// lastRestart is when the new process was seen ready: the supervisor
	// counted the restart before it started that process, so earlier. A
	// slow machine only puts the next kill further from it.
	var lastRestart time.Time
	for kill := 1; kill <= 3; kill++ {
		if kill > 1 {
			// The condition is the time itself: the last restart has
			// left the window.
			time.Sleep(time.Until(lastRestart.Add(pol.Window)))
		}
		gap := "no earlier restart"
		if kill > 1 {
			gap = fmt.Sprintf("%v after the last restart was seen", time.Since(lastRestart).Round(time.Millisecond))
		}
		if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %d: %v", old.Pid, err)
		}
		var st supervisor.Status
		waitFor(t, 30*time.Second, fmt.Sprintf("kill %d: a new process to be ready", kill), func() bool {
			st = f.p.Status()
			if st.State == supervisor.StateFailed {
				t.Fatalf("kill %d (%s): hello failed (%s) after %d restarts; want a restart: max_restarts = %d counts only the restarts within window = %v",
					kill, gap, st.LastError, st.Restarts, pol.MaxRestarts, pol.Window)
			}
			return st.Pid != old.Pid && f.p.Ready()
		})
		lastRestart = time.Now()
		if st.Restarts != kill {
			t.Errorf("kill %d: Status().Restarts = %d, want %d", kill, st.Restarts, kill)
		}
		old = st
	}
	if got := testutil.ToFloat64(f.metrics.PluginRestarts.WithLabelValues("hello", metrics.RestartFailure)); got != 3 {
		t.Errorf("plughost_plugin_restarts_total{plugin=hello, reason=failure} = %v after three restarts, want 3", got)
	}
}

func TestUnhealthyRestarted(t *testing.T) {
	pol := testPolicy()
	pol.HealthInterval = 100 * time.Millisecond
	pol.HealthTimeout = 300 * time.Millisecond
	pol.HealthFailures = 2
	f := start(t, spec(t, "faulty", "faulty", `{"label":"x","limit":3}`), pol)
	old := waitReady(t, f.p)

	if code, body, err := do(t.Context(), f.p.Endpoint(), "POST", "/sick", ""); err != nil || code != 200 {
		t.Fatalf("POST /sick = %d %s, %v, want 200", code, body, err)
	}
	var st supervisor.Status
	waitFor(t, 30*time.Second, "the wedged plugin to be replaced", func() bool {
		st = f.p.Status()
		return st.State == supervisor.StateReady && st.Pid != old.Pid && f.p.Ready()
	})
	if st.Restarts != 1 {
		t.Errorf("Status().Restarts = %d, want 1", st.Restarts)
	}
	if !strings.Contains(st.LastError, "unhealthy") {
		t.Errorf("Status().LastError = %q, want it to say the plugin was unhealthy", st.LastError)
	}
	waitGone(t, old.Pid)
}

// do sends a request to c's process over its data plane and returns the
// status and the whole body.
func do(ctx context.Context, c *supervisor.Endpoint, method, path, rawQuery string) (int, []byte, error) {
	resp, err := c.RoundTrip(ctx, &dataplane.Request{Method: method, Path: path, RawQuery: rawQuery})
	if err != nil {
		return 0, nil, err
	}
	defer resp.Close()
	var body []byte
	for {
		piece, err := resp.Next()
		if err == io.EOF {
			return resp.Status, body, nil
		}
		if err != nil {
			return resp.Status, body, err
		}
		body = append(body, piece...)
	}
}

var backoffRE = regexp.MustCompile(`restarting plugin after backoff: .*backoff=(\S+)`)

// backoffs returns the backoff delays the supervisor logged, in order.
func backoffs(t *testing.T, log string) []time.Duration {
	t.Helper()
	var out []time.Duration
	for _, m := range backoffRE.FindAllStringSubmatch(log, -1) {
		d, err := time.ParseDuration(m[1])
		if err != nil {
			t.Fatalf("backoff %q in the log: %v", m[1], err)
		}
		out = append(out, d)
	}
	return out
}

// noJitter is testPolicy with exact backoff delays.
func noJitter() supervisor.Policy {
	pol := testPolicy()
	pol.Jitter = -1
	return pol
}

// TestBackoffDelays pins the restart delays: without jitter they start at
// initial_backoff, double after each restart up to max_backoff, and an
// operator restart from failed starts them over.
func TestBackoffDelays(t *testing.T) {
	pol := noJitter()
	pol.InitialBackoff, pol.MaxBackoff = 10*time.Millisecond, 80*time.Millisecond
	pol.MaxRestarts = 6
	f := start(t, spec(t, "crasher", "crasher", `{}`), pol)
	waitState(t, f.p, supervisor.StateFailed)

	ms := time.Millisecond
	want := []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 80 * ms, 80 * ms}
	if got := backoffs(t, f.log.String()); !slices.Equal(got, want) {
		t.Fatalf("backoff delays = %v, want %v", got, want)
	}

	mark := f.rec.len()
	f.p.Restart(time.Now().Add(time.Second))
	waitFor(t, 30*time.Second, "crasher to start again and fail again", func() bool {
		return slices.Contains(f.rec.since(mark), supervisor.StateStarting) && f.p.Status().State == supervisor.StateFailed
	})
	if got := backoffs(t, f.log.String())[len(want):]; !slices.Equal(got, want) {
		t.Errorf("backoff delays after an operator restart from failed = %v, want %v again", got, want)
	}
}

// kill9 SIGKILLs the ready plugin's process and waits until another one
// is ready in its place.
func kill9(t *testing.T, p *supervisor.Process) supervisor.Status {
	t.Helper()
	old := waitReady(t, p)
	if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", old.Pid, err)
	}
	var st supervisor.Status
	waitFor(t, 30*time.Second, "a new process to be ready", func() bool {
		st = p.Status()
		return st.Pid != old.Pid && p.Ready()
	})
	return st
}

// TestStableRunResetsBackoff: crashes in quick succession wait longer
// each time, and once the plugin has stayed ready for stable_after the
// next crash waits initial_backoff again.
func TestStableRunResetsBackoff(t *testing.T) {
	pol := noJitter()
	pol.InitialBackoff, pol.MaxBackoff = 20*time.Millisecond, time.Second
	pol.MaxRestarts = 10
	pol.StableAfter = 3 * time.Second // far longer than a kill takes after ready
	f := start(t, helloSpec(t), pol)
	const stableLine = "plugin stable"
	stable := func() int { return strings.Count(f.log.String(), stableLine) }

	ms := time.Millisecond
	kill9(t, f.p)
	kill9(t, f.p)
	if n := stable(); n != 0 {
		t.Fatalf("%q logged %d times before stable_after could pass; the kills came too slowly for this test", stableLine, n)
	}
	if got, want := backoffs(t, f.log.String()), []time.Duration{20 * ms, 40 * ms}; !slices.Equal(got, want) {
		t.Fatalf("backoff delays after two quick crashes = %v, want %v", got, want)
	}

	waitFor(t, 30*time.Second, "the plugin to be stable", func() bool { return stable() == 1 })
	kill9(t, f.p)
	if got, want := backoffs(t, f.log.String()), []time.Duration{20 * ms, 40 * ms, 20 * ms}; !slices.Equal(got, want) {
		t.Errorf("backoff delays = %v, want %v: a crash after a stable run waits initial_backoff again", got, want)
	}
	if st := f.p.Status(); st.Restarts != 3 {
		t.Errorf("Status().Restarts = %d after three crashes, want 3", st.Restarts)
	}
}

var healthFailRE = regexp.MustCompile(`health check failed: .*consecutive=(\d+)`)

// failedChecks returns the consecutive counts of the failed health checks
// the supervisor logged, in order.
func failedChecks(log string) []int {
	var out []int
	for _, m := range healthFailRE.FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n)
	}
	return out
}

// TestHealthFailureThreshold: failed health checks restart a plugin only
// when health.failures of them come in a row; a check that succeeds
// starts the count over.
func TestHealthFailureThreshold(t *testing.T) {
	pol := testPolicy()
	pol.HealthInterval = 100 * time.Millisecond
	pol.HealthTimeout = time.Second // long enough that a loaded machine does not fail checks by accident
	pol.HealthFailures = 3
	f := start(t, spec(t, "faulty", "faulty", `{"label":"x","limit":3}`), pol)
	first := waitReady(t, f.p)

	healthy := func() int {
		t.Helper()
		code, body, err := do(t.Context(), f.p.Endpoint(), "GET", "/healthy", "")
		if err != nil || code != 200 {
			t.Fatalf("GET /healthy = %d %s, %v, want 200", code, body, err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(body)))
		if err != nil {
			t.Fatalf("GET /healthy = %q, want a number", body)
		}
		return n
	}
	sicken := func(n int) {
		t.Helper()
		if code, body, err := do(t.Context(), f.p.Endpoint(), "POST", "/sick", fmt.Sprintf("checks=%d", n)); err != nil || code != 200 {
			t.Fatalf("POST /sick?checks=%d = %d %s, %v, want 200", n, code, body, err)
		}
	}

	// Twice: one failed check fewer than the threshold, then a check that
	// succeeds. The count starts over, so neither round restarts it.
	for round := 1; round <= 2; round++ {
		sicken(pol.HealthFailures - 1)
		waitFor(t, 30*time.Second, fmt.Sprintf("round %d's failed checks", round), func() bool {
			if st := f.p.Status(); st.Restarts != 0 {
				t.Fatalf("round %d: restarted (%s) after failed checks with consecutive counts %v; want no restart below health.failures = %d",
					round, st.LastError, failedChecks(f.log.String()), pol.HealthFailures)
			}
			return len(failedChecks(f.log.String())) == round*(pol.HealthFailures-1)
		})
		// The supervisor reads every answer before it sends the next
		// check, so the failures it logged came before this success.
		c := healthy()
		waitFor(t, 30*time.Second, "a health check to succeed", func() bool { return healthy() > c })
	}
	if got, want := failedChecks(f.log.String()), []int{1, 2, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("consecutive counts of failed checks = %v, want %v: a successful check starts the count over", got, want)
	}
	if st := f.p.Status(); st.Pid != first.Pid || st.Restarts != 0 || st.State != supervisor.StateReady {
		t.Fatalf("after two rounds of %d failed checks: Status() = %+v, want pid %d, no restart, ready", pol.HealthFailures-1, st, first.Pid)
	}

	// The threshold itself restarts it.
	sicken(pol.HealthFailures)
	var st supervisor.Status
	waitFor(t, 30*time.Second, "the plugin to be restarted", func() bool {
		st = f.p.Status()
		return st.Pid != first.Pid && f.p.Ready()
	})
	if got, want := failedChecks(f.log.String()), []int{1, 2, 1, 2, 1, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("consecutive counts of failed checks = %v, want %v", got, want)
	}
	if st.Restarts != 1 || !strings.Contains(st.LastError, "3 consecutive failed health checks") {
		t.Errorf("Status() = %+v, want 1 restart and last_error naming 3 consecutive failed health checks", st)
	}
}

// TestHungPluginKilled: a process that is alive but answers nothing
// (SIGSTOP) fails its health checks and is then SIGKILLed at once, not
// asked over its stopped control connection to exit, so a new process
// is ready within the health budget: the checks (the first starts at
// most one interval after the stop, and each one unanswered takes the
// whole timeout, which is at most the interval), the backoff, and 1s to
// kill, reap and start again.
func TestHungPluginKilled(t *testing.T) {
	pol := noJitter()
	pol.HealthInterval = 500 * time.Millisecond
	pol.HealthTimeout = 500 * time.Millisecond // long enough that a loaded machine does not fail checks by accident
	pol.HealthFailures = 3
	f := start(t, helloSpec(t), pol)
	old := waitReady(t, f.p)
	reaped := false
	// Runs before the Stop that start registered: a supervisor stuck on
	// the stopped process is freed, and none is left behind.
	t.Cleanup(func() {
		if !reaped {
			_ = syscall.Kill(old.Pid, syscall.SIGKILL)
		}
	})

	stopped := time.Now()
	if err := syscall.Kill(old.Pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("kill -STOP %d: %v", old.Pid, err)
	}
	limit := time.Duration(pol.HealthFailures)*pol.HealthInterval + pol.HealthTimeout + pol.InitialBackoff + time.Second
	var st supervisor.Status
	waitFor(t, 3*limit, "a new process to be ready", func() bool {
		st = f.p.Status()
		return st.Pid != old.Pid && f.p.Ready()
	})
	back := time.Since(stopped)
	t.Logf("ready again %v after SIGSTOP", back)
	if back > limit {
		t.Errorf("ready again %v after SIGSTOP, want within health interval × failures + timeout + backoff + 1s = %v", back, limit)
	}
	// The supervisor waits for the old process before it starts another.
	if alive(old.Pid) {
		t.Errorf("stopped process %d still exists (or is a zombie) after its replacement is ready, want it killed and reaped", old.Pid)
	} else {
		reaped = true
	}
	if st.Restarts != 1 || !strings.Contains(st.LastError, "consecutive failed health checks, killed as hung") {
		t.Errorf("Status() = %+v, want 1 restart and a last error saying the failed health checks had it killed as hung", st)
	}
	if got := testutil.ToFloat64(f.metrics.PluginHungKills.WithLabelValues("hello")); got != 1 {
		t.Errorf("plughost_plugin_hung_kills_total{plugin=\"hello\"} = %v, want 1", got)
	}
	log := f.log.String()
	var at []int
	for _, msg := range []string{"consecutive=3", "killing plugin that failed its health checks", "plugin down", "restarting plugin after backoff"} {
		i := strings.Index(log, msg)
		if i < 0 {
			t.Fatalf("supervisor log lacks %q:\n%s", msg, log)
		}
		at = append(at, i)
	}
	if !slices.IsSorted(at) {
		t.Errorf("supervisor log positions of the verdict, kill, down and backoff = %v, want in that order", at)
	}
	if got, want := failedChecks(log), []int{1, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("consecutive counts of failed checks = %v, want %v", got, want)
	}
}
