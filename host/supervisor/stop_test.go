package supervisor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plughost/plughost/host/supervisor"
)

func TestStopDrains(t *testing.T) {
	f := start(t, helloSpec(t), testPolicy())
	st := waitReady(t, f.p)
	c := f.p.Endpoint()

	begin := time.Now()
	f.p.Stop(time.Now().Add(10 * time.Second))
	if d := time.Since(begin); d > 9*time.Second {
		t.Errorf("Stop with nothing in flight took %v, want well before the deadline", d)
	}
	if got := f.p.Status(); got.State != supervisor.StateStopped || got.Pid != 0 {
		t.Errorf("Status() after Stop = %+v, want stopped with no pid", got)
	}
	if f.p.Endpoint() != nil {
		t.Error("Conn() after Stop is not nil")
	}
	if c.Aborted() {
		t.Error("Conn().Aborted() = true after a clean drain")
	}
	waitGone(t, st.Pid)
	f.p.Stop(time.Now()) // a second Stop returns at once
	f.p.Restart(time.Now())
}

// TestStopWaitsForAnswersInTransit: once the plugin reports its drain
// finished, answers it has sent may not have been read yet; Stop waits for
// the host's calls (Conn.StartCall) before it ends the process, and ends it
// cleanly once they are done.
func TestStopWaitsForAnswersInTransit(t *testing.T) {
	f := start(t, helloSpec(t), testPolicy())
	st := waitReady(t, f.p)
	c := f.p.Endpoint()
	c.StartCall() // an answer the host has not read yet
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		f.p.Stop(time.Now().Add(time.Minute))
	}()
	waitFor(t, 30*time.Second, "Stop to wait for the answer in transit", func() bool {
		return strings.Contains(f.log.String(), "waiting for answers in transit")
	})
	if !alive(st.Pid) {
		t.Fatalf("hello (pid %d) was stopped with an answer still in transit", st.Pid)
	}
	c.EndCall()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("Stop did not return after the last answer was read")
	}
	waitGone(t, st.Pid)
	if c.Aborted() {
		t.Error("Conn().Aborted() = true, want a clean stop once the answer was read")
	}
	if !strings.Contains(f.log.String(), "plugin drained") {
		t.Errorf("log does not say the plugin drained:\n%s", f.log.String())
	}
}

// TestStopKillsAtDeadlineWithAnswersInTransit: an answer still unread at
// the drain deadline does not hold the process past it.
func TestStopKillsAtDeadlineWithAnswersInTransit(t *testing.T) {
	f := start(t, helloSpec(t), testPolicy())
	st := waitReady(t, f.p)
	c := f.p.Endpoint()
	c.StartCall()
	defer c.EndCall()
	stopAtDeadline(t, f, c, st.Pid, "an answer in transit")
}

// stopAtDeadline stops f's plugin with a 500ms drain deadline while what
// keeps it busy, and checks that Stop kept to the deadline, marked c
// aborted and ended the process.
func stopAtDeadline(t *testing.T, f *fixture, c *supervisor.Endpoint, pid int, what string) {
	t.Helper()
	const drain = 500 * time.Millisecond
	begin := time.Now()
	f.p.Stop(begin.Add(drain))
	if d := time.Since(begin); d > drain+time.Second {
		t.Errorf("Stop took %v with %s, want at most the %v deadline + 1s", d, what, drain)
	}
	if !c.Aborted() {
		t.Errorf("Conn().Aborted() = false after the drain deadline cut %s", what)
	}
	waitGone(t, pid)
}

