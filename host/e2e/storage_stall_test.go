package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// issueOp is one POST /wallet/v1/issue of a load, with its first answer.
type issueOp struct {
	key, body  string
	start, end time.Time
	r          walletResp
	err        error
}

// issueLoad is a load of issues of 1, each with a new key, to one account
// per worker, from workers each sending one every pace, or, with pace 0,
// one after another (a closed loop, to keep the wallet's commit queue
// full).
type issueLoad struct {
	accounts []string
	stop     func()
	done     chan struct{}
	mu       sync.Mutex
	ops      []issueOp
}

// startIssueLoad starts the load on h; it is stopped and waited for on
// cleanup. Each worker sends at most maxPerWorker.
func startIssueLoad(t *testing.T, h *hostProc, name string, workers int, pace time.Duration, maxPerWorker int) *issueLoad {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	t.Cleanup(tr.CloseIdleConnections)
	lc := &http.Client{Transport: tr, Timeout: 15 * time.Second}
	l := &issueLoad{done: make(chan struct{})}
	stop := make(chan struct{})
	l.stop = sync.OnceFunc(func() { close(stop) })
	var wg sync.WaitGroup
	for i := range workers {
		acct := fmt.Sprintf("%s-%02d", name, i)
		l.accounts = append(l.accounts, acct)
		wg.Go(func() {
			var tick <-chan time.Time // nil with pace 0: no waiting
			if pace > 0 {
				ticker := time.NewTicker(pace)
				defer ticker.Stop()
				tick = ticker.C
			}
			for n := range maxPerWorker {
				select {
				case <-stop:
					return
				default:
				}
				if tick != nil {
					select {
					case <-stop:
						return
					case <-tick:
					}
				}
				op := issueOp{key: fmt.Sprintf("%s-%d", acct, n), body: fmt.Sprintf(`{"to":%q,"amount":1}`, acct), start: time.Now()}
				op.r, op.err = walletPost(t.Context(), lc, h.ingress+"/wallet/v1/issue", op.key, op.body)
				op.end = time.Now()
				l.mu.Lock()
				l.ops = append(l.ops, op)
				l.mu.Unlock()
			}
		})
	}
	go func() {
		wg.Wait()
		close(l.done)
	}()
	t.Cleanup(func() {
		l.stop()
		<-l.done
	})
	return l
}

// freeSpace removes filler, the file that fills a data dir's disk, and
// waits for a POST of load sent after that to be answered 200, with
// whatever more what says.
func freeSpace(t *testing.T, filler string, load *issueLoad, what string) {
	t.Helper()
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	waitFor(t, 30*time.Second, "a POST sent after the space was freed to be answered 200"+what, func() bool {
		for _, op := range load.snapshot() {
			if op.start.After(freed) && op.err == nil && op.r.code == http.StatusOK {
				return true
			}
		}
		return false
	})
	t.Logf("POSTs succeed %v after the space was freed", time.Since(freed).Round(time.Millisecond))
}

// wait waits up to d for every request of the stopped load to be
// answered.
func (l *issueLoad) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(d):
		t.Fatalf("load requests still unanswered %v after it stopped", d)
	}
}

// snapshot returns the ops answered so far.
func (l *issueLoad) snapshot() []issueOp {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]issueOp(nil), l.ops...)
}

