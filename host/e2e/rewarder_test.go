package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// rewarderManifest is the part of an epoch's manifest these tests read.
type rewarderManifest struct {
	State        string `json:"state"`
	Reason       string `json:"reason"`
	PayoutsTotal uint64 `json:"payouts_total"`
	Settlement   struct {
		Parts        int `json:"parts"`
		SettledParts int `json:"settled_parts"`
	} `json:"settlement"`
}

// rewarderWallet is the wallet's block in the rewarder's tests. The
// host-wide max_body_bytes of baseConfig, 4 KiB, holds the rewarder's
// compute bodies to nothing: its compute route declares its own limit.
// The wallet's batches from the rewarder, up to 1,024 legs, need more, so
// its block raises its own.
func rewarderWallet() string {
	return pluginBlock("wallet", "wallet", "  max_body_bytes = 1048576\n  config {\n  }")
}

// rewarderInputs is a compute body paying pool from "pool" to n
// recipients PREFIX-00000…, recipient i with weight i%97+1.
func rewarderInputs(prefix string, pool uint64, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"pool_account":"pool","pool_amount":%d,"contributions":[`, pool)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"account":"%s-%05d","weight":%d}`, prefix, i, i%97+1)
	}
	b.WriteString("]}")
	return b.String()
}

// TestRewarderSettlesOnceUnderKill9 runs the real host, wallet and
// rewarder. Epoch e0 is posted 100 times at once and computed once; e1
// is posted 100 times and the rewarder is killed with SIGKILL right after the first acknowledgement (between
// sealing and settlement); e2 is killed between batch parts; during e3
// the wallet is killed, and the epoch settles or is quarantined as
// settlement_unavailable, then settles after retry. Every epoch settles
// exactly once: the pool is debited by exactly the pools' sum, its nonce
// counts one debit per part, and sampled recipients hold their run.json
// payouts.
func TestRewarderSettlesOnceUnderKill9(t *testing.T) {
	const funds, pool, n = 1 << 50, 1_000_000_007, 12000 // 12 parts per epoch
	// The host-wide limit of baseConfig, 4 KiB, sizes the rewarder's
	// body budget (max_inflight × its limit, and one body at the compute
	// route's) far below 100 concurrent bodies of 430 KB: its block sets
	// its own limit, which the budget follows.
	cfg := baseConfig("5s") + rewarderWallet() +
		pluginBlock("rewarder", "rewarder", `  max_body_bytes = 1048576
  config {
    rescan = "100ms"
    settle {
      backoff = "20ms"
      retries = 3
      timeout = "1s"
    }
  }`)
	h := startHost(t, cfg)
	readyPlugin(t, h, "wallet")
	readyPlugin(t, h, "rewarder")
	ctJSON := http.Header{"Content-Type": {"application/json"}}
	post := func(path, body string, hdr http.Header) (int, string) {
		return do(t, "POST", h.ingress+path, strings.NewReader(body), hdr)
	}
	if code, body := post("/wallet/v1/issue", fmt.Sprintf(`{"to":"pool","amount":%d}`, uint64(funds)),
		http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"fund-pool"}}); code != http.StatusOK {
		t.Fatalf("issue to the pool = %d %s", code, body)
	}
	manifest := func(id string) (rewarderManifest, bool) {
		code, body := h.get(h.ingress + "/rewarder/v1/epochs/" + id)
		var m rewarderManifest
		return m, code == http.StatusOK && jsonDecode(body, &m)
	}
	waitSettled := func(id string) {
		t.Helper()
		waitFor(t, 90*time.Second, id+" settled", func() bool { m, ok := manifest(id); return ok && m.State == "settled" })
	}
	killRewarder := func() {
		t.Helper()
		old := h.plugins()["rewarder"]
		if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 rewarder (pid %d): %v", old.Pid, err)
		}
		waitFor(t, 30*time.Second, "the rewarder restarted", func() bool {
			st := h.plugins()["rewarder"]
			return st.State == "ready" && st.Pid > 0 && st.Pid != old.Pid
		})
	}

	// e0: 100 concurrent posts through the host: all accepted, computed once.
	body0 := rewarderInputs("z", pool, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for range 100 {
		wg.Go(func() {
			code, _ := post("/rewarder/v1/epochs/e0/compute", body0, ctJSON)
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[http.StatusAccepted]+codes[http.StatusOK] != 100 {
		t.Errorf("100 posts of e0 answered %v, want each 202 or 200", codes)
	}
	waitSettled("e0")
	if v, ok := h.metric(`rewarder_epochs_total{plugin="rewarder",state="computed"}`); !ok || v != 1 {
		t.Errorf("rewarder_epochs_total{state=computed} = %v (%v), want 1: e0 computed once", v, ok)
	}

	// e1: 100 concurrent posts, then kill -9 between sealing and settlement.
	body1 := rewarderInputs("a", pool, n)
	codes = map[int]int{}
	first := make(chan struct{})
	var once sync.Once
	for range 100 {
		wg.Go(func() {
			code, _ := post("/rewarder/v1/epochs/e1/compute", body1, ctJSON)
			mu.Lock()
			codes[code]++
			mu.Unlock()
			if code == http.StatusAccepted {
				once.Do(func() { close(first) })
			}
		})
	}
	<-first
	killRewarder()
	wg.Wait()
	t.Logf("the 100 posts of e1 answered %v", codes)
	waitSettled("e1")

	// e2: kill -9 between parts.
	if code, body := post("/rewarder/v1/epochs/e2/compute", rewarderInputs("b", pool, n), ctJSON); code != http.StatusAccepted {
		t.Fatalf("compute e2 = %d %s", code, body)
	}
	waitFor(t, 60*time.Second, "e2 partly settled", func() bool {
		m, ok := manifest("e2")
		return ok && m.Settlement.SettledParts >= 1
	})
	if m, _ := manifest("e2"); m.State == "settled" {
		t.Log("e2 settled before the kill: the kill lands after settlement")
	}
	killRewarder()
	waitSettled("e2")

	// e3: kill -9 of the wallet mid-settlement.
	if code, body := post("/rewarder/v1/epochs/e3/compute", rewarderInputs("c", pool, n), ctJSON); code != http.StatusAccepted {
		t.Fatalf("compute e3 = %d %s", code, body)
	}
	waitFor(t, 60*time.Second, "e3 settling", func() bool {
		m, ok := manifest("e3")
		return ok && m.Settlement.SettledParts >= 1
	})
	oldWallet := h.plugins()["wallet"]
	if err := syscall.Kill(oldWallet.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 wallet: %v", err)
	}
	waitFor(t, 60*time.Second, "e3 settled or quarantined", func() bool {
		m, ok := manifest("e3")
		return ok && (m.State == "settled" || m.State == "quarantined")
	})
	m3, _ := manifest("e3")
	t.Logf("after the wallet's kill -9, e3 is %s %s", m3.State, m3.Reason)
	if m := m3; m.State == "quarantined" {
		if m.Reason != "settlement_unavailable" {
			t.Fatalf("e3 quarantined as %q, want settlement_unavailable", m.Reason)
		}
		readyPlugin(t, h, "wallet")
		if code, body := post("/rewarder/v1/epochs/e3/retry", "", nil); code != http.StatusAccepted {
			t.Fatalf("retry e3 = %d %s", code, body)
		}
	}
	waitSettled("e3")

	// Exactly once: the pool paid exactly four pools, one debit per part.
	epochs := []string{"e0", "e1", "e2", "e3"}
	var parts int
	for _, id := range epochs {
		m, _ := manifest(id)
		if m.PayoutsTotal != pool || m.Settlement.SettledParts != m.Settlement.Parts {
			t.Errorf("%s = %+v, want %d paid in every part", id, m, uint64(pool))
		}
		parts += m.Settlement.Parts
	}
	code, body := h.get(h.ingress + "/wallet/v1/accounts/pool")
	var acct struct {
		Balance uint64 `json:"balance"`
		Nonce   uint64 `json:"nonce"`
	}
	if code != http.StatusOK || !jsonDecode(body, &acct) {
		t.Fatalf("pool account = %d %s", code, body)
	}
	if want := uint64(funds - 4*pool); acct.Balance != want || acct.Nonce != uint64(parts) {
		t.Errorf("pool = balance %d nonce %d, want %d and %d: each part debited once", acct.Balance, acct.Nonce, want, parts)
	}
	for _, id := range epochs {
		code, body := h.get(h.ingress + "/rewarder/v1/epochs/" + id + "/run.json")
		var run struct {
			Payouts []struct {
				Account string `json:"account"`
				Amount  uint64 `json:"amount"`
			} `json:"payouts"`
		}
		if code != http.StatusOK || !jsonDecode(body, &run) || len(run.Payouts) != n {
			t.Fatalf("run.json of %s = %d (%d payouts)", id, code, len(run.Payouts))
		}
		for i := 0; i < n; i += n / 40 {
			p := run.Payouts[i]
			code, body := h.get(h.ingress + "/wallet/v1/accounts/" + p.Account)
			var a struct {
				Balance uint64 `json:"balance"`
			}
			if code != http.StatusOK || !jsonDecode(body, &a) || a.Balance != p.Amount {
				t.Errorf("%s = %d %s, want balance %d", p.Account, code, body, p.Amount)
			}
		}
	}
}

func jsonDecode(body string, v any) bool { return json.Unmarshal([]byte(body), v) == nil }

// TestRewarderInsufficientFunds runs the real host, wallet and rewarder:
// a pool that holds less than its epoch gets the epoch quarantined as
// insufficient_funds after its first parts, with nothing more paid; once
// the pool is topped up, retry settles it with the next generation of
// keys (the wallet recorded its 422 under the first), each part once.
func TestRewarderInsufficientFunds(t *testing.T) {
	const pool, n, short = 3_000_000, 3000, 1_500_000 // 3 parts; the pool holds half
	cfg := baseConfig("5s") + rewarderWallet() + pluginBlock("rewarder", "rewarder", "  config {\n    rescan = \"100ms\"\n  }")
	h := startHost(t, cfg)
	readyPlugin(t, h, "wallet")
	readyPlugin(t, h, "rewarder")
	issue := func(key string, amount uint64) {
		t.Helper()
		if code, body := do(t, "POST", h.ingress+"/wallet/v1/issue", strings.NewReader(fmt.Sprintf(`{"to":"pool","amount":%d}`, amount)),
			http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {key}}); code != http.StatusOK {
			t.Fatalf("issue to the pool = %d %s", code, body)
		}
	}
	issue("fund-1", short)
	if code, body := do(t, "POST", h.ingress+"/rewarder/v1/epochs/f1/compute", strings.NewReader(rewarderInputs("f", pool, n)),
		http.Header{"Content-Type": {"application/json"}}); code != http.StatusAccepted {
		t.Fatalf("compute = %d %s", code, body)
	}
	var m struct {
		rewarderManifest
		Generation int `json:"generation"`
	}
	manifest := func() bool {
		code, body := h.get(h.ingress + "/rewarder/v1/epochs/f1")
		return code == http.StatusOK && jsonDecode(body, &m)
	}
	waitFor(t, 30*time.Second, "f1 quarantined", func() bool { return manifest() && m.State == "quarantined" })
	if m.Reason != "insufficient_funds" || m.Settlement.SettledParts == m.Settlement.Parts {
		t.Fatalf("f1 = %+v, want quarantined as insufficient_funds before its last part", m)
	}
	pool1 := func() (bal, nonce uint64) {
		_, body := h.get(h.ingress + "/wallet/v1/accounts/pool")
		var a struct{ Balance, Nonce uint64 }
		jsonDecode(body, &a)
		return a.Balance, a.Nonce
	}
	_, nonceBefore := pool1()
	if nonceBefore != uint64(m.Settlement.SettledParts) {
		t.Errorf("pool nonce = %d, want %d settled parts", nonceBefore, m.Settlement.SettledParts)
	}
	issue("fund-2", pool)
	if code, body := do(t, "POST", h.ingress+"/rewarder/v1/epochs/f1/retry", nil, nil); code != http.StatusAccepted {
		t.Fatalf("retry = %d %s", code, body)
	}
	waitFor(t, 30*time.Second, "f1 settled", func() bool { return manifest() && m.State == "settled" })
	bal, nonce := pool1()
	if bal != short+pool-pool || nonce != uint64(m.Settlement.Parts) || m.Generation != 1 {
		t.Errorf("pool = balance %d nonce %d, generation %d; want %d, %d parts, generation 1", bal, nonce, m.Generation, short, m.Settlement.Parts)
	}
}

// TestRewarderDocConfig checks the plugin block of
// docs/plugins/rewarder.md, every attribute at its documented default:
// plughost validate accepts it, and the rewarder configures with it.
func TestRewarderDocConfig(t *testing.T) {
	b, err := os.ReadFile("../../docs/plugins/rewarder.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```hcl\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/plugins/rewarder.md has no hcl block")
	}
	cfg := baseConfig("1s") + walletBlock("") + block
	if res := runCLI(t, "validate", "-config", writeConfigFile(t, cfg)); res.code != 0 {
		t.Fatalf("plughost validate on the documented block: exit %d\nstderr:\n%s", res.code, res.stderr)
	}
	h := startHost(t, cfg)
	readyPlugin(t, h, "rewarder")
}
