package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// slowstartConfig is baseConfig with the given drain deadline, a start
// timeout long enough for any start_delay below, and the slowstart plugin
// whose Configure takes delay.
func slowstartConfig(drain, delay string) string {
	base := strings.Replace(baseConfig(drain), `request_timeout = "5s"`, "request_timeout = \"5s\"\n  start_timeout   = \"2m\"", 1)
	return base + pluginBlock("slowstart", "slowstart", "  config {\n    start_delay = \""+delay+"\"\n  }")
}

// children lists the pids of pid's child processes.
func children(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // gone meanwhile
		}
		// The state and the parent's pid follow the parenthesised name.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			out = append(out, child)
		}
	}
	return out
}

// logsWithin polls h's log until it holds msg n times, for at most d,
// and reports whether it did.
func logsWithin(h *hostProc, d time.Duration, msg string, n int) bool {
	deadline := time.Now().Add(d)
	for strings.Count(h.log.String(), msg) < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// TestSIGTERMDuringSlowStart: a reload whose new process takes a minute to
// become ready does not delay a SIGTERM. The shutdown begins at once, the
// new process is stopped, the old one drained, and the host exits within
// the drain deadline (plus the second the host allows itself) leaving no
// process behind. SIGHUPs sent while the reload runs queue one reload
// more, which the shutdown then drops.
func TestSIGTERMDuringSlowStart(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("lists child processes in /proc")
	}
	const drain = 3 * time.Second
	h := startHost(t, slowstartConfig(drain.String(), "0s"))
	old := readyPlugin(t, h, "slowstart")

	if err := os.WriteFile(h.cfgPath, []byte(slowstartConfig(drain.String(), "1m")), 0o644); err != nil {
		t.Fatal(err)
	}
	h.signal(syscall.SIGHUP)
	waitFor(t, 30*time.Second, "the new process to be in its minute-long Configure", func() bool {
		return strings.Contains(h.log.String(), "start_delay 1m0s")
	})
	kids := children(t, h.cmd.Process.Pid)
	if len(kids) < 2 {
		t.Fatalf("host's children during the replacement = %v, want the old process %d and the new one", kids, old.Pid)
	}

	// One more SIGHUP queues a reload; the next joins it.
	h.signal(syscall.SIGHUP)
	if !logsWithin(h, 10*time.Second, "reload queued", 2) {
		t.Errorf("the second SIGHUP during a reload did not queue one")
	}
	h.signal(syscall.SIGHUP)
	if !logsWithin(h, 10*time.Second, "reload already queued; this signal joins it", 1) {
		t.Errorf("the third SIGHUP during a reload did not join the queued one")
	}

	start := time.Now()
	h.signal(syscall.SIGTERM)
	code, exited := h.waitExit(drain + 10*time.Second)
	took := time.Since(start)
	if !exited {
		t.Fatalf("host still running %v after SIGTERM during a slow replacement", drain+10*time.Second)
	}
	if code != 0 || took > drain+time.Second {
		t.Errorf("host after SIGTERM during a slow replacement: exit %d after %v; want 0 within the drain deadline %v + 1s", code, took, drain)
	}
	for _, pid := range kids {
		if alive(pid) {
			t.Errorf("plugin process %d still alive when its host exited", pid)
		}
	}
	log := h.log.String()
	if !strings.Contains(log, "config reload cut short: the host is shutting down") {
		t.Errorf("host log does not say the reload was cancelled")
	}
	if strings.Contains(log, "[ERROR]") {
		t.Errorf("host log has an ERROR line for a shutdown during a reload, which is not a failure")
	}
	if testing.Verbose() {
		t.Logf("host log:\n%s", log)
	}
	if n := strings.Count(log, "reloading config"); n != 1 {
		t.Errorf("reloads begun = %d, want 1: the queued one is dropped by the shutdown", n)
	}
}

// TestSIGTERMDuringLongDrain: while a replaced process drains a request
// that outlasts the drain deadline, a SIGTERM starts the shutdown at once
// (it does not wait for that drain), and the host exits within the drain
// deadline plus a second of the SIGTERM.
func TestSIGTERMDuringLongDrain(t *testing.T) {
	const drain = 5 * time.Second
	h := startHost(t, slowstartConfig(drain.String(), "0s"))
	old := readyPlugin(t, h, "slowstart")

	// A request the old process holds until the drain deadline kills it.
	held := make(chan int, 1)
	go func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, h.ingress+"/slowstart/sleep?ms=60000", nil)
		if err != nil {
			held <- 0
			return
		}
		resp, err := client.Do(req)
		if err != nil {
			held <- 0
			return
		}
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	t.Cleanup(func() { <-held })
	waitFor(t, 10*time.Second, "the old process to hold the request", func() bool {
		v, ok := h.metric(fmt.Sprintf(`plughost_inflight_requests{plugin=%q}`, "slowstart"))
		return ok && v == 1
	})

	h.reload(slowstartConfig(drain.String(), "1ms"), "plugin replaced; draining the old process")
	start := time.Now()
	h.signal(syscall.SIGTERM)
	waitFor(t, 10*time.Second, "the host to begin its shutdown", func() bool {
		return strings.Contains(h.log.String(), "shutting down: signal=")
	})
	if took := time.Since(start); took > time.Second {
		t.Errorf("shutdown began %v after SIGTERM, want at once, not after the old process %d's drain", took, old.Pid)
	}
	code, exited := h.waitExit(drain + 10*time.Second)
	took := time.Since(start)
	if !exited {
		t.Fatalf("host still running %v after SIGTERM", drain+10*time.Second)
	}
	if code != 0 || took > drain+time.Second {
		t.Errorf("host after SIGTERM during a drain: exit %d after %v; want 0 within the drain deadline %v + 1s", code, took, drain)
	}
	if alive(old.Pid) {
		t.Errorf("old process %d still alive when its host exited", old.Pid)
	}
}