// finish stops the load, waits for its requests, and resolves every
// operation by its key: a 200 replays byte for byte, and every other
// answer (a 503, no answer) is retried with the same key and body until
// the wallet answers 200, a replay or its first commit. Then each key
// was applied exactly once: issued = base + one per operation, and the
// supply is the sum of the balances. It returns the first answers by
// status and error code.
func (l *issueLoad) finish(t *testing.T, h *hostProc, base uint64) map[string]int {
	t.Helper()
	l.stop()
	l.wait(t, 30*time.Second)
	counts := map[string]int{}
	var maxSeq uint64
	for _, op := range l.ops {
		first := "no answer"
		if op.err == nil {
			first = fmt.Sprintf("%d %s", op.r.code, op.r.errCode())
		}
		counts[first]++
		deadline := time.Now().Add(30 * time.Second)
		for {
			r, err := walletPost(t.Context(), client, h.ingress+"/wallet/v1/issue", op.key, op.body)
			if err == nil && r.code == http.StatusOK {
				if op.err == nil && op.r.code == http.StatusOK && (!bytes.Equal(r.body, op.r.body) || !r.replayed()) {
					t.Errorf("replay of acknowledged key %s = %v (Idempotent-Replayed %q), want %s, replayed", op.key, r, r.header.Get("Idempotent-Replayed"), bytes.TrimSpace(op.r.body))
				}
				rc, err := decodeReceipt(r.body)
				if err != nil {
					t.Fatal(err)
				}
				maxSeq = max(maxSeq, rc.Seq)
				break
			}
			if err == nil && r.code != http.StatusServiceUnavailable && r.code != http.StatusTooManyRequests && r.code != http.StatusConflict {
				t.Fatalf("retry of key %s (first answer %s) = %v, want 200 or a 503/429/409 to retry", op.key, first, r)
			}
			if time.Now().After(deadline) {
				t.Fatalf("key %s (first answer %s): no 200 within 30s of retries (last %v, %v)", op.key, first, r, err)
			}
			time.Sleep(50 * time.Millisecond) // pace the retries, as a client would
		}
	}
	s := supplyIsSum(t, h, l.accounts, maxSeq)
	if want := base + uint64(len(l.ops)); s.Issued != want {
		t.Errorf("issued = %d, want %d: %d before the load plus one per key of the load, each applied exactly once", s.Issued, want, base)
	}
	t.Logf("%d POSTs, first answers: %v", len(l.ops), counts)
	return counts
}

// getsOK polls GET /wallet/v1/accounts/{acct} until stop is closed and
// reports each answer that is not 200; wait for it with the returned
// function.
func getsOK(t *testing.T, h *hostProc, acct string) (stop func() []string) {
	t.Helper()
	quit := make(chan struct{})
	var bad []string
	var n int
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := &http.Client{Timeout: 10 * time.Second}
		for {
			select {
			case <-quit:
				return
			case <-time.After(50 * time.Millisecond):
			}
			resp, err := c.Get(h.ingress + "/wallet/v1/accounts/" + acct)
			n++
			if err != nil {
				bad = append(bad, err.Error())
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				bad = append(bad, fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(b)))
			}
		}
	}()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(quit) }); <-done })
	return func() []string {
		once.Do(func() { close(quit) })
		<-done
		if n == 0 {
			t.Errorf("no GET was made")
		}
		return bad
	}
}

