package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The wallet tests drive plugins/wallet through the real host: every
// request crosses the ingress, gRPC and the plugin's bbolt ledger. Paths
// and JSON shapes are those of docs/plugins/wallet.md.

// faultsOn is the host config block that enables the admin fault API.
const faultsOn = "debug {\n  faults = true\n}\n"

// walletBlock returns the wallet's plugin block; config holds the lines of
// its config block.
func walletBlock(config string) string {
	return pluginBlock("wallet", "wallet", "  config {\n"+config+"\n  }")
}

// receipt is a wallet receipt, as POSTs and GET /v1/receipts/{tx_id}
// answer it (batch legs left out: these tests send no batches).
type receipt struct {
	TxID        string    `json:"tx_id"`
	Kind        string    `json:"kind"`
	From        string    `json:"from,omitempty"`
	To          string    `json:"to,omitempty"`
	Amount      uint64    `json:"amount"`
	Nonce       uint64    `json:"nonce,omitempty"`
	Seq         uint64    `json:"seq"`
	CommittedAt time.Time `json:"committed_at"`
}

// accountSnap is GET /wallet/v1/accounts/{id}.
type accountSnap struct {
	Account string `json:"account"`
	Balance uint64 `json:"balance"`
	Nonce   uint64 `json:"nonce"`
	Seq     uint64 `json:"seq"`
}

// supplySnap is GET /wallet/v1/supply.
type supplySnap struct {
	Issued uint64 `json:"issued"`
	Burned uint64 `json:"burned"`
	Supply uint64 `json:"supply"`
	Seq    uint64 `json:"seq"`
}

// walletResp is one answer of the wallet, read whole.
type walletResp struct {
	code   int
	header http.Header
	body   []byte
}

func (r walletResp) errCode() string { return errorCode(string(r.body)) }

func (r walletResp) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

func (r walletResp) String() string {
	return fmt.Sprintf("%d %s", r.code, bytes.TrimSpace(r.body))
}

// walletPost sends one POST with an Idempotency-Key. An error means the
// outcome is unknown: the request may or may not have been applied.
func walletPost(ctx context.Context, c *http.Client, url, key, body string) (walletResp, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return walletResp{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return walletResp{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return walletResp{}, err
	}
	return walletResp{code: resp.StatusCode, header: resp.Header, body: b}, nil
}

// mustPost is walletPost on the test goroutine, through h's ingress.
func mustPost(t *testing.T, h *hostProc, path, key, body string) walletResp {
	t.Helper()
	r, err := walletPost(t.Context(), client, h.ingress+path, key, body)
	if err != nil {
		t.Fatalf("POST %s (key %s): %v", path, key, err)
	}
	return r
}

// decodeReceipt decodes a 200's receipt.
func decodeReceipt(b []byte) (receipt, error) {
	var rc receipt
	if err := json.Unmarshal(b, &rc); err != nil {
		return rc, fmt.Errorf("decode receipt %q: %w", b, err)
	}
	if rc.TxID == "" || rc.Seq == 0 {
		return rc, fmt.Errorf("receipt %q has no tx_id or seq", b)
	}
	return rc, nil
}

// walletIssue mints amount into account with key and fails the test
// unless the wallet answers 200.
func walletIssue(t *testing.T, h *hostProc, key, to string, amount uint64) receipt {
	t.Helper()
	r := mustPost(t, h, "/wallet/v1/issue", key, fmt.Sprintf(`{"to":%q,"amount":%d}`, to, amount))
	if r.code != http.StatusOK {
		t.Fatalf("POST /wallet/v1/issue {to %s, amount %d} = %v, want 200", to, amount, r)
	}
	rc, err := decodeReceipt(r.body)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// walletGet GETs path under the wallet and decodes its 200 into v.
func walletGet(t *testing.T, h *hostProc, path string, v any) {
	t.Helper()
	code, body := h.get(h.ingress + path)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d %s, want 200", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: decode %s: %v", path, body, err)
	}
}

// walletAccount reads an account from a snapshot that includes seq minSeq.
func walletAccount(t *testing.T, h *hostProc, id string, minSeq uint64) accountSnap {
	t.Helper()
	var a accountSnap
	walletGet(t, h, fmt.Sprintf("/wallet/v1/accounts/%s?min_seq=%d&wait=3s", id, minSeq), &a)
	if a.Seq < minSeq {
		t.Fatalf("GET /wallet/v1/accounts/%s?min_seq=%d answered a snapshot at seq %d, want >= %d", id, minSeq, a.Seq, minSeq)
	}
	return a
}

