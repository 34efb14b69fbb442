package e2e

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// notifySocket is a NOTIFY_SOCKET as systemd makes one: a unixgram socket
// that reads sd_notify messages with their sender's credentials.
type notifySocket struct {
	path string
	// msgs are the messages other than WATCHDOG=1, in order; watchdogs
	// counts those.
	msgs      chan notifyMsg
	watchdogs atomic.Int64
}

// notifyMsg is one datagram: its assignments and its sender's pid.
type notifyMsg struct {
	vars map[string]string
	pid  int32
	raw  string
}

// listenNotify opens a notify socket, read until the test ends.
func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	// systemd asks for the sender's credentials, to accept only the main
	// process's messages (NotifyAccess=main); so does the test.
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1)
	}); err != nil || serr != nil {
		t.Fatalf("SO_PASSCRED: %v %v", err, serr)
	}
	s := &notifySocket{path: path, msgs: make(chan notifyMsg, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf, oob := make([]byte, 4096), make([]byte, 1024)
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			m := notifyMsg{vars: map[string]string{}, pid: -1, raw: string(buf[:n])}
			for line := range strings.SplitSeq(m.raw, "\n") {
				if k, v, ok := strings.Cut(line, "="); ok {
					m.vars[k] = v
				}
			}
			if cmsgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil && len(cmsgs) > 0 {
				if cred, err := syscall.ParseUnixCredentials(&cmsgs[0]); err == nil {
					m.pid = cred.Pid
				}
			}
			if m.raw == "WATCHDOG=1" {
				s.watchdogs.Add(1)
				continue
			}
			select {
			case s.msgs <- m:
			default:
				// More than the test reads: it fails on what it missed.
			}
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return s
}

// next returns the next message other than WATCHDOG=1, failing the test
// if none comes within d.
func (s *notifySocket) next(t *testing.T, d time.Duration, what string) notifyMsg {
	t.Helper()
	select {
	case m := <-s.msgs:
		return m
	case <-time.After(d):
		t.Fatalf("no sd_notify message within %v; want %s", d, what)
		return notifyMsg{}
	}
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, the clock of
// MONOTONIC_USEC.
func monotonicUsec(t *testing.T) int64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano() / 1000
}

// TestSystemdNotify runs the host as systemd runs a Type=notify unit with
// WatchdogSec=: NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID set. READY=1
// waits for the required plugins (frail refuses its config until the test
// lets it), not for an optional one that never becomes ready; a SIGHUP is
// RELOADING=1 with MONOTONIC_USEC, then READY=1 once the reloaded plugin
// serves its new config; SIGTERM is STOPPING=1. Every message comes from
// the host's own pid, as NotifyAccess=main requires, and WATCHDOG=1 comes
// every half of WATCHDOG_USEC.
func TestSystemdNotify(t *testing.T) {
	sock := listenNotify(t)
	data := t.TempDir()
	for dir, file := range map[string]string{"frail": "refuse", "spare": "corrupt"} {
		if err := os.MkdirAll(filepath.Join(data, dir), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(data, dir, file), []byte(dir+" is not ready yet"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	refuse := filepath.Join(data, "frail", "refuse")
	// frail's refusals are retried; enough of them that it does not fail
	// for good while the test waits.
	base := strings.Replace(withDataDir(t, baseConfig("2s"), data), "max_restarts    = 5", "max_restarts    = 1000", 1)
	plugins := pluginBlock("frail", "frail", "") + pluginBlock("spare", "frail", "  required = false")
	const watchdogUsec = 400_000
	h := waitServing(t, launchHostCmd(t, base+helloWith("one")+plugins, func(bin string, run []string) *exec.Cmd {
		// systemd sets WATCHDOG_PID to the pid it started, which exec keeps.
		cmd := exec.Command("/bin/sh", append([]string{"-c", `export WATCHDOG_PID=$$; exec "$@"`, "sh", bin}, run...)...)
		cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock.path, "WATCHDOG_USEC="+strconv.Itoa(watchdogUsec))
		return cmd
	}))
	pid := int32(h.cmd.Process.Pid)
	expect := func(m notifyMsg, want string) {
		t.Helper()
		if _, ok := m.vars[want]; !ok || m.vars[want] != "1" {
			t.Fatalf("sd_notify message %q, want %s=1", m.raw, want)
		}
		if m.pid != pid {
			t.Errorf("sd_notify %q came from pid %d, want the host's %d", m.raw, m.pid, pid)
		}
	}

	// Serving, but frail refuses its config: no READY=1 yet.
	waitFor(t, 10*time.Second, "frail to refuse its config", func() bool {
		return strings.Contains(h.log.String(), "frail is not ready yet")
	})
	select {
	case m := <-sock.msgs:
		t.Fatalf("sd_notify %q while the required frail refuses its config (/readyz %d)", m.raw, func() int { c, _ := h.get(h.ingress + "/readyz"); return c }())
	case <-time.After(time.Second):
	}
	if code, body := h.get(h.ingress + "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("GET /readyz while frail refuses = %d %s, want 503", code, body)
	}
	if v, ok := h.metric("plughost_ready"); !ok || v != 0 {
		t.Errorf("plughost_ready while frail refuses = %v (exported %t), want 0", v, ok)
	}
	if err := os.Remove(refuse); err != nil {
		t.Fatal(err)
	}
	expect(sock.next(t, 30*time.Second, "READY=1 once frail is ready"), "READY")
	// At the moment READY=1 arrives, every required plugin serves; the
	// optional one is still failing.
	if code, body := h.get(h.ingress + "/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz when READY=1 arrived = %d %s, want 200", code, body)
	}
	if v, ok := h.metric("plughost_ready"); !ok || v != 1 {
		t.Errorf("plughost_ready when READY=1 arrived = %v (exported %t), want 1", v, ok)
	}
	for _, name := range []string{"hello", "frail"} {
		if code, state := h.readiness(name); code != http.StatusOK || state != "ready" {
			t.Errorf("GET /readyz/%s when READY=1 arrived = %d %s, want 200 ready", name, code, state)
		}
	}
	if code, state := h.readiness("spare"); code == http.StatusOK {
		t.Errorf("GET /readyz/spare = %d %s, want it unready: READY=1 must not wait for an optional plugin, and this one cannot start", code, state)
	}

	// The watchdog is kept alive every WATCHDOG_USEC/2, from the start.
	waitFor(t, 5*time.Second, "WATCHDOG=1 keep-alives", func() bool { return sock.watchdogs.Load() >= 3 })

	// SIGHUP with a changed greeting: RELOADING=1 stamped now, then
	// READY=1 once hello answers with the new greeting.
	if err := os.WriteFile(h.cfgPath, []byte(base+helloWith("two")+plugins), 0o644); err != nil {
		t.Fatal(err)
	}
	before := monotonicUsec(t)
	h.signal(syscall.SIGHUP)
	m := sock.next(t, 10*time.Second, "RELOADING=1")
	after := monotonicUsec(t)
	expect(m, "RELOADING")
	if usec, err := strconv.ParseInt(m.vars["MONOTONIC_USEC"], 10, 64); err != nil || usec < before || usec > after {
		t.Errorf("RELOADING=1 with MONOTONIC_USEC %q, want CLOCK_MONOTONIC between %d and %d", m.vars["MONOTONIC_USEC"], before, after)
	}
	expect(sock.next(t, 30*time.Second, "READY=1 after the reload"), "READY")
	if code, body := h.greeting(); code != http.StatusOK || !strings.Contains(body, `"greeting":"two"`) {
		t.Errorf("GET /hello/ when READY=1 after the reload arrived = %d %s, want the new greeting", code, body)
	}

	h.signal(syscall.SIGTERM)
	expect(sock.next(t, 5*time.Second, "STOPPING=1"), "STOPPING")
	if code, ok := h.waitExit(10 * time.Second); !ok || code != 0 {
		t.Fatalf("host after SIGTERM: exited %t, code %d; want exit 0", ok, code)
	}
	select {
	case m := <-sock.msgs:
		t.Errorf("sd_notify %q after STOPPING=1", m.raw)
	default:
	}
}