// TestStorageStall stalls the log's fdatasync (the fault point
// ledger.sync, inside the log write) for 6 × commit_timeout under a
// steady POST load: POSTs answer 503 storage_unavailable with Retry-After
// within about commit_timeout, GETs answer 200 throughout, the breaker
// opens (degraded, /readyz/wallet 503). Once the fault is cleared and
// the stalled syncs return, POSTs succeed again, and every operation is
// resolved by its key: each 200 replays, each other answer is retried
// to a 200, and every key was applied exactly once.
func TestStorageStall(t *testing.T) {
	const commitTimeout = 500 * time.Millisecond
	h := startHost(t, baseConfig("2s")+faultsOn+stallWalletBlock(commitTimeout))
	readyPlugin(t, h, "wallet")
	walletIssue(t, h, "stall-base", "stall-00", 1000)

	load := startIssueLoad(t, h, "stall", 4, 20*time.Millisecond, 2000)
	stopGets := getsOK(t, h, "stall-00")
	waitFor(t, 10*time.Second, "50 POSTs acknowledged before the stall", func() bool {
		n := 0
		for _, op := range load.snapshot() {
			if op.err == nil && op.r.code == http.StatusOK {
				n++
			}
		}
		return n >= 50
	})

	setFaults(t, h, "wallet", fmt.Sprintf(`{"faults":[{"point":"ledger.sync","delay":%q}]}`, (6*commitTimeout).String()))
	stalled := time.Now()
	waitFor(t, 10*time.Second, "the wallet to be degraded, with /readyz/wallet 503", func() bool {
		st := storageStatusOf(t, h, "wallet")
		code, _ := h.readiness("wallet")
		return st.Health == "degraded" && code == http.StatusServiceUnavailable
	})
	t.Logf("degraded %v after the stall began: %s", time.Since(stalled).Round(time.Millisecond), storageStatusOf(t, h, "wallet").HealthReason)
	waitFor(t, 5*time.Second, "the breaker to open", func() bool {
		v, ok := h.metric(`wallet_breaker_state{plugin="wallet"}`)
		return ok && v == 1
	})
	// Keep the stall for 3 s more of load.
	measureFrom := time.Now()
	waitFor(t, 10*time.Second, "3s of load during the stall", func() bool { return time.Since(measureFrom) > 3*time.Second })
	// A retry of a key answered outcome_unknown, while the disk still
	// stalls: its key stays claimed until the commit is known, so it is
	// 409 in use (or, once landed, the replay), never a 503 that says
	// nothing was applied.
	retried := 0
	for _, op := range load.snapshot() {
		if op.err != nil || op.r.errCode() != "outcome_unknown" {
			continue
		}
		r, err := walletPost(t.Context(), client, h.ingress+"/wallet/v1/issue", op.key, op.body)
		switch {
		case err != nil:
			t.Errorf("retry of %s (outcome_unknown) during the stall: %v", op.key, err)
		case r.code == http.StatusConflict && r.errCode() == "idempotency_key_in_use", r.code == http.StatusOK && r.replayed():
			retried++
		default:
			t.Errorf("retry of %s (outcome_unknown) during the stall = %v, want 409 idempotency_key_in_use or the replay", op.key, r)
		}
	}
	if retried == 0 {
		t.Error("no POST was answered outcome_unknown during the stall: the stall did not hit a commit")
	}
	setFaults(t, h, "wallet", "")
	cleared := time.Now()

	// POSTs sent during the stall, after the first stalled commit timed
	// out: answered 503 storage_unavailable (or outcome_unknown, for the
	// group whose record was written when the sync stalled) with a
	// Retry-After, within about commit_timeout.
	var took []time.Duration
	for _, op := range load.snapshot() {
		if op.start.Before(stalled.Add(2*commitTimeout)) || op.start.After(cleared) {
			continue
		}
		switch {
		case op.err != nil:
			t.Errorf("POST %s during the stall: %v, want 503", op.key, op.err)
		case op.r.code != http.StatusServiceUnavailable || (op.r.errCode() != "storage_unavailable" && op.r.errCode() != "outcome_unknown"):
			t.Errorf("POST %s during the stall = %v, want 503 storage_unavailable", op.key, op.r)
		default:
			if _, err := retryAfter(op.r); err != nil {
				t.Errorf("POST %s during the stall: %v", op.key, err)
			}
			took = append(took, op.end.Sub(op.start))
		}
	}
	if len(took) < 20 {
		t.Fatalf("%d POSTs answered 503 during the stall, want >= 20: the load did not cover it", len(took))
	}
	slices.Sort(took)
	median, worst := took[len(took)/2], took[len(took)-1]
	t.Logf("%d POSTs during the stall: 503 in median %v, at worst %v", len(took), median.Round(time.Millisecond), worst.Round(time.Millisecond))
	if median > 2*commitTimeout {
		t.Errorf("POSTs during the stall answered 503 in median %v, want within about commit_timeout (< 2 × %v)", median, commitTimeout)
	}
	if worst > 5*commitTimeout {
		t.Errorf("a POST during the stall took %v to be answered, want < 5 × commit_timeout = %v", worst, 5*commitTimeout)
	}

	// The stall ends (the syncs already stalled return), and POSTs
	// succeed again by themselves.
	waitFor(t, 20*time.Second, "a POST sent after the fault was cleared to be answered 200", func() bool {
		for _, op := range load.snapshot() {
			if op.start.After(cleared) && op.err == nil && op.r.code == http.StatusOK {
				return true
			}
		}
		return false
	})
	t.Logf("POSTs succeed %v after the fault was cleared", time.Since(cleared).Round(time.Millisecond))
	if bad := stopGets(); len(bad) > 0 {
		t.Errorf("%d GETs were not answered 200 during the load; first: %v", len(bad), bad[:min(len(bad), 5)])
	}
	load.finish(t, h, 1000)
}