// walletSupply reads the supply from a snapshot that includes seq minSeq.
func walletSupply(t *testing.T, h *hostProc, minSeq uint64) supplySnap {
	t.Helper()
	var s supplySnap
	walletGet(t, h, fmt.Sprintf("/wallet/v1/supply?min_seq=%d&wait=3s", minSeq), &s)
	if s.Seq < minSeq {
		t.Fatalf("GET /wallet/v1/supply?min_seq=%d answered a snapshot at seq %d, want >= %d", minSeq, s.Seq, minSeq)
	}
	if s.Supply != s.Issued-s.Burned {
		t.Errorf("supply = %+v: supply != issued − burned", s)
	}
	return s
}

// setFaults replaces plugin's faults through the admin API; body "" clears
// them.
func setFaults(t *testing.T, h *hostProc, plugin, body string) {
	t.Helper()
	method := http.MethodPost
	if body == "" {
		method = http.MethodDelete
	}
	code, got := do(t, method, h.admin+"/v1/plugins/"+plugin+"/faults", strings.NewReader(body), nil)
	if code != http.StatusOK {
		t.Fatalf("%s /v1/plugins/%s/faults %s = %d %s, want 200", method, plugin, body, code, got)
	}
}

// healthStatus is the part of a plugin's status the wallet tests read
// besides pluginStatus: its health, "" when ready.
type healthStatus struct {
	Name   string `json:"name"`
	State  string `json:"state"`
	Health string `json:"health"`
}

// pluginHealth returns the health the host shows for plugin in
// GET /v1/plugins (admin) and GET /readyz (ingress), and /readyz's status.
func pluginHealth(t *testing.T, h *hostProc, plugin string) (admin, ready string, readyCode int) {
	t.Helper()
	var list []healthStatus
	code, body := h.get(h.admin + "/v1/plugins")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/plugins = %d %s", code, body)
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("decode /v1/plugins: %v: %s", err, body)
	}
	for _, p := range list {
		if p.Name == plugin {
			admin = p.Health
		}
	}
	var rz struct {
		Plugins []healthStatus `json:"plugins"`
	}
	readyCode, body = h.get(h.ingress + "/readyz")
	if err := json.Unmarshal([]byte(body), &rz); err != nil {
		t.Fatalf("decode /readyz: %v: %s", err, body)
	}
	for _, p := range rz.Plugins {
		if p.Name == plugin {
			ready = p.Health
		}
	}
	return admin, ready, readyCode
}

// retryAfter checks that a 429 or 503 carries a Retry-After of whole
// seconds, at least 1, and returns it.
func retryAfter(r walletResp) (int, error) {
	s := r.header.Get("Retry-After")
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%d answer has Retry-After %q, want whole seconds >= 1", r.code, s)
	}
	return n, nil
}

// notApplied reports whether a non-200 answer says for sure that the
// operation was not applied, so that a client may give up its key and try
// again with a new one. 429 (the wallet's queue or the host's in-flight
// cap) and the wallet's own 503s are refusals before or instead of a
// commit. The host's 503 plugin_unavailable is not: the plugin may have
// died after committing.
func notApplied(r walletResp) bool {
	switch r.code {
	case http.StatusTooManyRequests:
		return true
	case http.StatusServiceUnavailable:
		switch r.errCode() {
		case "storage_unavailable", "draining", "not_configured":
			return true
		}
	}
	return false
}

// stallWalletBlock is the wallet block of the stall tests: commit_timeout
// commitTimeout, and a breaker that opens after 3 failures and probes
// after a second.
func stallWalletBlock(commitTimeout time.Duration) string {
	return walletBlock(fmt.Sprintf(`    commit_timeout = %q
    breaker {
      failures  = 3
      cool_down = "1s"
      probes    = 2
    }`, commitTimeout))
}

