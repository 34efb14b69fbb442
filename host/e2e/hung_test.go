package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plughost/plughost/host/config"
)

// logTimeRE reads the timestamp hclog starts each line with.
var logTimeRE = regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[-+Z]\S*)`)

// logTime returns when the first host log line for plugin that contains
// msg was written.
func logTime(t *testing.T, log, plugin, msg string) (time.Time, bool) {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, msg) || !strings.Contains(line, "plugin="+plugin) {
			continue
		}
		m := logTimeRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("log line %q has no timestamp", line)
		}
		ts, err := time.Parse("2006-01-02T15:04:05.000Z0700", m[1])
		if err != nil {
			t.Fatalf("timestamp of log line %q: %v", line, err)
		}
		return ts, true
	}
	return time.Time{}, false
}

// TestHungPluginReplaced stops hello with SIGSTOP under a light load: the
// process is alive but answers nothing. After health.failures failed
// checks the host must SIGKILL it at once, without a graceful shutdown
// over the control connection that the stopped process cannot answer,
// and serve again within what the config allows: the checks (the first
// one starts at most one interval after the stop, and a check that is
// not answered takes the whole timeout, which is at most the interval),
// the restart backoff, and 1s to kill the process, start the new one
// and answer a request. It runs with baseConfig's health checks and with
// the defaults (no health block).
func TestHungPluginReplaced(t *testing.T) {
	const baseHealth = `