// TestStorageScrubber flips a byte of a stored value in wallet.db under
// the running, idle wallet: the scrubber finds it (store_corruption_total
// >= 1) within a pass over the file that began after the flip, the
// wallet turns degraded with a reason that says its storage is corrupt,
// /readyz/wallet answers 503, and POSTs are refused.
func TestStorageScrubber(t *testing.T) {
	data := t.TempDir()
	h := startHost(t, withDataDir(t, baseConfig("2s"), data)+walletBlock(""))
	readyPlugin(t, h, "wallet")

	// An account whose id appears nowhere else but in its own records
	// (its account value, its issue's receipt and idempotency record).
	const target = "scrubtarget-5f3a9c0e7d2b4a61"
	for i := range 50 {
		walletIssue(t, h, fmt.Sprintf("scrub-load-%d", i), fmt.Sprintf("scrub-%02d", i%8), 10)
	}
	walletIssue(t, h, "scrub-target", target, 1000)
	for i := range 20 {
		walletIssue(t, h, fmt.Sprintf("scrub-after-%d", i), fmt.Sprintf("scrub-%02d", i%8), 10)
	}
	// Idle: the groups reach the bbolt file with the checkpoints the
	// committer runs once the oldest group is due. Flip only once the
	// last of them has committed: a checkpoint still under way may
	// rewrite the target's leaf copy-on-write after the file is read (or
	// hold it in memory, read before the flip), and the live page would
	// then be one the flip never touched. With nothing in the log and no
	// checkpoint running, an idle wallet writes nothing more (the test
	// sends nothing, an idle sweep logs no group): the file read is the
	// file the scrubber reads.
	waitFor(t, hangGuard, "the checkpoints to write every group into wallet.db (wallet_checkpoint_lag_seconds 0)", func() bool {
		v, ok := h.metric(`wallet_checkpoint_lag_seconds{plugin="wallet"}`)
		return ok && v == 0
	})
	db := filepath.Join(data, "wallet", "wallet.db")
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int
	for i := 0; ; {
		j := bytes.Index(b[i:], []byte(target))
		if j < 0 {
			break
		}
		offs = append(offs, i+j)
		i += j + len(target)
	}
	if len(offs) == 0 {
		t.Fatalf("%q is not in wallet.db with every group checkpointed", target)
	}
	if v, ok := h.metric(`store_corruption_total{plugin="wallet"}`); !ok || v != 0 {
		t.Fatalf(`store_corruption_total{plugin="wallet"} before the flip = %v (present %t), want 0`, v, ok)
	}
	// The id is inside a key or a value of a leaf (an account key, a
	// receipt's JSON), each covered by its value's checksum; flip the
	// last byte of every copy, so that the one in the live page is hit
	// whichever it is (copy-on-write leaves older copies in free pages).
	for _, off := range offs {
		flipByte(t, db, int64(off+len(target)-1))
	}
	t.Logf("flipped a byte in %d copies of %q in wallet.db", len(offs), target)

	// The pass under way may have checked the target before the flip;
	// the one after it began after the flip, and must find it.
	passes := func() float64 {
		v, ok := h.metric(`wallet_scrub_passes_total{plugin="wallet"}`)
		if !ok {
			t.Fatal(`no wallet_scrub_passes_total{plugin="wallet"}`)
		}
		return v
	}
	corruption := func() float64 {
		v, _ := h.metric(`store_corruption_total{plugin="wallet"}`)
		return v
	}
	flipped := passes()
	waitFor(t, hangGuard, "the scrubber to find the damage or complete a pass begun after the flip", func() bool {
		return corruption() >= 1 || passes() >= flipped+2
	})
	if v := corruption(); v < 1 {
		t.Fatalf("store_corruption_total = %v after the scrubber completed %v passes over wallet.db since the flip, the last begun after it; want >= 1", v, passes()-flipped)
	}
	var st storageStatus
	waitFor(t, 10*time.Second, "the wallet to be degraded, storage corrupt", func() bool {
		st = storageStatusOf(t, h, "wallet")
		return st.Health == "degraded" && strings.Contains(st.HealthReason, "storage corrupt")
	})
	t.Logf("wallet health_reason: %s", st.HealthReason)
	if st.State != "ready" || st.Restarts != 0 {
		t.Errorf("wallet = %s with %d restarts, want ready (degraded) with 0: the scrubber refuses writes, it does not stop the plugin", st.State, st.Restarts)
	}
	if code, state := h.readiness("wallet"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz/wallet = %d %s, want 503", code, state)
	}
	r := mustPost(t, h, "/wallet/v1/issue", "scrub-refused", `{"to":"scrub-00","amount":1}`)
	if r.code == http.StatusOK {
		t.Errorf("POST after the scrubber found damage = %v, want it refused", r)
	}
	t.Logf("POST after the scrubber found damage: %v", r)
}