func TestWalletLedgerStall(t *testing.T) {
	const commitTimeout = 500 * time.Millisecond
	h := startHost(t, baseConfig("2s")+faultsOn+stallWalletBlock(commitTimeout))
	readyPlugin(t, h, "wallet")

	const acct = "stall-a"
	issued := walletIssue(t, h, "stall-first", acct, 1000).Amount
	keys := 0
	issue := func() (walletResp, time.Duration) {
		t.Helper()
		keys++
		start := time.Now()
		r := mustPost(t, h, "/wallet/v1/issue", fmt.Sprintf("stall-%d", keys), fmt.Sprintf(`{"to":%q,"amount":100}`, acct))
		return r, time.Since(start)
	}
	// During the stall a POST is answered 503 storage_unavailable with a
	// Retry-After, within about the commit timeout.
	bound := commitTimeout + 1500*time.Millisecond
	checkStalled := func(what string, r walletResp, took time.Duration) {
		t.Helper()
		if r.code != http.StatusServiceUnavailable || r.errCode() != "storage_unavailable" {
			t.Errorf("%s during the stall = %v, want 503 storage_unavailable", what, r)
		}
		if _, err := retryAfter(r); err != nil {
			t.Errorf("%s during the stall: %v", what, err)
		}
		if took > bound {
			t.Errorf("%s during the stall took %v, want within commit_timeout + 1.5s = %v", what, took, bound)
		}
	}

	setFaults(t, h, "wallet", `{"faults":[{"point":"ledger.commit","delay":"5s"}]}`)
	stalled := time.Now()
	for i := range 5 {
		r, took := issue()
		t.Logf("POST %d during the stall: %d %s in %v", i, r.code, r.errCode(), took.Round(time.Millisecond))
		checkStalled(fmt.Sprintf("POST %d", i), r, took)
		a := walletAccount(t, h, acct, 0)
		if a.Balance != issued {
			t.Errorf("GET /wallet/v1/accounts/%s during the stall: balance %d, want %d", acct, a.Balance, issued)
		}
	}
	// A burst of concurrent POSTs: each gets its 503 within the bound too,
	// whether it is refused by the open breaker or queued behind a probe.
	type timed struct {
		r    walletResp
		took time.Duration
		err  error
	}
	burst := make([]timed, 8)
	var bwg sync.WaitGroup
	for i := range burst {
		bwg.Go(func() {
			start := time.Now()
			r, err := walletPost(t.Context(), client, h.ingress+"/wallet/v1/issue", fmt.Sprintf("stall-burst-%d", i), fmt.Sprintf(`{"to":%q,"amount":100}`, acct))
			burst[i] = timed{r, time.Since(start), err}
		})
	}
	bwg.Wait()
	for i, b := range burst {
		if b.err != nil {
			t.Errorf("burst POST %d during the stall: %v", i, b.err)
			continue
		}
		checkStalled(fmt.Sprintf("burst POST %d", i), b.r, b.took)
	}

	waitFor(t, 10*time.Second, "the wallet's health to show degraded in /v1/plugins and /readyz", func() bool {
		admin, ready, _ := pluginHealth(t, h, "wallet")
		return admin == "degraded" && ready == "degraded"
	})
	_, _, readyCode := pluginHealth(t, h, "wallet")
	t.Logf("wallet degraded %v after the fault was set; /readyz answers %d", time.Since(stalled).Round(time.Millisecond), readyCode)
	if v, ok := h.metric(`wallet_breaker_state{plugin="wallet"}`); !ok || (v != 1 && v != 2) {
		t.Errorf(`wallet_breaker_state{plugin="wallet"} during the stall = %v (present %t), want 1 (open) or 2 (half-open)`, v, ok)
	}
	if v, ok := h.metric(`io_timeouts_total{op="ledger_commit",plugin="wallet"}`); !ok || v < 3 {
		t.Errorf(`io_timeouts_total{op="ledger_commit",plugin="wallet"} = %v (present %t), want >= 3 (breaker.failures)`, v, ok)
	}
	// Reads keep answering while the ledger is degraded.
	if a := walletAccount(t, h, acct, 0); a.Balance != issued {
		t.Errorf("GET /wallet/v1/accounts/%s while degraded: balance %d, want %d", acct, a.Balance, issued)
	}
	if code, body := h.get(h.ingress + "/wallet/v1/supply"); code != http.StatusOK {
		t.Errorf("GET /wallet/v1/supply while degraded = %d %s, want 200", code, body)
	}

	setFaults(t, h, "wallet", "")
	cleared := time.Now()
	waitFor(t, 15*time.Second, "a POST to succeed after the fault was cleared", func() bool {
		r, _ := issue()
		switch {
		case r.code == http.StatusOK:
			issued += 100
			return true
		case r.code == http.StatusServiceUnavailable && r.errCode() == "storage_unavailable":
			return false
		}
		t.Fatalf("POST after the fault was cleared = %v, want 200 or 503 storage_unavailable", r)
		return false
	})
	t.Logf("POSTs succeed %v after the fault was cleared", time.Since(cleared).Round(time.Millisecond))

	// Concurrent writers get through as the breaker closes; each retries
	// a refusal with a new key, as a client would.
	oks := make([]int, 16)
	errs := make([]error, len(oks))
	var rwg sync.WaitGroup
	for i := range oks {
		rwg.Go(func() {
			deadline := time.Now().Add(15 * time.Second)
			for try := 0; time.Now().Before(deadline); try++ {
				r, err := walletPost(t.Context(), client, h.ingress+"/wallet/v1/issue", fmt.Sprintf("stall-after-%d-%d", i, try), fmt.Sprintf(`{"to":%q,"amount":100}`, acct))
				switch {
				case err != nil:
					errs[i] = err
					return
				case r.code == http.StatusOK:
					oks[i]++
					return
				case !notApplied(r):
					errs[i] = fmt.Errorf("POST after the fault was cleared = %v, want 200 or a refusal", r)
					return
				}
				time.Sleep(50 * time.Millisecond) // pace the retries, as a client would
			}
			errs[i] = errors.New("no 200 within 15s of retrying")
		})
	}
	rwg.Wait()
	for i := range oks {
		if errs[i] != nil {
			t.Errorf("writer %d after the stall: %v", i, errs[i])
		}
		issued += uint64(oks[i]) * 100
	}

	waitFor(t, 10*time.Second, "the commit queue to drain and the breaker to close", func() bool {
		q, qok := h.metric(`queue_depth{plugin="wallet",queue="commit"}`)
		b, bok := h.metric(`wallet_breaker_state{plugin="wallet"}`)
		return qok && q == 0 && bok && b == 0
	})
	waitFor(t, 10*time.Second, "the wallet's health to be ready again", func() bool {
		admin, ready, code := pluginHealth(t, h, "wallet")
		return admin == "" && ready == "" && code == http.StatusOK
	})
	// Exactly the 200s were applied: no 503 during the stall left a trace.
	if s := walletSupply(t, h, 0); s.Issued != issued {
		t.Errorf("issued after the stall = %d, want %d: the sum of the acknowledged issues", s.Issued, issued)
	}
	if a := walletAccount(t, h, acct, 0); a.Balance != issued {
		t.Errorf("balance of %s after the stall = %d, want %d", acct, a.Balance, issued)
	}
}

