package e2e

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSIGTERMDrain(t *testing.T) {
	const drainDeadline = time.Second
	h := startHost(t, baseConfig(drainDeadline.String())+pluginBlock("hello", "hello", ""))
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
	h.signal(syscall.SIGTERM)

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
	if log := h.log.String(); !strings.Contains(log, "drain deadline passed; killing plugin") && !strings.Contains(log, "drain did not finish; killing plugin") {
		t.Errorf("host log does not say the drain deadline killed hello")
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