// TestStorageDiskFull runs the host with its data_dir on an 8 MB tmpfs,
// mounted in a mount namespace of its own, and fills that tmpfs (through
// /proc/PID/root) under a steady POST load. The write that hits ENOSPC
// is the log's append past the end of its file (the log is reused in
// place only up to the size it has grown to) and the checkpoint's growth
// of the bbolt file, whichever comes first. While full: POSTs answer 503
// storage_unavailable with Retry-After, GETs 200, the wallet is degraded
// with "no space left on device" and /readyz/wallet 503. Once the filler
// is removed, the wallet resumes by itself (no restart), and every key
// of the load resolves to exactly one commit.
func TestStorageDiskFull(t *testing.T) {
	data := t.TempDir()
	if out, err := exec.Command("unshare", "-Urm", "sh", "-c", `mount -t tmpfs -o size=8m tmpfs "$1"`, "sh", data).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs in a private mount namespace (unshare -Urm): %v: %s", err, out)
	}
	cfg := withDataDir(t, baseConfig("2s"), data) + walletBlock(`    breaker {
      failures  = 3
      cool_down = "1s"
      probes    = 2
    }`)
	h := waitServing(t, launchHostCmd(t, cfg, func(bin string, run []string) *exec.Cmd {
		script := `mount -t tmpfs -o size=8m tmpfs "$1" && shift && exec "$@"`
		return exec.Command("unshare", append([]string{"-Urm", "sh", "-c", script, "sh", data, bin}, run...)...)
	}))
	readyPlugin(t, h, "wallet")
	mnt := filepath.Join(fmt.Sprintf("/proc/%d/root", h.cmd.Process.Pid), data)
	if _, err := os.Stat(filepath.Join(mnt, "wallet", "wallet.db")); err != nil {
		t.Fatalf("the wallet's file through /proc/PID/root: %v", err)
	}
	var base uint64
	for i := range 20 {
		walletIssue(t, h, fmt.Sprintf("full-base-%d", i), "full-00", 1)
		base++
	}

	// Fill the tmpfs to the last byte.
	filler := fillTmpfs(t, filepath.Join(mnt, "filler"))

	load := startIssueLoad(t, h, "full", 4, 20*time.Millisecond, 3000)
	stopGets := getsOK(t, h, "full-00")
	var st storageStatus
	waitFor(t, 30*time.Second, "the wallet to be degraded with no space left on device, /readyz/wallet 503", func() bool {
		st = storageStatusOf(t, h, "wallet")
		code, _ := h.readiness("wallet")
		return st.Health == "degraded" && strings.Contains(st.HealthReason, "no space left on device") && code == http.StatusServiceUnavailable
	})
	t.Logf("full: wallet %s, health_reason %q", st.State, st.HealthReason)
	restarts := st.Restarts
	full := time.Now()
	waitFor(t, 10*time.Second, "POSTs refused with 503 while the disk is full", func() bool {
		for _, op := range load.snapshot() {
			if op.start.After(full) && op.err == nil && op.r.code == http.StatusServiceUnavailable {
				return true
			}
		}
		return false
	})

	freeSpace(t, filler, load, "")
	waitFor(t, 15*time.Second, "the wallet's health to be ready again", func() bool {
		return storageStatusOf(t, h, "wallet").Health == ""
	})
	if st := storageStatusOf(t, h, "wallet"); st.State != "ready" || st.Restarts != restarts {
		t.Errorf("wallet after the space was freed = %s with %d restarts, want ready with %d: it resumes by itself", st.State, st.Restarts, restarts)
	}
	// Every answer while full was a 200 or a 503 storage_unavailable
	// with a Retry-After.
	for _, op := range load.snapshot() {
		switch {
		case op.err != nil:
			t.Errorf("POST %s: %v, want an answer", op.key, op.err)
		case op.r.code == http.StatusOK:
		case op.r.code == http.StatusServiceUnavailable && (op.r.errCode() == "storage_unavailable" || op.r.errCode() == "outcome_unknown"):
			if _, err := retryAfter(op.r); err != nil {
				t.Errorf("POST %s: %v", op.key, err)
			}
		default:
			t.Errorf("POST %s = %v, want 200 or 503 storage_unavailable", op.key, op.r)
		}
	}
	if bad := stopGets(); len(bad) > 0 {
		t.Errorf("%d GETs were not answered 200; first: %v", len(bad), bad[:min(len(bad), 5)])
	}
	counts := load.finish(t, h, base)
	if counts["503 storage_unavailable"] == 0 {
		t.Errorf("no POST was answered 503 storage_unavailable: the disk never filled under the load")
	}
}