// floodOutcome sorts a flood's answers.
type floodOutcome struct {
	acked   []issueOp // 200
	unknown []issueOp // no answer
	counts  map[string]int
	// okAfter: 200s answered after the drain began.
	okAfter int
}

// check sorts the flood's answers and checks each is a 200, a 429 or 503
// with Retry-After, or, only if it ended after drainAt and connErrOK, a
// failed connection.
func (l *issueLoad) check(t *testing.T, name string, drainAt time.Time, connErrOK bool) floodOutcome {
	t.Helper()
	<-l.done
	o := floodOutcome{counts: map[string]int{}}
	for _, res := range l.ops {
		switch {
		case res.err != nil:
			o.counts["no answer"]++
			o.unknown = append(o.unknown, res)
			if !connErrOK || res.end.Before(drainAt) {
				t.Errorf("%s POST %s: %v, want an answer", name, res.key, res.err)
			}
		case res.r.code == http.StatusOK:
			o.counts["200"]++
			o.acked = append(o.acked, res)
			if res.end.After(drainAt) {
				o.okAfter++
			}
		case res.r.code == http.StatusTooManyRequests, res.r.code == http.StatusServiceUnavailable:
			o.counts[fmt.Sprintf("%d %s", res.r.code, res.r.errCode())]++
			if _, err := retryAfter(res.r); err != nil {
				t.Errorf("%s POST %s: %v", name, res.key, err)
			}
			if res.r.errCode() == "drain_aborted" {
				t.Errorf("%s POST %s = %v: the host killed the wallet at the drain deadline, want its queue drained in time", name, res.key, res.r)
			}
		default:
			t.Errorf("%s POST %s = %v, want 200, 429 or 503", name, res.key, res.r)
		}
	}
	t.Logf("%s: %d POSTs: %v; %d answered 200 after the drain began", name, len(l.ops), o.counts, o.okAfter)
	if o.counts["429 busy"] == 0 {
		t.Errorf("%s: no POST was answered 429 busy, want the full queue to refuse some", name)
	}
	if o.okAfter == 0 {
		t.Errorf("%s: no POST was answered 200 after the drain began, want the queued commits to finish during the drain", name)
	}
	return o
}