health {
  interval = "1s"
  timeout  = "1s"
  failures = 3
}
`
	base := baseConfig("2s")
	if !strings.Contains(base, baseHealth) {
		t.Fatalf("baseConfig no longer has this health block; update this test:%s", baseHealth)
	}
	for _, tc := range []struct{ name, cfg string }{
		{"base_config", base},
		{"default_health", strings.Replace(base, baseHealth, "\n", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) { testHungPluginReplaced(t, tc.cfg+pluginBlock("hello", "hello", "")) })
	}
}

// testHungPluginReplaced is TestHungPluginReplaced with the host config
// cfg, which runs hello.
func testHungPluginReplaced(t *testing.T, cfg string) {
	const (
		workers = 4
		pace    = 20 * time.Millisecond // between one worker's requests: a light load
	)
	// The bound comes from the config the host runs.
	c, diags := config.Parse([]byte(cfg), "hung.hcl")
	if diags.HasErrors() {
		t.Fatalf("config.Parse: %v", diags)
	}
	interval, timeout, failures := c.Health.Interval, c.Health.Timeout, c.Health.Failures
	initialBackoff := c.Restart.InitialBackoff // the first restart's backoff, at most
	t.Logf("health interval %v, timeout %v, failures %d; initial_backoff %v", interval, timeout, failures, initialBackoff)

	h := startHost(t, cfg)
	old := readyPlugin(t, h, "hello")
	// A stopped process left behind by a failing test is killed before
	// its host is (cleanups run last first); SIGKILL ends a stopped
	// process too.
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			_ = syscall.Kill(old.Pid, syscall.SIGKILL)
		}
	})

	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	t.Cleanup(tr.CloseIdleConnections)
	lc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var load results
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		getEvery(&wg, stop, lc, h.ingress+"/hello/", pace, &load)
	}
	stopLoad := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	t.Cleanup(stopLoad)

	waitFor(t, 10*time.Second, "load to reach hello", func() bool { return load.count(http.StatusOK) >= 20 })
	stopped := time.Now()
	stopProcess(t, old.Pid)
	// Only a request sent once every thread has stopped cannot have
	// been answered by the old process.
	allStoppedAt := time.Now()
	waitFor(t, 30*time.Second, "hello to serve the load again", func() bool {
		_, ok := load.firstOKAfter(allStoppedAt)
		return ok
	})
	back, _ := load.firstOKAfter(allStoppedAt)
	back += allStoppedAt.Sub(stopped)
	stopLoad()

	// The old process is gone and reaped: the host waits for it before
	// it restarts the plugin, so no zombie answers signal 0.
	if err := syscall.Kill(old.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("signal 0 to the stopped process %d after the restart: %v, want ESRCH (killed and reaped)", old.Pid, err)
	} else {
		reaped = true
	}

	st := h.plugins()["hello"]
	// The 1s of the bound covers starting the new process and its first
	// answer, which take a fraction of it on an idle machine; a busy one
	// may take longer to start a process, which is the machine's work,
	// not the host's wait: the bound grows by what the start took beyond
	// half a second, read from the host's log.
	log := h.log.String()
	restart, okR := logTime(t, log, "hello", "restarting plugin after backoff")
	ready, okN := logTime(t, log, "hello", fmt.Sprintf("plugin ready: plugin=hello pid=%d", st.Pid))
	if !okR || !okN {
		t.Fatalf("host log lacks the restart (%v) or the new process's ready (%v):\n%s", okR, okN, log)
	}
	start := ready.Sub(restart)
	limit := time.Duration(failures)*interval + timeout + initialBackoff + time.Second + max(0, start-500*time.Millisecond)
	t.Logf("hello served again %v after SIGSTOP (the new process took %v to start); bound %v", back, start, limit)
	if back > limit {
		t.Errorf("hello served again %v after SIGSTOP, want within health.interval × failures + timeout + initial_backoff + 1s (+ the start beyond 500ms) = %v", back, limit)
	}

	if st.Pid == old.Pid || st.Pid == 0 || st.State != "ready" {
		t.Errorf("hello after the restart: pid %d, state %s; want a new pid (old %d), ready", st.Pid, st.State, old.Pid)
	}
	for _, want := range []string{fmt.Sprintf("%d consecutive failed health checks", failures), "killed as hung"} {
		if !strings.Contains(st.LastError, want) {
			t.Errorf("hello last_error = %q, want it to contain %q", st.LastError, want)
		}
	}
	if v, ok := h.metric(`plughost_plugin_restarts_total{plugin="hello",reason="failure"}`); !ok || v != 1 {
		t.Errorf("plughost_plugin_restarts_total{plugin=\"hello\",reason=\"failure\"} = %v (found %v), want 1", v, ok)
	}
	if v, ok := h.metric(`plughost_plugin_hung_kills_total{plugin="hello"}`); !ok || v != 1 {
		t.Errorf("plughost_plugin_hung_kills_total{plugin=\"hello\"} = %v (found %v), want 1", v, ok)
	}

	// The mechanism: the kill follows the health verdict at once, and
	// the process is down (killed and reaped) well within go-plugin's
	// 2s wait for a graceful exit, let alone a shutdown RPC the stopped
	// process never answers.
	verdict, ok1 := logTime(t, log, "hello", fmt.Sprintf("consecutive=%d", failures))
	kill, ok2 := logTime(t, log, "hello", "killing plugin that failed its health checks")
	down, ok3 := logTime(t, log, "hello", "plugin down")
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("host log lacks the health verdict (%v), the kill (%v) or plugin down (%v):\n%s", ok1, ok2, ok3, log)
	}
	t.Logf("after SIGSTOP: health verdict +%v, kill +%v, down +%v",
		verdict.Sub(stopped).Round(time.Millisecond), kill.Sub(stopped).Round(time.Millisecond), down.Sub(stopped).Round(time.Millisecond))
	// Log timestamps have millisecond resolution.
	if kill.Before(verdict) || kill.Sub(verdict) > time.Second {
		t.Errorf("kill logged %v after the health verdict, want at once", kill.Sub(verdict))
	}
	if d := down.Sub(kill); d > time.Second {
		t.Errorf("plugin down %v after the kill, want within 1s: the host must not wait for a graceful exit of a hung process", d)
	}
	if early := stopped.Add(time.Duration(failures-1) * interval).Add(-50 * time.Millisecond); verdict.Before(early) {
		t.Errorf("health verdict %v after SIGSTOP, want no earlier than (failures-1) × interval: it was not the health checks that restarted hello", verdict.Sub(stopped))
	}
}
