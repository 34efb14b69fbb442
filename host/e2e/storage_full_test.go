package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plughost/plughost/host/internal/testbin"
)

// tmpfsNamespace mounts a tmpfs of size at a new directory, in a mount
// namespace of its own (unshare -Urm) that a holder process keeps until
// the test's cleanup, so that hosts can be started, killed and started
// again on it (startHostIn). It returns the directory and the holder's
// pid; the tmpfs is reached from the test through /proc/PID/root. The
// test is skipped where the machine cannot mount a tmpfs there.
func tmpfsNamespace(t *testing.T, size string) (dir string, holder int) {
	t.Helper()
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skipf("no nsenter to start hosts in a private mount namespace: %v", err)
	}
	dir = t.TempDir()
	out := &testbin.SyncBuffer{}
	// cat holds the namespace until its stdin closes.
	cmd := exec.Command("unshare", "-Urm", "sh", "-c", `mount -t tmpfs -o size=`+size+` tmpfs "$1" && exec cat`, "sh", dir)
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot mount a tmpfs in a private mount namespace (unshare -Urm): %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		<-exited
	})
	pid := cmd.Process.Pid
	// Mounted once the shell has become cat.
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-exited:
			t.Skipf("cannot mount a tmpfs in a private mount namespace (unshare -Urm): %s", out.String())
		default:
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(b)) == "cat" {
			return dir, pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tmpfs holder (pid %d) did not mount its tmpfs in time: %s", pid, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startHostIn starts the host in the mount namespace of holder
// (tmpfsNamespace) and waits until it serves.
func startHostIn(t *testing.T, holder int, cfg string) *hostProc {
	t.Helper()
	return waitServing(t, launchHostCmd(t, cfg, func(bin string, run []string) *exec.Cmd {
		// nsenter execs the host, which keeps its pid.
		args := append([]string{"-t", strconv.Itoa(holder), "-U", "-m", "--preserve-credentials", "--", bin}, run...)
		return exec.Command("nsenter", args...)
	}))
}

// fillTmpfs writes a file at path until its file system has no space
// left, and returns the file's path; the file is removed on cleanup.
func fillTmpfs(t *testing.T, path string) string {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(path) })
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill the tmpfs: %v", err)
			}
			break
		}
	}
	if err := f.Close(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatal(err)
	}
	return path
}

// diskFullConfig is the config of the disk-full tests, on data dir data:
// baseConfig (whose max_restarts is baseMaxRestarts), with hello and the
// wallet, whose breaker opens after 3 failed commits and probes after a
// second.
func diskFullConfig(t *testing.T, data string) string {
	t.Helper()
	base := withDataDir(t, baseConfig("2s"), data)
	if budget := fmt.Sprintf("max_restarts    = %d", baseMaxRestarts); !strings.Contains(base, budget) {
		t.Fatalf("base config has no %s", budget)
	}
	return base + helloWith("hi") + walletBlock(`    breaker {
      failures  = 3
      cool_down = "1s"
      probes    = 2
    }`)
}

// baseMaxRestarts is baseConfig's max_restarts.
const baseMaxRestarts = 5

// fullWorkers is how many accounts the disk-full tests' transfers and
// issue load use: the load's accounts (startIssueLoad: name-00 ...) are
// those of the transfers, so that the supply is their balances' sum.
const fullWorkers = 4

// fullInitial is what each account is issued before the transfers.
const fullInitial = 1_000_000

// fullTransfers issues fullInitial to each of the accounts name-00 ...
// and makes perWorker acknowledged transfers from each, and returns the
// workers, which hold the acknowledged transfers.
func fullTransfers(t *testing.T, h *hostProc, name string, perWorker int) []*transferWorker {
	t.Helper()
	accounts := make([]string, fullWorkers)
	for i := range accounts {
		accounts[i] = fmt.Sprintf("%s-%02d", name, i)
		walletIssue(t, h, name+"-issue-"+accounts[i], accounts[i], fullInitial)
	}
	return transfersFrom(t, h, client, accounts, perWorker, 18)
}