func TestWalletBackpressureAndDrain(t *testing.T) {
	const (
		drainDeadline = 3 * time.Second
		queueCapacity = 4
		floodWorkers  = 16
		maxPerWorker  = 500 // bounds each flood
		drainingLog   = "draining: plugin=wallet"
	)
	base := baseConfig(drainDeadline.String())
	// An absolute data_dir, so that a second host reads the same ledger.
	dataDir := t.TempDir()
	cfg := strings.Replace(base, `data_dir       = "./data"`, fmt.Sprintf("data_dir       = %q", dataDir), 1)
	if cfg == base {
		t.Fatal(`baseConfig no longer sets data_dir = "./data"; update this test`)
	}
	// One committer taking one operation per commit, each held 300ms by
	// the fault: the queue of 4 fills at once and drains in about 1.5s,
	// well inside the drain deadline.
	cfg += faultsOn + walletBlock(fmt.Sprintf(`    queue_capacity = %d
    committers     = 1
    max_batch      = 1`, queueCapacity))
	const hold = `{"faults":[{"point":"ledger.commit","delay":"300ms"}]}`
	h := startHost(t, cfg)
	old := readyPlugin(t, h, "wallet")
	fresh := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

	// fill floods the wallet until its queue is full and POSTs are
	// refused with 429, and returns the flood, still running.
	fill := func(name string) *issueLoad {
		t.Helper()
		setFaults(t, h, "wallet", hold)
		busy0, _ := h.metric(`busy_rejections_total{endpoint="issue",plugin="wallet"}`)
		f := startIssueLoad(t, h, name, floodWorkers, 0, maxPerWorker)
		waitFor(t, 10*time.Second, name+": the commit queue to be full and POSTs refused with 429", func() bool {
			q, _ := h.metric(`queue_depth{plugin="wallet",queue="commit"}`)
			b, _ := h.metric(`busy_rejections_total{endpoint="issue",plugin="wallet"}`)
			return q == queueCapacity && b > busy0
		})
		return f
	}
	drains := func() int { return strings.Count(h.log.String(), drainingLog) }

	// 1. A restart drains the wallet while the host keeps serving: the
	// queued commits finish, and a new POST waits for the new process
	// (the wallet is single-instance) and is answered by it.
	f1 := fill("restart")
	f1.stop()
	before := drains()
	restarted := time.Now()
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/wallet/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST /v1/plugins/wallet/restart = %d %s, want 202", code, body)
	}
	waitFor(t, 5*time.Second, "the wallet to begin draining", func() bool { return drains() > before })
	held := &http.Client{Timeout: drainDeadline + 10*time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	r, err := walletPost(t.Context(), held, h.ingress+"/wallet/v1/issue", "during-restart", `{"to":"late","amount":1}`)
	duringRestart := issueOp{key: "during-restart", r: r, err: err, end: time.Now()}
	switch {
	case err != nil:
		t.Errorf("POST while the wallet drains for a restart: %v, want 200 from the new process", err)
	case r.code != http.StatusOK:
		t.Errorf("POST while the wallet drains for a restart = %v, want 200 from the new process", r)
	}
	f1.wait(t, drainDeadline+5*time.Second)
	o1 := f1.check(t, "restart flood", restarted, false)
	if err == nil && r.code == http.StatusOK {
		o1.acked = append(o1.acked, duringRestart)
	}
	waitFor(t, 15*time.Second, "the wallet to come back with a new pid", func() bool {
		st := h.plugins()["wallet"]
		return st.State == "ready" && st.Pid != 0 && st.Pid != old.Pid
	})

	// 2. SIGTERM the host with the queue full: intake stops, the queued
	// commits finish, the host exits 0 in time.
	f2 := fill("sigterm")
	f2.stop()
	before = drains()
	signalled := time.Now()
	h.signal(syscall.SIGTERM)
	// Once the wallet drains, a new POST is refused: 503 from the wallet
	// or the host, or no connection at all, since the listener closes.
	waitFor(t, 5*time.Second, "the wallet to begin draining", func() bool { return drains() > before })
	for i := range 3 {
		r, err := walletPost(t.Context(), fresh, h.ingress+"/wallet/v1/issue", fmt.Sprintf("after-sigterm-%d", i), `{"to":"late","amount":1}`)
		switch {
		case err != nil:
			t.Logf("POST after SIGTERM: %v", err)
		case r.code == http.StatusServiceUnavailable:
			if _, err := retryAfter(r); err != nil {
				t.Errorf("POST after SIGTERM: %v", err)
			}
		default:
			t.Errorf("POST after SIGTERM = %v, want 503 or a refused connection", r)
		}
	}
	code, exited := h.waitExit(drainDeadline + 5*time.Second)
	took := time.Since(signalled)
	if !exited {
		t.Fatalf("host still running %v after SIGTERM, want it to exit within drain_deadline + 1s", took)
	}
	t.Logf("host exited %v after SIGTERM with code %d", took.Round(time.Millisecond), code)
	if code != 0 {
		t.Errorf("host exit code = %d, want 0", code)
	}
	if limit := drainDeadline + time.Second; took > limit {
		t.Errorf("host exited %v after SIGTERM, want within drain_deadline + 1s = %v", took, limit)
	}
	f2.wait(t, 10*time.Second)
	o2 := f2.check(t, "sigterm flood", signalled, true)

	log := h.log.String()
	for _, bad := range []string{"drain hook failed", "killing plugin"} {
		if strings.Contains(log, bad) {
			t.Errorf("host log contains %q, want the wallet to drain its queue within the deadline", bad)
		}
	}
	if n := strings.Count(log, "plugin drained: plugin=wallet"); n != 2 {
		t.Errorf("host log says the wallet drained %d times, want 2 (restart and SIGTERM)", n)
	}

	// A new host on the same data dir: every 200 is on disk, and nothing
	// refused was applied. A POST without an answer may have been applied.
	h2 := startHost(t, cfg)
	readyPlugin(t, h2, "wallet")
	acked := append(o1.acked, o2.acked...)
	unknown := len(o1.unknown) + len(o2.unknown)
	var maxSeq uint64
	for _, f := range acked {
		rc, err := decodeReceipt(f.r.body)
		if err != nil {
			t.Fatal(err)
		}
		maxSeq = max(maxSeq, rc.Seq)
		var got receipt
		walletGet(t, h2, "/wallet/v1/receipts/"+rc.TxID, &got)
		if d := cmp.Diff(rc, got); d != "" {
			t.Errorf("receipt %s after the restart differs from the acknowledged one (-acked +stored):\n%s", rc.TxID, d)
		}
	}
	s := walletSupply(t, h2, maxSeq)
	if lo, hi := uint64(len(acked)), uint64(len(acked)+unknown); s.Issued < lo || s.Issued > hi {
		t.Errorf("issued after both drains = %d, want %d (the 200s) plus at most %d (POSTs without an answer)", s.Issued, lo, unknown)
	}
}