// TestStorageStallDrain sends SIGTERM to the host while the wallet's
// fdatasync is stalled for longer than the drain deadline: the host
// still exits within drain_deadline + 1s (the wallet stops waiting for
// the stalled commit and leaves its ledger open). A new host on the same
// data dir recovers from the log: every acknowledged issue replays, the
// stalled one resolves by its key, and supply = issued = Σ balances.
func TestStorageStallDrain(t *testing.T) {
	const drainDeadline = 2 * time.Second
	data := t.TempDir()
	cfg := withDataDir(t, baseConfig(drainDeadline.String()), data) + faultsOn + walletBlock(`    commit_timeout = "500ms"`)
	h := startHost(t, cfg)
	readyPlugin(t, h, "wallet")
	type acked struct {
		key, body string
		r         walletResp
	}
	var acks []acked
	for i := range 20 {
		key, body := fmt.Sprintf("drain-stall-%d", i), fmt.Sprintf(`{"to":"drain-stall-%02d","amount":%d}`, i%4, 10+i)
		r := mustPost(t, h, "/wallet/v1/issue", key, body)
		if r.code != http.StatusOK {
			t.Fatalf("POST %s before the stall = %v, want 200", key, r)
		}
		acks = append(acks, acked{key, body, r})
	}

	setFaults(t, h, "wallet", `{"faults":[{"point":"ledger.sync","delay":"30s"}]}`)
	const stalledKey, stalledBody = "drain-stall-stalled", `{"to":"drain-stall-00","amount":7}`
	if r := mustPost(t, h, "/wallet/v1/issue", stalledKey, stalledBody); r.code != http.StatusServiceUnavailable || r.errCode() != "outcome_unknown" {
		t.Fatalf("POST during the stall = %v, want 503 outcome_unknown", r)
	}
	begin := time.Now()
	h.signal(syscall.SIGTERM)
	code, ok := h.waitExit(drainDeadline + 10*time.Second)
	took := time.Since(begin)
	if !ok {
		t.Fatalf("host still running %v after SIGTERM with the wallet's disk stalled", took)
	}
	t.Logf("host exited %v after SIGTERM (code %d) with the wallet's fdatasync stalled", took.Round(time.Millisecond), code)
	if limit := drainDeadline + time.Second; took > limit {
		t.Errorf("host exited %v after SIGTERM, want within drain_deadline + 1s = %v", took, limit)
	}

	h = startHost(t, withDataDir(t, baseConfig(drainDeadline.String()), data)+walletBlock(""))
	readyPlugin(t, h, "wallet")
	var maxSeq uint64
	for _, a := range acks {
		r := mustPost(t, h, "/wallet/v1/issue", a.key, a.body)
		if r.code != http.StatusOK || !r.replayed() || !bytes.Equal(r.body, a.r.body) {
			t.Errorf("replay of acknowledged %s after the restart = %v, want its receipt replayed", a.key, r)
		}
		if rc, err := decodeReceipt(r.body); err == nil {
			maxSeq = max(maxSeq, rc.Seq)
		}
	}
	r := mustPost(t, h, "/wallet/v1/issue", stalledKey, stalledBody)
	if r.code != http.StatusOK {
		t.Fatalf("retry of the stalled key after the restart = %v, want 200", r)
	}
	t.Logf("the stalled issue after the restart: replayed %t", r.replayed())
	rc, err := decodeReceipt(r.body)
	if err != nil {
		t.Fatal(err)
	}
	s := supplyIsSum(t, h, []string{"drain-stall-00", "drain-stall-01", "drain-stall-02", "drain-stall-03"}, max(maxSeq, rc.Seq))
	var want uint64 = 7
	for i := range 20 {
		want += uint64(10 + i)
	}
	if s.Issued != want || s.Supply != want {
		t.Errorf("after the restart issued = %d, supply = %d; want both %d (every acknowledged issue and the stalled one once)", s.Issued, s.Supply, want)
	}
}