func TestStopKillsAtDeadline(t *testing.T) {
	f := start(t, helloSpec(t), testPolicy())
	st := waitReady(t, f.p)
	c := f.p.Endpoint()

	type result struct {
		code int
		body []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, body, err := do(context.Background(), c, "GET", "/sleep", "ms=5000")
		done <- result{code, body, err}
	}()
	waitFor(t, 30*time.Second, "the /sleep request to reach the plugin", func() bool { return sleepsServed(t, f.p) == 1 })

	stopAtDeadline(t, f, c, st.Pid, "a request in flight")
	select {
	case r := <-done:
		if r.err == nil {
			t.Errorf("in-flight GET /sleep = %d %s, want an error after the kill", r.code, r.body)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("in-flight Handle(/sleep) did not return after the plugin was killed")
	}
	if got := f.p.Status().State; got != supervisor.StateStopped {
		t.Errorf("Status().State = %s, want stopped", got)
	}
}

func TestStopDuringBackoff(t *testing.T) {
	pol := testPolicy()
	pol.InitialBackoff, pol.MaxBackoff = time.Hour, time.Hour
	f := start(t, spec(t, "crasher", "crasher", `{}`), pol)
	waitState(t, f.p, supervisor.StateBackoff)

	begin := time.Now()
	f.p.Stop(time.Now().Add(10 * time.Second))
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("Stop during an hour's backoff took %v, want it to cut the backoff short", d)
	}
	if got := f.p.Status().State; got != supervisor.StateStopped {
		t.Errorf("Status().State = %s, want stopped", got)
	}
}

func TestStartCancelled(t *testing.T) {
	// hang never completes the handshake.
	hang := filepath.Join(t.TempDir(), "hang")
	if err := os.WriteFile(hang, []byte("#!/bin/sh\nexec sleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	pol := testPolicy()
	pol.StartTimeout = time.Minute
	opts, _, _ := options(t, pol)
	before := children(t)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	s := supervisor.Spec{Name: "hang", Path: hang, Mount: "/hang", DataDir: t.TempDir(), Decode: staticConfig(`{}`)}

	begin := time.Now()
	p, err := supervisor.Start(ctx, s, opts)
	if err != nil {
		t.Fatalf("Start(hang) = %v, want nil (not a config error)", err)
	}
	t.Cleanup(func() { p.Stop(time.Now()) })
	if d := time.Since(begin); d > 20*time.Second {
		t.Errorf("Start took %v with a context that ended after 500ms, want it cut short", d)
	}
	waitState(t, p, supervisor.StateStopped)
	waitFor(t, 10*time.Second, "the hanging process to be gone", func() bool {
		for _, pid := range children(t) {
			if !slices.Contains(before, pid) {
				return false
			}
		}
		return true
	})
}

func TestStopWhileRestarting(t *testing.T) {
	// flaky is hello the first time and hangs in the handshake after, so
	// that the restart after a crash is stuck starting.
	dir := t.TempDir()
	flaky := filepath.Join(dir, "flaky")
	script := fmt.Sprintf("#!/bin/sh\nif [ -e %[1]q ]; then exec sleep 60; fi\n: > %[1]q\nexec %[2]q\n",
		filepath.Join(dir, "started"), filepath.Join(bin, "hello"))
	if err := os.WriteFile(flaky, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	pol := testPolicy()
	pol.StartTimeout = time.Minute
	s := helloSpec(t)
	s.Path = flaky
	before := children(t)
	f := start(t, s, pol)
	old := waitReady(t, f.p)

	mark := f.rec.len()
	if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the restart to be under way", func() bool {
		states := f.rec.since(mark)
		return slices.Contains(states, supervisor.StateBackoff) && f.p.Status().State == supervisor.StateStarting
	})
	waitFor(t, 30*time.Second, "the hanging process to start", func() bool { return len(children(t)) > len(before) })

	const drain = 500 * time.Millisecond
	begin := time.Now()
	f.p.Stop(begin.Add(drain))
	if d := time.Since(begin); d > drain+time.Second {
		t.Errorf("Stop of a plugin stuck starting took %v, want at most the %v deadline + 1s (start_timeout is a minute)", d, drain)
	}
	if got := f.p.Status().State; got != supervisor.StateStopped {
		t.Errorf("Status().State = %s, want stopped", got)
	}
	waitFor(t, 10*time.Second, "no plugin process to be left", func() bool {
		for _, pid := range children(t) {
			if !slices.Contains(before, pid) {
				return false
			}
		}
		return true
	})
}
