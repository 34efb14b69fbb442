package e2e

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSIGTERMDrain stops the host with SIGTERM sent to the host alone, and
// to its whole process group, as systemd's default KillMode (the whole
// cgroup), timeout(1) and a Ctrl-C do: the plugins get the signal too, and
// must leave their shutdown to the host's drain rather than die at once.
func TestSIGTERMDrain(t *testing.T) {
	t.Run("host", func(t *testing.T) { testSIGTERMDrain(t, false) })
	t.Run("process_group", func(t *testing.T) { testSIGTERMDrain(t, true) })
}

func testSIGTERMDrain(t *testing.T, group bool) {
	const drainDeadline = time.Second
	cfg := baseConfig(drainDeadline.String()) + pluginBlock("hello", "hello", "")
	var h *hostProc
	if group {
		h = startHostInGroup(t, cfg)
	} else {
		h = startHost(t, cfg)
	}
	hello := readyPlugin(t, h, "hello")

	// Both requests start before the signal: one can finish within the
	// drain deadline, the other cannot.
	lc := &http.Client{Timeout: 10 * time.Second}
	short, long := make(chan result, 1), make(chan result, 1)
	go func() { short <- getOnce(lc, h.ingress+"/hello/sleep?ms=300") }()
	go func() { long <- getOnce(lc, h.ingress+"/hello/sleep?ms=5000") }()
	waitFor(t, 10*time.Second, "both requests to be in flight", func() bool {
		v, ok := h.metric(`plughost_inflight_requests{plugin="hello"}`)
		// In flight at the host is not yet at the plugin; hello counts a
		// sleep when it starts one, and a drain must not overtake them.
		started, _ := h.metric(`hello_sleeps_total{plugin="hello"}`)
		return ok && v == 2 && started == 2
	})

	signalled := time.Now()
	if group {
		h.signalGroup(syscall.SIGTERM)
	} else {
		h.signal(syscall.SIGTERM)
	}

	// /readyz turns 503 at once, if the listener still takes connections.
	rc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	waitFor(t, 500*time.Millisecond, "/readyz to stop answering 200", func() bool {
		res := getOnce(rc, h.ingress+"/readyz")
		return res.err != nil || res.code == http.StatusServiceUnavailable
	})

	code, exited := h.waitExit(10 * time.Second)
	took := time.Since(signalled)
	if !exited {
		t.Fatalf("host still running 10s after SIGTERM, want it to exit within drain_deadline + 1s = %v", drainDeadline+time.Second)
	}
	t.Logf("host exited %v after SIGTERM", took)
	if code != 0 {
		t.Errorf("host exit code = %d, want 0", code)
	}
	if limit := drainDeadline + time.Second; took > limit {
		t.Errorf("host exited %v after SIGTERM, want within drain_deadline + 1s = %v", took, limit)
	}

	select {
	case res := <-short:
		if res.err != nil || res.code != http.StatusOK {
			t.Errorf("short request = %d %q, %v; want 200", res.code, res.errCode, res.err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("short request did not finish within 5s of the host's exit")
	}
	select {
	case res := <-long:
		if res.err != nil || res.code != http.StatusServiceUnavailable || res.errCode != "drain_aborted" {
			t.Errorf("long request = %d %q, %v; want 503 drain_aborted", res.code, res.errCode, res.err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("long request hung: no answer within 5s of the host's exit, want 503")
	}
	if !waitGone(hello.Pid, 2*time.Second) {
		t.Errorf("hello (pid %d) still alive 2s after the host exited", hello.Pid)
	}
	log := h.log.String()
	if !strings.Contains(log, "drain deadline passed; killing plugin") && !strings.Contains(log, "drain did not finish; killing plugin") {
		t.Errorf("host log does not say the drain deadline killed hello")
	}
	if group {
		if !strings.Contains(log, "ignoring SIGTERM") {
			t.Errorf("hello's log (in the host's) does not say it ignored the group's SIGTERM")
		}
		if strings.Contains(log, "signal: terminated") {
			t.Errorf("hello died of the group's SIGTERM instead of being drained by the host")
		}
	}
}

func TestKill9HostLeavesNoPlugins(t *testing.T) {
	h := startHost(t, baseConfig("2s")+
		pluginBlock("hello", "hello", "")+
		pluginBlock("faulty", "faulty", ""))
	pids := map[string]int{
		"hello":  readyPlugin(t, h, "hello").Pid,
		"faulty": readyPlugin(t, h, "faulty").Pid,
	}
	for name, pid := range pids {
		if !alive(pid) {
			t.Fatalf("%s (pid %d) is not alive before the host is killed", name, pid)
		}
	}

	killed := time.Now()
	h.signal(syscall.SIGKILL)
	if _, ok := h.waitExit(5 * time.Second); !ok {
		t.Fatal("host still running 5s after SIGKILL")
	}
	for name, pid := range pids {
		if !waitGone(pid, time.Until(killed.Add(2*time.Second))) {
			t.Errorf("%s (pid %d) still alive 2s after kill -9 of the host, want it gone", name, pid)
		}
	}
}