// checkFullThenFree checks h while the wallet's tmpfs is full (filler
// fills it) and after filler is removed: the host serves hello; the
// wallet is listed and routed, and either down (503 with a JSON error)
// or up with writes refused (503 storage_unavailable), its reason saying
// no space is left; once the space is freed, with no operator action, it
// takes writes again, and every transfer acknowledged before (ws) is
// intact, as is every key of the load sent meanwhile.
func checkFullThenFree(t *testing.T, h *hostProc, name, filler string, ws []*transferWorker, startEnded func(storageStatus) bool) {
	t.Helper()
	// storageStatusOf fails the test if the wallet is not listed.
	var st storageStatus
	waitFor(t, hangGuard, "the wallet's start on the full disk to end, ready or with a last_error", func() bool {
		st = storageStatusOf(t, h, "wallet")
		return startEnded(st)
	})
	t.Logf("full: wallet %s, %d restarts, last_error %q, health %q %q", st.State, st.Restarts, st.LastError, st.Health, st.HealthReason)
	if code, body := h.greeting(); code != http.StatusOK {
		t.Errorf("GET /hello/ with the wallet's disk full = %d %s, want 200", code, body)
	}
	if code, body := h.get(h.ingress + "/wallet/v1/supply"); code != http.StatusOK && (code != http.StatusServiceUnavailable || errorCode(body) == "") {
		t.Errorf("GET /wallet/v1/supply with the disk full = %d %s, want 200, or 503 with a JSON error while the wallet is down", code, body)
	}

	load := startIssueLoad(t, h, name, fullWorkers, 50*time.Millisecond, 3000)
	full := time.Now()
	waitFor(t, 30*time.Second, "a POST refused with 503 and a JSON error while the disk is full", func() bool {
		for _, op := range load.snapshot() {
			if op.start.After(full) && op.err == nil && op.r.code == http.StatusServiceUnavailable && op.r.errCode() != "" {
				return true
			}
		}
		return false
	})
	waitFor(t, 30*time.Second, "the wallet to say no space is left on device (health_reason or last_error)", func() bool {
		st = storageStatusOf(t, h, "wallet")
		return strings.Contains(st.HealthReason, "no space left on device") || strings.Contains(st.LastError, "no space left on device")
	})
	t.Logf("full, under the load: wallet %s, %d restarts, last_error %q, health %q %q", st.State, st.Restarts, st.LastError, st.Health, st.HealthReason)
	// The disk stays full for longer than a wallet whose start fails
	// takes to be retried max_restarts times: until it is up (its
	// writes refused), failed, or retried more often than that.
	from := st.Restarts
	waitFor(t, hangGuard, fmt.Sprintf("the wallet to be ready, failed or retried more than max_restarts (%d) times with the disk full", baseMaxRestarts), func() bool {
		st = storageStatusOf(t, h, "wallet")
		return st.State == "ready" || st.State == "failed" || st.Restarts > from+baseMaxRestarts
	})
	t.Logf("full, %d restarts later: wallet %s, last_error %q, health %q %q", st.Restarts-from, st.State, st.LastError, st.Health, st.HealthReason)
	if st.State == "failed" {
		t.Errorf("wallet failed while its disk was full (last_error %q): once the space is freed it waits for an operator; want it retried until it starts", st.LastError)
	}

	freeSpace(t, filler, load, ", with no operator action")
	waitFor(t, 30*time.Second, "the wallet to be ready and healthy again", func() bool {
		st = storageStatusOf(t, h, "wallet")
		return st.State == "ready" && st.Health == ""
	})
	// Every answer while full was a 200 or a 503 with a JSON error.
	for _, op := range load.snapshot() {
		switch {
		case op.err != nil:
			t.Errorf("POST %s: %v, want an answer", op.key, op.err)
		case op.r.code == http.StatusOK:
		case op.r.code == http.StatusServiceUnavailable && op.r.errCode() != "":
		default:
			t.Errorf("POST %s = %v, want 200 or 503 with a JSON error", op.key, op.r)
		}
	}
	counts := load.finish(t, h, fullWorkers*fullInitial)
	if counts["503 storage_unavailable"]+counts["503 plugin_unavailable"] == 0 {
		t.Errorf("no POST was refused 503 storage_unavailable or plugin_unavailable: the disk was never full under the load")
	}

	// The transfers acknowledged before the disk filled: their receipts
	// and replays, and the nonces they set.
	var bad []string
	for _, w := range ws {
		bad = append(bad, w.verify(t.Context(), client, h.ingress)...)
		if a := walletAccount(t, h, w.from, 0); a.Nonce != w.nonce {
			t.Errorf("account %s nonce = %d, want %d: its acknowledged transfers", w.from, a.Nonce, w.nonce)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d acknowledged transfers are not in the ledger as acknowledged; first ones:\n%s", len(bad), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	select {
	case <-h.exited:
		t.Errorf("the host exited (%v), want it to stay up", h.exitErr)
	default:
	}
}

// TestStorageDiskFullAtStart kills the host (kill -9) with the wallet's
// data dir on an 8 MB tmpfs, fills the tmpfs to the last byte and starts
// a host on it: the host serves hello, the wallet is listed and routed,
// down or refusing writes, with a reason saying no space is left; once
// the space is freed it takes writes by itself, and every transfer
// acknowledged before is intact (checkFullThenFree).
func TestStorageDiskFullAtStart(t *testing.T) {
	data, holder := tmpfsNamespace(t, "8m")
	cfg := diskFullConfig(t, data)
	h := startHostIn(t, holder, cfg)
	old := readyPlugin(t, h, "wallet")
	ws := fullTransfers(t, h, "fullstart", 50)

	h.signal(syscall.SIGKILL)
	if _, ok := h.waitExit(5 * time.Second); !ok {
		t.Fatal("host still running 5s after SIGKILL")
	}
	if !waitGone(old.Pid, 5*time.Second) {
		t.Fatalf("wallet (pid %d) still alive 5s after kill -9 of the host", old.Pid)
	}
	mnt := filepath.Join(fmt.Sprintf("/proc/%d/root", holder), data)
	if _, err := os.Stat(filepath.Join(mnt, "wallet", "wallet.db")); err != nil {
		t.Fatalf("the wallet's file through /proc/PID/root: %v", err)
	}
	filler := fillTmpfs(t, filepath.Join(mnt, "filler"))

	h = startHostIn(t, holder, cfg)
	checkFullThenFree(t, h, "fullstart", filler, ws, func(st storageStatus) bool {
		return st.State == "ready" || st.LastError != ""
	})
}

// TestStorageDiskFullRestart fills the wallet's 8 MB tmpfs under the
// running host and has an operator restart the wallet through the admin
// API: the same as TestStorageDiskFullAtStart (checkFullThenFree).
func TestStorageDiskFullRestart(t *testing.T) {
	data, holder := tmpfsNamespace(t, "8m")
	cfg := diskFullConfig(t, data)
	h := startHostIn(t, holder, cfg)
	old := readyPlugin(t, h, "wallet")
	ws := fullTransfers(t, h, "fullrestart", 50)

	mnt := filepath.Join(fmt.Sprintf("/proc/%d/root", holder), data)
	filler := fillTmpfs(t, filepath.Join(mnt, "filler"))
	before := storageStatusOf(t, h, "wallet")
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/wallet/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST /v1/plugins/wallet/restart = %d %s, want 202", code, body)
	}
	if !waitGone(old.Pid, hangGuard) {
		t.Fatalf("wallet (pid %d) still alive after the operator's restart", old.Pid)
	}
	checkFullThenFree(t, h, "fullrestart", filler, ws, func(st storageStatus) bool {
		return st.Restarts > before.Restarts && (st.State == "ready" || st.LastError != "")
	})
}