// TestStorageRecoversWithoutWrites: after commits failed and the breaker
// opened (/readyz/wallet 503), clearing the fault brings /readyz/wallet
// back to 200 with no POST sent: the wallet probes its disk itself, so a
// load balancer that took writes away on the 503 sees it recover.
func TestStorageRecoversWithoutWrites(t *testing.T) {
	h := startHost(t, baseConfig("2s")+faultsOn+walletBlock(`    breaker {
      failures  = 1
      cool_down = "1s"
    }`))
	readyPlugin(t, h, "wallet")
	walletIssue(t, h, "recover-base", "recover-00", 10)

	setFaults(t, h, "wallet", `{"faults":[{"point":"ledger.commit","error":"EIO"}]}`)
	if r := mustPost(t, h, "/wallet/v1/issue", "recover-failed", `{"to":"recover-00","amount":1}`); r.code != http.StatusServiceUnavailable {
		t.Fatalf("POST with the commit failing = %v, want 503", r)
	}
	waitFor(t, 10*time.Second, "/readyz/wallet to answer 503", func() bool {
		code, _ := h.readiness("wallet")
		return code == http.StatusServiceUnavailable
	})
	// The probes fail while the fault lasts: still 503 after a cool-down.
	waitFor(t, 10*time.Second, "a probe to fail", func() bool {
		return strings.Contains(h.log.String(), "ledger probe failed")
	})
	if code, state := h.readiness("wallet"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz/wallet while the fault lasts = %d %s, want 503", code, state)
	}

	setFaults(t, h, "wallet", "")
	cleared := time.Now()
	waitFor(t, 15*time.Second, "/readyz/wallet to answer 200 again with no POST sent", func() bool {
		code, _ := h.readiness("wallet")
		return code == http.StatusOK
	})
	t.Logf("/readyz/wallet 200 again %v after the fault was cleared, with no write sent", time.Since(cleared).Round(time.Millisecond))
	r := mustPost(t, h, "/wallet/v1/issue", "recover-after", `{"to":"recover-00","amount":1}`)
	if r.code != http.StatusOK {
		t.Errorf("POST after the recovery = %v, want 200", r)
	}
}

// stopProcess sends SIGSTOP to pid and waits until each of its threads
// has stopped: a write it had under way has then returned, and nothing
// it does changes its files until SIGCONT or SIGKILL.
func stopProcess(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop pid %d: %v", pid, err)
	}
	waitFor(t, time.Minute, fmt.Sprintf("every thread of pid %d to stop", pid), func() bool {
		return allStopped(t, pid)
	})
}

// allStopped reports whether every thread of pid is stopped by a signal.
func allStopped(t *testing.T, pid int) bool {
	t.Helper()
	if runtime.GOOS != "linux" {
		out, err := exec.Command("ps", "-o", "state=", "-p", strconv.Itoa(pid)).Output()
		if err != nil {
			t.Fatalf("ps -p %d: %v", pid, err)
		}
		return strings.HasPrefix(strings.TrimSpace(string(out)), "T")
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of pid %d: %v (%d found)", pid, err, len(tasks))
	}
	for _, path := range tasks {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread has exited
		}
		// The state follows the parenthesised command name.
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i < 0 || i+2 >= len(s) || s[i+2] != 'T' {
			return false
		}
	}
	return true
}