func TestWalletIdempotencyAcrossRestart(t *testing.T) {
	// A commit timeout long enough for the fault below to hold a commit
	// without failing it.
	h := startHost(t, baseConfig("2s")+faultsOn+walletBlock(`    commit_timeout = "5s"`))
	old := readyPlugin(t, h, "wallet")
	walletIssue(t, h, "idem-issue", "idem-a", 1000)

	const path = "/wallet/v1/transfer"
	body1 := `{"from":"idem-a","to":"idem-b","amount":250,"nonce":1}`
	first := mustPost(t, h, path, "idem-t1", body1)
	if first.code != http.StatusOK || first.replayed() {
		t.Fatalf("POST %s %s = %v (Idempotent-Replayed %q), want a fresh 200", path, body1, first, first.header.Get("Idempotent-Replayed"))
	}
	rc1, err := decodeReceipt(first.body)
	if err != nil {
		t.Fatal(err)
	}

	// checkReplay: the same key and request answers the first response's
	// bytes, marked as a replay.
	checkReplay := func(what, key, body string, want walletResp) {
		t.Helper()
		r := mustPost(t, h, path, key, body)
		if r.code != want.code || !bytes.Equal(r.body, want.body) || !r.replayed() {
			t.Errorf("%s: replay of %s = %v (Idempotent-Replayed %q), want %v byte for byte with Idempotent-Replayed: true",
				what, key, r, r.header.Get("Idempotent-Replayed"), want)
		}
	}
	checkReused := func(what, endpoint, key, body string) {
		t.Helper()
		r := mustPost(t, h, endpoint, key, body)
		if r.code != http.StatusUnprocessableEntity || r.errCode() != "idempotency_key_reused" {
			t.Errorf("%s: POST %s with key %s and another request = %v, want 422 idempotency_key_reused", what, endpoint, key, r)
		}
	}
	checkReplay("same body", "idem-t1", body1, first)
	// The fingerprint is of the decoded request: member order and
	// whitespace do not count.
	checkReplay("reordered body", "idem-t1", `{ "nonce": 1, "amount": 250, "to": "idem-b", "from": "idem-a" }`, first)
	checkReused("other amount", path, "idem-t1", `{"from":"idem-a","to":"idem-b","amount":251,"nonce":1}`)
	checkReused("other endpoint", "/wallet/v1/issue", "idem-t1", `{"to":"idem-b","amount":250}`)

	// Concurrent duplicates: with each commit held 1s, all of them arrive
	// while the first is in progress. Exactly one commits.
	setFaults(t, h, "wallet", `{"faults":[{"point":"ledger.commit","delay":"1s"}]}`)
	body2 := `{"from":"idem-a","to":"idem-c","amount":100,"nonce":2}`
	dups := make([]walletResp, 8)
	dupErrs := make([]error, len(dups))
	var wg sync.WaitGroup
	for i := range dups {
		wg.Go(func() { dups[i], dupErrs[i] = walletPost(t.Context(), client, h.ingress+path, "idem-t2", body2) })
	}
	wg.Wait()
	setFaults(t, h, "wallet", "")
	var second walletResp
	fresh, inUse := 0, 0
	for i, r := range dups {
		switch {
		case dupErrs[i] != nil:
			t.Errorf("duplicate %d: %v", i, dupErrs[i])
		case r.code == http.StatusOK && !r.replayed():
			fresh++
			second = r
		case r.code == http.StatusConflict && r.errCode() == "idempotency_key_in_use":
			inUse++
		case r.code == http.StatusOK: // a replay, after the first finished
		default:
			t.Errorf("duplicate %d = %v, want 200 or 409 idempotency_key_in_use", i, r)
		}
	}
	t.Logf("%d concurrent duplicates: %d committed, %d answered 409 in use, %d replayed", len(dups), fresh, inUse, len(dups)-fresh-inUse)
	if fresh != 1 || inUse == 0 {
		t.Fatalf("concurrent duplicates: %d fresh 200s and %d 409s, want exactly one 200 and 409s for the others", fresh, inUse)
	}
	for i, r := range dups {
		if r.code == http.StatusOK && !bytes.Equal(r.body, second.body) {
			t.Errorf("duplicate %d answered %s, want the committed receipt %s", i, r.body, second.body)
		}
	}
	rc2, err := decodeReceipt(second.body)
	if err != nil {
		t.Fatal(err)
	}
	if a := walletAccount(t, h, "idem-a", rc2.Seq); a.Nonce != 2 || a.Balance != 1000-250-100 {
		t.Errorf("idem-a after the duplicates = %+v, want nonce 2 and balance 650: one debit per key", a)
	}

	// Restart the wallet: the records are on disk.
	code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/wallet/restart", nil, nil)
	if code != http.StatusAccepted {
		t.Fatalf("POST /v1/plugins/wallet/restart = %d %s, want 202", code, body)
	}
	waitFor(t, 15*time.Second, "the wallet to come back with a new pid", func() bool {
		st := h.plugins()["wallet"]
		return st.State == "ready" && st.Pid != 0 && st.Pid != old.Pid
	})
	checkReplay("after the restart", "idem-t1", body1, first)
	checkReplay("after the restart", "idem-t2", body2, second)
	checkReused("after the restart", path, "idem-t1", `{"from":"idem-a","to":"idem-b","amount":251,"nonce":1}`)
	var got receipt
	walletGet(t, h, "/wallet/v1/receipts/"+rc1.TxID, &got)
	if d := cmp.Diff(rc1, got); d != "" {
		t.Errorf("receipt %s after the restart (-acked +stored):\n%s", rc1.TxID, d)
	}
	if a := walletAccount(t, h, "idem-a", rc2.Seq); a.Nonce != 2 || a.Balance != 650 {
		t.Errorf("idem-a after the restart and replays = %+v, want nonce 2 and balance 650", a)
	}
}
