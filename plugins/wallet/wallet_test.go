package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/plugins/wallet/internal/wallettest"
	"github.com/plughost/plughost/sdk"
)

func TestConfig(t *testing.T) {
	tests := []struct {
		name   string
		config string
		attr   string // "" means accepted
	}{
		{"defaults", ``, ""},
		{"everything", `
queue_capacity = 64
committers = 2
max_batch = 32
commit_timeout = "2s"
idempotency_ttl = "1h"
staleness_window = "0s"
events_buffer = 16
breaker {
  failures = 5
  failure_rate = 0.25
  window = "30s"
  cool_down = "1s"
  probes = 2
}`, ""},
		{"breaker block with defaults", `breaker {}`, ""},
		{"zero queue", `queue_capacity = 0`, "queue_capacity"},
		{"fractional queue", `queue_capacity = 1.5`, "queue_capacity"},
		{"negative committers", `committers = -1`, "committers"},
		{"huge batch", `max_batch = 100000`, "max_batch"},
		{"zero commit timeout", `commit_timeout = "0s"`, "commit_timeout"},
		{"negative staleness", `staleness_window = "-1s"`, "staleness_window"},
		{"short ttl", `idempotency_ttl = "10ms"`, "idempotency_ttl"},
		{"zero events buffer", `events_buffer = 0`, "events_buffer"},
		{"zero breaker failures", `breaker { failures = 0 }`, "breaker"},
		{"zero breaker probes", `breaker { probes = 0 }`, "breaker"},
		{"zero failure rate", `breaker { failure_rate = 0 }`, "breaker"},
		{"failure rate above 1", `breaker { failure_rate = 1.5 }`, "breaker"},
		{"short breaker window", `breaker { window = "10ms" }`, "breaker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := plugintest.Start(t, newDefinition(&wallet{now: plugintest.Now}), plugintest.Options{Config: tt.config})
			if err == nil {
				t.Cleanup(func() { _, _, _ = h.Drain(context.Background(), time.Now().Add(5*time.Second)) })
			}
			if tt.attr == "" {
				if err != nil {
					t.Fatalf("Start(%s) = %v, want accepted", tt.config, err)
				}
				return
			}
			var ce *sdk.ConfigError
			if !errors.As(err, &ce) || ce.Attribute != tt.attr {
				t.Fatalf("Start(%s) = %v, want a ConfigError about %s", tt.config, err, tt.attr)
			}
		})
	}
}

func TestConfigLockedDataDir(t *testing.T) {
	dir := t.TempDir()
	start(t, ``, nil, dir)
	begin := time.Now()
	_, err := plugintest.Start(t, newDefinition(&wallet{now: plugintest.Now}), plugintest.Options{DataDir: dir})
	var ce *sdk.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(ce.Message, "locked") {
		t.Fatalf("second wallet on the same data dir = %v, want a config error saying the ledger is locked", err)
	}
	if d := time.Since(begin); d > 10*time.Second {
		t.Errorf("the second wallet took %v to refuse, want about the 1s lock timeout", d)
	}
}

func TestOperations(t *testing.T) {
	tw := start(t, ``, nil, "")
	tw.mustPost("/v1/issue", "i1", `{"to":"alice","amount":100}`, 200)
	tr := decodeReceipt(t, tw.mustPost("/v1/transfer", "t1", `{"from":"alice","to":"bob","amount":30,"nonce":1}`, 200))
	if tr.Kind != "transfer" || tr.From != "alice" || tr.To != "bob" || tr.Amount != 30 || tr.Nonce != 1 || tr.Seq != 2 {
		t.Errorf("transfer receipt = %+v", tr)
	}
	br := decodeReceipt(t, tw.mustPost("/v1/batch", "b1", `{"from":"alice","nonce":2,"transfers":[{"to":"bob","amount":5},{"to":"carol","amount":7}]}`, 200))
	if br.Kind != "batch" || br.Amount != 12 || len(br.Legs) != 2 || br.Nonce != 2 {
		t.Errorf("batch receipt = %+v", br)
	}
	bu := decodeReceipt(t, tw.mustPost("/v1/burn", "u1", `{"from":"bob","amount":10,"nonce":1}`, 200))
	if bu.Kind != "burn" || bu.To != "" || bu.Amount != 10 {
		t.Errorf("burn receipt = %+v", bu)
	}

	for id, want := range map[string][2]uint64{"alice": {58, 2}, "bob": {25, 1}, "carol": {7, 0}, "nobody": {0, 0}} {
		a := tw.account(id, bu.Seq)
		if a.Account != id || a.Balance != want[0] || a.Nonce != want[1] {
			t.Errorf("GET account %s = %+v, want balance %d, nonce %d", id, a, want[0], want[1])
		}
	}
	if s := tw.supply(bu.Seq); s.Issued != 100 || s.Burned != 10 || s.Supply != 90 {
		t.Errorf("GET supply = %+v, want issued 100, burned 10, supply 90", s)
	}
	got := tw.get("/v1/receipts/" + tr.TxID)
	if got.code != 200 || cmp.Diff(tr, decodeReceipt(t, got)) != "" {
		t.Errorf("GET receipt %s = %s, want the transfer receipt", tr.TxID, got)
	}
	if r := tw.get("/v1/receipts/tx_00000000000000ff"); r.code != 404 || r.errorCode() != "not_found" {
		t.Errorf("GET unknown receipt = %s, want 404 not_found", r)
	}

	// The ledger's refusals.
	r := tw.mustPost("/v1/transfer", "t2", `{"from":"alice","to":"bob","amount":1000,"nonce":3}`, 422)
	if r.errorCode() != "insufficient_funds" {
		t.Errorf("overdraft = %s, want insufficient_funds", r)
	}
	r = tw.mustPost("/v1/transfer", "t3", `{"from":"alice","to":"bob","amount":1,"nonce":9}`, 409)
	var nonce struct {
		Error struct {
			Code          string `json:"code"`
			ExpectedNonce uint64 `json:"expected_nonce"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(r.body), &nonce) != nil || nonce.Error.Code != "nonce_mismatch" || nonce.Error.ExpectedNonce != 3 {
		t.Errorf("wrong nonce = %s, want nonce_mismatch expecting 3", r)
	}
}

func TestRequestValidation(t *testing.T) {
	tw := start(t, ``, nil, "")
	json := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"k"}}
	tests := []struct {
		name   string
		method string
		path   string
		header http.Header
		body   string
		code   int
		err    string
	}{
		{"no content type", "POST", "/v1/issue", http.Header{"Idempotency-Key": {"k"}}, `{"to":"a","amount":1}`, 415, "unsupported_media_type"},
		{"text content type", "POST", "/v1/issue", http.Header{"Content-Type": {"text/plain"}, "Idempotency-Key": {"k"}}, `{"to":"a","amount":1}`, 415, "unsupported_media_type"},
		{"json with charset", "POST", "/v1/issue", http.Header{"Content-Type": {"application/json; charset=utf-8"}, "Idempotency-Key": {"charset"}}, `{"to":"a","amount":1}`, 200, ""},
		{"no idempotency key", "POST", "/v1/issue", http.Header{"Content-Type": {"application/json"}}, `{"to":"a","amount":1}`, 400, "idempotency_key_missing"},
		{"long idempotency key", "POST", "/v1/issue", http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {strings.Repeat("k", 256)}}, `{"to":"a","amount":1}`, 400, "invalid_idempotency_key"},
		{"unknown field", "POST", "/v1/issue", json, `{"to":"a","amount":1,"memo":"hi"}`, 400, "invalid_request"},
		{"float amount", "POST", "/v1/transfer", json, `{"from":"a","to":"b","amount":1.5,"nonce":1}`, 400, "invalid_request"},
		{"same accounts", "POST", "/v1/transfer", json, `{"from":"a","to":"a","amount":1,"nonce":1}`, 400, "invalid_request"},
		{"body too large", "POST", "/v1/issue", json, `{"to":"` + strings.Repeat("a", 300<<10) + `"}`, 413, "body_too_large"},
		{"bad account id", "GET", "/v1/accounts/a%20b", nil, ``, 400, "invalid_request"},
		{"bad min_seq", "GET", "/v1/accounts/a?min_seq=x", nil, ``, 400, "invalid_request"},
		{"unknown query", "GET", "/v1/supply?at=1", nil, ``, 400, "invalid_request"},
		{"query on receipts", "GET", "/v1/receipts/tx_0000000000000001?x=1", nil, ``, 400, "invalid_request"},
		{"query on events", "GET", "/v1/events?from=1", nil, ``, 400, "invalid_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tw.do(tt.method, tt.path, tt.header, tt.body)
			if r.code != tt.code || (tt.err != "" && r.errorCode() != tt.err) {
				t.Errorf("%s %s = %s, want %d %s", tt.method, tt.path, r, tt.code, tt.err)
			}
			if r.header.Get("Content-Type") != "application/json" {
				t.Errorf("%s %s Content-Type = %q, want application/json", tt.method, tt.path, r.header.Get("Content-Type"))
			}
		})
	}
	// None of the refused requests recorded its key: it still works.
	tw.mustPost("/v1/issue", "k", `{"to":"a","amount":1}`, 200)
}

func TestIdempotentReplay(t *testing.T) {
	tw := start(t, ``, nil, "")
	first := tw.mustPost("/v1/issue", "key-1", `{"to":"alice","amount":5}`, 200)
	if first.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("first response has Idempotent-Replayed = %q", first.header.Get("Idempotent-Replayed"))
	}
	// The same request, written differently, is the same request.
	again := tw.mustPost("/v1/issue", "key-1", `{ "amount": 5, "to": "alice" }`, 200)
	if again.body != first.body {
		t.Errorf("replay body = %q, want the first response's bytes %q", again.body, first.body)
	}
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay has Idempotent-Replayed = %q, want true", again.header.Get("Idempotent-Replayed"))
	}
	r := tw.mustPost("/v1/issue", "key-1", `{"to":"alice","amount":6}`, 422)
	if r.errorCode() != "idempotency_key_reused" {
		t.Errorf("same key, different body = %s, want idempotency_key_reused", r)
	}
	r = tw.mustPost("/v1/burn", "key-1", `{"from":"alice","amount":5,"nonce":1}`, 422)
	if r.errorCode() != "idempotency_key_reused" {
		t.Errorf("same key, other endpoint = %s, want idempotency_key_reused", r)
	}
	rc := decodeReceipt(t, first)
	if a := tw.account("alice", rc.Seq); a.Balance != 5 {
		t.Errorf("alice's balance = %d after one issue and its replays, want 5", a.Balance)
	}
}

func TestNonceMismatchNotRecorded(t *testing.T) {
	tw := start(t, ``, nil, "")
	tw.mustPost("/v1/issue", "fund", `{"to":"alice","amount":5}`, 200)
	tw.mustPost("/v1/transfer", "pay", `{"from":"alice","to":"bob","amount":1,"nonce":2}`, 409)
	// The key is free for the corrected request.
	r := tw.mustPost("/v1/transfer", "pay", `{"from":"alice","to":"bob","amount":1,"nonce":1}`, 200)
	if r.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("corrected request was a replay: %s", r)
	}
}

func TestInsufficientFundsRecorded(t *testing.T) {
	tw := start(t, ``, nil, "")
	first := tw.mustPost("/v1/transfer", "pay", `{"from":"alice","to":"bob","amount":3,"nonce":1}`, 422)
	tw.mustPost("/v1/issue", "fund", `{"to":"alice","amount":5}`, 200)
	// Funded now, but the key's outcome stands: a retry must not turn a
	// refusal into a payment.
	again := tw.mustPost("/v1/transfer", "pay", `{"from":"alice","to":"bob","amount":3,"nonce":1}`, 422)
	if again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry = %s (replayed %q), want the first 422 replayed", again, again.header.Get("Idempotent-Replayed"))
	}
	if a := tw.account("bob", 1); a.Balance != 0 {
		t.Errorf("bob's balance = %d, want 0", a.Balance)
	}
}

func TestConcurrentDuplicate(t *testing.T) {
	gate := wallettest.NewGate()
	tw := start(t, `commit_timeout = "1m"`, gate, "")
	const body = `{"to":"alice","amount":7}`
	first := async(func() response { return tw.post("/v1/issue", "dup", body) })
	gate.WaitEntered(t) // the first is being committed
	const dups = 8
	var chans []<-chan response
	for range dups {
		chans = append(chans, async(func() response { return tw.post("/v1/issue", "dup", body) }))
	}
	for _, ch := range chans {
		if r := recv(t, ch); r.code != 409 || r.errorCode() != "idempotency_key_in_use" {
			t.Errorf("duplicate while the first is in progress = %s, want 409 idempotency_key_in_use", r)
		}
	}
	if r := tw.post("/v1/issue", "dup", `{"to":"alice","amount":8}`); r.code != 422 {
		t.Errorf("same key, other body while the first is in progress = %s, want 422", r)
	}
	gate.Open()
	r := recv(t, first)
	if r.code != 200 {
		t.Fatalf("first = %s, want 200", r)
	}
	if again := tw.post("/v1/issue", "dup", body); again.body != r.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("after the first finished = %s, want its replay", again)
	}
	if a := tw.account("alice", decodeReceipt(t, r).Seq); a.Balance != 7 {
		t.Errorf("alice's balance = %d, want 7: exactly one of %d duplicates applies", a.Balance, dups+1)
	}
}

func TestReplayAfterRestart(t *testing.T) {
	dir := t.TempDir()
	tw := start(t, ``, nil, dir)
	tw.mustPost("/v1/issue", "fund", `{"to":"alice","amount":10}`, 200)
	paid := tw.mustPost("/v1/transfer", "pay", `{"from":"alice","to":"bob","amount":4,"nonce":1}`, 200)
	poor := tw.mustPost("/v1/burn", "burn", `{"from":"bob","amount":5,"nonce":1}`, 422)
	tw.drain(5 * time.Second)

	tw = start(t, ``, nil, dir)
	for _, c := range []struct {
		path, key, body string
		first           response
	}{
		{"/v1/transfer", "pay", `{"from":"alice","to":"bob","amount":4,"nonce":1}`, paid},
		{"/v1/burn", "burn", `{"from":"bob","amount":5,"nonce":1}`, poor},
	} {
		r := tw.post(c.path, c.key, c.body)
		if r.code != c.first.code || r.body != c.first.body || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay of %s after restart = %s, want %s replayed byte for byte", c.key, r, c.first)
		}
	}
	rc := decodeReceipt(t, paid)
	if a := tw.account("alice", rc.Seq); a.Balance != 6 || a.Nonce != 1 {
		t.Errorf("alice after restart = %+v, want balance 6, nonce 1", a)
	}
	got := tw.get("/v1/receipts/" + rc.TxID)
	if got.code != 200 || cmp.Diff(rc, decodeReceipt(t, got)) != "" {
		t.Errorf("receipt %s after restart = %s", rc.TxID, got)
	}
	// The sequence continues.
	next := decodeReceipt(t, tw.mustPost("/v1/issue", "more", `{"to":"carol","amount":1}`, 200))
	if next.Seq != rc.Seq+1 {
		t.Errorf("next seq after restart = %d, want %d", next.Seq, rc.Seq+1)
	}
}

func TestQueueFull(t *testing.T) {
	gate := wallettest.NewGate()
	tw := start(t, `
queue_capacity = 1
committers = 1
max_batch = 1
commit_timeout = "1m"`, gate, "")
	held := async(func() response { return tw.post("/v1/issue", "a", `{"to":"x","amount":1}`) })
	gate.WaitEntered(t)
	queued := async(func() response { return tw.post("/v1/issue", "b", `{"to":"x","amount":1}`) })
	eventually(t, "the second POST is queued", func() bool { return tw.metric(`queue_depth{queue="commit"}`) == 1 })

	r := tw.post("/v1/issue", "c", `{"to":"x","amount":1}`)
	if r.code != 429 || r.errorCode() != "busy" || r.header.Get("Retry-After") == "" {
		t.Errorf("POST with a full queue = %s (Retry-After %q), want 429 busy with Retry-After", r, r.header.Get("Retry-After"))
	}
	if got := tw.metric(`busy_rejections_total{endpoint="issue"}`); got != 1 {
		t.Errorf(`busy_rejections_total{endpoint="issue"} = %v, want 1`, got)
	}
	if got := tw.metric(`queue_dropped_total{queue="commit"}`); got != 1 {
		t.Errorf(`queue_dropped_total{queue="commit"} = %v, want 1`, got)
	}
	gate.Open()
	for _, ch := range []<-chan response{held, queued} {
		if r := recv(t, ch); r.code != 200 {
			t.Errorf("POST = %s, want 200 once the commit is released", r)
		}
	}
	// The refused key was not recorded.
	tw.mustPost("/v1/issue", "c", `{"to":"x","amount":1}`, 200)
}

func TestLedgerStall(t *testing.T) {
	faults := faultSet(t, sdk.Fault{Point: commitFaultPoint, Delay: time.Hour})
	tw := start(t, `
commit_timeout = "100ms"
breaker {
  failures = 1
  cool_down = "100ms"
  probes = 1
}`, faults, "")
	begin := time.Now()
	r := tw.post("/v1/issue", "a", `{"to":"x","amount":1}`)
	if r.code != 503 || r.errorCode() != "storage_unavailable" || r.header.Get("Retry-After") == "" {
		t.Errorf("POST while the ledger stalls = %s, want 503 storage_unavailable with Retry-After", r)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("POST while the ledger stalls took %v, want about the 100ms commit timeout", d)
	}
	if got := tw.metric(`io_timeouts_total{op="ledger_commit"}`); got < 1 {
		t.Errorf(`io_timeouts_total{op="ledger_commit"} = %v, want at least 1`, got)
	}
	if r := tw.get("/v1/accounts/x"); r.code != 200 {
		t.Errorf("GET account while the ledger stalls = %s, want 200", r)
	}
	faults.Set(nil)
	eventually(t, "POST succeeds after the stall", func() bool {
		return tw.post("/v1/issue", "b", `{"to":"x","amount":1}`).code == 200
	})
}

// TestConcurrentReplays checks that replays of a finished request that
// arrive together are all answered with its record, none with 409: the
// key is no longer in progress, even while one replay holds its claim.
func TestConcurrentReplays(t *testing.T) {
	tw := start(t, ``, nil, "")
	first := tw.mustPost("/v1/issue", "done", `{"to":"x","amount":3}`, 200)
	var wg sync.WaitGroup
	rs := make([]response, 16)
	for i := range rs {
		wg.Go(func() { rs[i] = tw.post("/v1/issue", "done", `{"to":"x","amount":3}`) })
	}
	wg.Wait()
	for i, r := range rs {
		if r.code != 200 || r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("concurrent replay %d = %s (replayed %q), want the first response replayed", i, r, r.header.Get("Idempotent-Replayed"))
		}
	}
}

// TestReplayWhileCommitsFail checks that a replay queued while commits
// fail, before the breaker opens, is answered with its record, not with
// the failure of the group it was queued in.
func TestReplayWhileCommitsFail(t *testing.T) {
	tw, first := paidThenFailing(t, `
breaker {
  failures = 100
}`)
	if got := tw.metric("wallet_breaker_state"); got != 0 {
		t.Fatalf("wallet_breaker_state = %v, want 0 (closed): the replay must reach the committer", got)
	}
	checkPaidReplayed(t, tw, first, "while commits fail")
}

// paidThenFailing starts the wallet with config, commits an issue under
// the key "paid" and returns its response, then makes every commit fail
// at the fault point.
func paidThenFailing(t *testing.T, config string) (*testWallet, response) {
	t.Helper()
	faults := faultSet(t)
	tw := start(t, config, faults, "")
	first := tw.mustPost("/v1/issue", "paid", `{"to":"x","amount":3}`, 200)
	if err := faults.Set([]sdk.Fault{{Point: commitFaultPoint, Error: "disk on fire"}}); err != nil {
		t.Fatal(err)
	}
	return tw, first
}

// checkPaidReplayed checks that, while commits fail or are refused, the
// key "paid" is still answered with its first response, and a new key
// with 503 storage_unavailable.
func checkPaidReplayed(t *testing.T, tw *testWallet, first response, while string) {
	t.Helper()
	again := tw.mustPost("/v1/issue", "paid", `{"to":"x","amount":3}`, 200)
	if again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay %s = %s (replayed %q), want the first response %q replayed", while, again, again.header.Get("Idempotent-Replayed"), first.body)
	}
	if r := tw.mustPost("/v1/issue", "new", `{"to":"x","amount":1}`, 503); r.errorCode() != "storage_unavailable" {
		t.Errorf("new key %s = %s, want storage_unavailable", while, r)
	}
}

// TestReplayWhileRefused checks that a recorded outcome is still the
// answer while the committer refuses new operations (breaker open): the
// replay comes from the ledger, not the queue.
func TestReplayWhileRefused(t *testing.T) {
	tw, first := paidThenFailing(t, `
breaker {
  failures = 1
  cool_down = "1m"
  probes = 1
}`)
	tw.mustPost("/v1/issue", "opens", `{"to":"x","amount":1}`, 503)
	if got := tw.metric("wallet_breaker_state"); got != 1 {
		t.Fatalf("wallet_breaker_state = %v, want 1 (open)", got)
	}
	checkPaidReplayed(t, tw, first, "while the breaker is open")
	if r := tw.mustPost("/v1/issue", "paid", `{"to":"x","amount":4}`, 422); r.errorCode() != "idempotency_key_reused" {
		t.Errorf("same key, different body while the breaker is open = %s, want idempotency_key_reused", r)
	}
}

func TestBreaker(t *testing.T) {
	faults := faultSet(t, sdk.Fault{Point: commitFaultPoint, Error: "disk on fire"})
	// The cool-down must outlast everything checked while the breaker is
	// open: the first POST's own retry after the breaker opens, two metric
	// reads, a POST and a health check. At 300ms a busy machine could let
	// it pass, and the breaker report half-open (2) instead of open.
	tw := start(t, `
breaker {
  failures = 2
  cool_down = "2s"
  probes = 1
}`, faults, "")
	tw.mustPost("/v1/issue", "a", `{"to":"x","amount":1}`, 503)
	if got := tw.metric(`backoff_retries_total{op="ledger_commit",svc="ledger"}`); got < 1 {
		t.Errorf(`backoff_retries_total{op="ledger_commit",svc="ledger"} = %v, want retries before giving up`, got)
	}
	refused := tw.metric(`upstream_fail_total{svc="ledger"}`)
	r := tw.mustPost("/v1/issue", "b", `{"to":"x","amount":1}`, 503)
	if r.errorCode() != "storage_unavailable" || r.header.Get("Retry-After") == "" {
		t.Errorf("POST while the breaker is open = %s (Retry-After %q), want storage_unavailable with Retry-After", r, r.header.Get("Retry-After"))
	}
	if got := tw.metric(`upstream_fail_total{svc="ledger"}`); got != refused+1 {
		t.Errorf(`upstream_fail_total{svc="ledger"} = %v after a POST the open breaker refused, want %v`, got, refused+1)
	}
	health, err := tw.h.Health(t.Context())
	if err != nil || health.Status != sdk.StatusDegraded || health.Reason == "" {
		t.Errorf("Health while the breaker is open = %+v, %v, want degraded with a reason", health, err)
	}
	if got := tw.metric("wallet_breaker_state"); got != 1 {
		t.Errorf("wallet_breaker_state = %v, want 1 (open)", got)
	}
	for _, path := range []string{"/v1/accounts/x", "/v1/supply"} {
		if r := tw.get(path); r.code != 200 {
			t.Errorf("GET %s while the breaker is open = %s, want 200", path, r)
		}
	}

	faults.Set(nil)
	eventually(t, "POST succeeds after the fault is cleared", func() bool {
		return tw.post("/v1/issue", "c", `{"to":"x","amount":1}`).code == 200
	})
	health, _ = tw.h.Health(t.Context())
	if health.Status != sdk.StatusReady {
		t.Errorf("Health after a successful probe = %+v, want ready", health)
	}
	// The failed keys were not recorded.
	tw.mustPost("/v1/issue", "a", `{"to":"x","amount":1}`, 200)
}

func TestDrainFinishesQueued(t *testing.T) {
	gate := wallettest.NewGate()
	tw := start(t, "committers = 1\ncommit_timeout = \"1m\"", gate, "")
	var posts []<-chan response
	for i := range 5 {
		posts = append(posts, async(func() response {
			return tw.post("/v1/issue", fmt.Sprintf("k%d", i), `{"to":"x","amount":1}`)
		}))
		if i == 0 {
			gate.WaitEntered(t)
		}
	}
	eventually(t, "four POSTs are queued", func() bool { return tw.metric(`queue_depth{queue="commit"}`) == 4 })
	type counts struct{ completed, abandoned int64 }
	drained := async(func() counts {
		c, a := tw.drain(10 * time.Second)
		return counts{c, a}
	})
	eventually(t, "the drain begins", func() bool {
		h, err := tw.h.Health(t.Context())
		return err == nil && h.Status == sdk.StatusNotReady
	})
	if r := tw.post("/v1/issue", "late", `{"to":"x","amount":1}`); r.code != 503 || r.header.Get("Retry-After") == "" {
		t.Errorf("POST after the drain began = %s, want 503 with Retry-After", r)
	}
	gate.Open()
	for _, ch := range posts {
		if r := recv(t, ch); r.code != 200 {
			t.Errorf("POST queued at the drain = %s, want 200", r)
		}
	}
	if c := recv(t, drained); c.completed != 5 || c.abandoned != 0 {
		t.Errorf("Drain = %+v, want 5 completed and none abandoned", c)
	}
	if got := tw.metric(`tasks_aborted_total{kind="commit"}`); got != 0 {
		t.Errorf(`tasks_aborted_total{kind="commit"} = %v, want 0`, got)
	}
	if h, _ := tw.h.Health(t.Context()); h.Status != sdk.StatusNotReady {
		t.Errorf("Health after drain = %+v, want not ready", h)
	}
}

func TestDrainAbortsAtDeadline(t *testing.T) {
	gate := wallettest.NewGate() // never opened: the ledger is stuck
	tw := start(t, "committers = 1\ncommit_timeout = \"1m\"", gate, "")
	var posts []<-chan response
	for i := range 3 {
		posts = append(posts, async(func() response {
			return tw.post("/v1/issue", fmt.Sprintf("k%d", i), `{"to":"x","amount":1}`)
		}))
		if i == 0 {
			gate.WaitEntered(t)
		}
	}
	eventually(t, "two POSTs are queued", func() bool { return tw.metric(`queue_depth{queue="commit"}`) == 2 })
	begin := time.Now()
	tw.drain(300 * time.Millisecond)
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("Drain with a 300ms deadline took %v", d)
	}
	for _, ch := range posts {
		if r := recv(t, ch); r.code != 503 || r.errorCode() != "draining" {
			t.Errorf("POST aborted at the drain deadline = %s, want 503 draining", r)
		}
	}
	if got := tw.metric(`tasks_aborted_total{kind="commit"}`); got != 3 {
		t.Errorf(`tasks_aborted_total{kind="commit"} = %v, want 3`, got)
	}
	// The stuck group's commit was the one in progress.
	if got := tw.metric(`tasks_canceled_total{kind="commit"}`); got != 1 {
		t.Errorf(`tasks_canceled_total{kind="commit"} = %v, want 1`, got)
	}
}

// sse reads server-sent events from a stream.
type sse struct {
	sc *bufio.Scanner
}

type event struct {
	name, id, data string
}

// next returns the next event, skipping comments.
func (s *sse) next() (event, error) {
	var e event
	for s.sc.Scan() {
		line := s.sc.Text()
		switch {
		case line == "":
			if e.name != "" || e.data != "" {
				return e, nil
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event: "):
			e.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			e.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			e.data = strings.TrimPrefix(line, "data: ")
		}
	}
	if err := s.sc.Err(); err != nil {
		return e, err
	}
	return e, errors.New("stream ended")
}

func subscribe(t *testing.T, tw *testWallet) (*sse, *http.Response) {
	t.Helper()
	return subscribeFrom(t, tw, "")
}

// subscribeFrom subscribes with Last-Event-ID lastID, if not empty.
func subscribeFrom(t *testing.T, tw *testWallet, lastID string) (*sse, *http.Response) {
	t.Helper()
	srv := httptest.NewServer(tw.h)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/events", nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET /v1/events = %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return &sse{sc: bufio.NewScanner(resp.Body)}, resp
}

func TestEvents(t *testing.T) {
	tw := start(t, ``, nil, "")
	s, _ := subscribe(t, tw)
	// The subscription is registered before the head is sent, so every
	// receipt committed from now on is streamed.
	var want []receiptJSON
	want = append(want, decodeReceipt(t, tw.mustPost("/v1/issue", "a", `{"to":"alice","amount":5}`, 200)))
	want = append(want, decodeReceipt(t, tw.mustPost("/v1/transfer", "b", `{"from":"alice","to":"bob","amount":2,"nonce":1}`, 200)))
	tw.mustPost("/v1/burn", "c", `{"from":"bob","amount":9,"nonce":1}`, 422) // no receipt, no event
	for _, w := range want {
		e, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		var got receiptJSON
		if e.name != "receipt" || e.id != strconv.FormatUint(w.Seq, 10) || json.Unmarshal([]byte(e.data), &got) != nil {
			t.Fatalf("event = %+v, want receipt %d", e, w.Seq)
		}
		if diff := cmp.Diff(w, got); diff != "" {
			t.Errorf("event receipt mismatch (-want +got):\n%s", diff)
		}
	}
	// A drain ends the stream.
	// The drain is joined before the test returns: a Drain still in flight
	// when the harness closes its connection would fail with Canceled.
	drained := async(func() int64 { completed, _ := tw.drain(5 * time.Second); return completed })
	if e, err := s.next(); err == nil {
		t.Errorf("after drain the stream sent %+v, want it to end", e)
	}
	recv(t, drained)
}

func TestEventsLagged(t *testing.T) {
	gate := wallettest.NewGate()
	tw := start(t, "events_buffer = 1\ncommitters = 1\ncommit_timeout = \"1m\"", gate, "")
	s, _ := subscribe(t, tw)
	first := async(func() response { return tw.post("/v1/issue", "k0", `{"to":"x","amount":1}`) })
	gate.WaitEntered(t)
	var posts []<-chan response
	for i := 1; i <= 5; i++ {
		posts = append(posts, async(func() response {
			return tw.post("/v1/issue", fmt.Sprintf("k%d", i), `{"to":"x","amount":1}`)
		}))
	}
	eventually(t, "five POSTs are queued", func() bool { return tw.metric(`queue_depth{queue="commit"}`) == 5 })
	gate.Open() // the five commit as one group: one publish of five receipts into a buffer of one
	for _, ch := range append(posts, first) {
		if r := recv(t, ch); r.code != 200 {
			t.Fatalf("POST = %s", r)
		}
	}
	var lagged bool
	for {
		e, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		if e.name == "lagged" {
			var l struct{ Dropped uint64 }
			if json.Unmarshal([]byte(e.data), &l) != nil || l.Dropped < 4 {
				t.Errorf("lagged event = %+v, want at least 4 dropped", e)
			}
			lagged = true
		}
		if e.name == "receipt" && e.id == "6" {
			break
		}
	}
	if !lagged {
		t.Errorf("the slow stream was not told it lagged")
	}
	if got := tw.metric(`bus_lagged_total{bus="events"}`); got < 4 {
		t.Errorf(`bus_lagged_total{bus="events"} = %v, want at least 4`, got)
	}
	if got, lag := tw.metric(`queue_dropped_total{queue="events"}`), tw.metric(`bus_lagged_total{bus="events"}`); got != lag {
		t.Errorf(`queue_dropped_total{queue="events"} = %v, want %v, as bus_lagged_total`, got, lag)
	}
}

func TestEventsResume(t *testing.T) {
	tw := start(t, `events_buffer = 2`, nil, "")
	for i := range 5 {
		tw.mustPost("/v1/issue", fmt.Sprintf("k%d", i), `{"to":"alice","amount":1}`, 200)
	}
	names := func(s *sse, n int) []string {
		var got []string
		for range n {
			e, err := s.next()
			if err != nil {
				t.Fatal(err)
			}
			if e.name == "lagged" {
				got = append(got, "lagged:"+strings.TrimPrefix(e.data, `{"dropped":`))
			} else {
				got = append(got, e.name+":"+e.id)
			}
		}
		return got
	}
	// Resuming after 3 replays 4 and 5, then streams live without
	// repeating them.
	s, _ := subscribeFrom(t, tw, "3")
	tw.mustPost("/v1/issue", "k5", `{"to":"alice","amount":1}`, 200)
	if diff := cmp.Diff([]string{"receipt:4", "receipt:5", "receipt:6"}, names(s, 3)); diff != "" {
		t.Errorf("resumed after 3 (-want +got):\n%s", diff)
	}
	// Resuming from the start with a backfill of 2: the older 4 are
	// reported as lagged.
	s, _ = subscribeFrom(t, tw, "0")
	if diff := cmp.Diff([]string{"lagged:4}", "receipt:5", "receipt:6"}, names(s, 3)); diff != "" {
		t.Errorf("resumed after 0 (-want +got):\n%s", diff)
	}
	if r := tw.do(http.MethodGet, "/v1/events", http.Header{"Last-Event-ID": {"1000"}}, ""); r.code != 409 || r.errorCode() != "ahead_of_head" {
		t.Errorf("GET /v1/events with Last-Event-ID past the ledger = %s, want 409 ahead_of_head", r)
	}
	if r := tw.do(http.MethodGet, "/v1/events", http.Header{"Last-Event-ID": {"1", "2"}}, ""); r.code != 400 {
		t.Errorf("GET /v1/events with two Last-Event-IDs = %s, want 400", r)
	}
	if r := tw.do(http.MethodGet, "/v1/events", http.Header{"Last-Event-ID": {"x"}}, ""); r.code != 400 {
		t.Errorf("GET /v1/events with Last-Event-ID x = %s, want 400", r)
	}
}

func TestReadWaitsForSeq(t *testing.T) {
	tw := start(t, ``, nil, "")
	waiting := async(func() response { return tw.get("/v1/accounts/alice?min_seq=1&wait=30s") })
	tw.mustPost("/v1/issue", "a", `{"to":"alice","amount":5}`, 200)
	r := recv(t, waiting)
	var a accountJSON
	if r.code != 200 || json.Unmarshal([]byte(r.body), &a) != nil || a.Seq < 1 || a.Balance != 5 {
		t.Errorf("GET with min_seq=1 = %s, want the snapshot including the issue", r)
	}
	// A seq that never comes: answered with the current snapshot when
	// the wait ends.
	begin := time.Now()
	r = tw.get("/v1/accounts/alice?min_seq=99&wait=200ms")
	if r.code != 200 || time.Since(begin) < 200*time.Millisecond {
		t.Errorf("GET with min_seq=99&wait=200ms = %s after %v, want 200 after the wait", r, time.Since(begin))
	}
	// The wait ends before the request deadline (5s in the harness).
	begin = time.Now()
	r = tw.get("/v1/accounts/alice?min_seq=99&wait=60s")
	if r.code != 200 || time.Since(begin) > 5*time.Second {
		t.Errorf("GET with a wait past the deadline = %s after %v, want 200 before the deadline", r, time.Since(begin))
	}
}

func TestHealthReady(t *testing.T) {
	tw := start(t, ``, nil, "")
	if h, err := tw.h.Health(t.Context()); err != nil || h.Status != sdk.StatusReady {
		t.Errorf("Health = %+v, %v, want ready", h, err)
	}
	for _, series := range []string{
		`queue_depth{queue="commit"}`, `queue_depth{queue="events"}`, `busy_rejections_total{endpoint="transfer"}`,
		`worker_inflight`, `io_timeouts_total{op="ledger_commit"}`, `backoff_retries_total{op="ledger_commit",svc="ledger"}`,
		`bus_lagged_total{bus="events"}`, `tasks_aborted_total{kind="commit"}`,
		`wallet_commits_total{kind="batch",result="committed"}`, `wallet_commit_batch_size_count`,
		`wallet_commit_seconds_count`, `wallet_breaker_state`,
	} {
		tw.metric(series) // fails the test if missing
	}
}

// TestSeedMetrics checks that the wallet exports every metric its design
// seed names, with the seed's name, and that the tasks it starts are
// counted. The other families move in the tests of the events they count
// (TestQueueFull, TestBreaker, TestLedgerStall, TestDrainAbortsAtDeadline,
// TestEventsLagged).
func TestSeedMetrics(t *testing.T) {
	tw := start(t, "committers = 2", nil, "")
	text, err := tw.h.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{
		"queue_depth", "queue_dropped_total", "busy_rejections_total",
		"tasks_spawned_total", "tasks_aborted_total", "tasks_canceled_total",
		"io_timeouts_total", "backoff_retries_total", "bus_lagged_total",
		"worker_inflight", "upstream_fail_total",
	} {
		if !strings.Contains(text, "\n# TYPE "+name+" ") && !strings.HasPrefix(text, "# TYPE "+name+" ") {
			t.Errorf("metrics have no family %s; the seed names it:\n%s", name, text)
		}
	}
	if got := tw.metric(`tasks_spawned_total{kind="committer"}`); got != 2 {
		t.Errorf(`tasks_spawned_total{kind="committer"} = %v, want 2 (committers = 2)`, got)
	}
	if got := tw.metric(`tasks_spawned_total{kind="sweeper"}`); got != 1 {
		t.Errorf(`tasks_spawned_total{kind="sweeper"} = %v, want 1`, got)
	}
}

// TestStoreMetrics checks the ledger store's series that the e2e
// storage tests wait on: wallet_checkpoint_lag_seconds is above 0 while a
// POST's group waits for a checkpoint and comes back to 0 once the
// checkpointer has written it into the bbolt file, and the scrubber
// counts its passes over the file (wallet_scrub_passes_total).
func TestStoreMetrics(t *testing.T) {
	tw := start(t, ``, nil, "")
	l := tw.w.running.Load().ledger
	n := 0
	eventually(t, "wallet_checkpoint_lag_seconds read while a group waits for a checkpoint", func() bool {
		n++
		tw.mustPost("/v1/issue", fmt.Sprintf("i%d", n), `{"to":"alice","amount":1}`, 200)
		lag := tw.metric("wallet_checkpoint_lag_seconds")
		// Only a write makes the store pending: pending now, with none
		// since, it was pending when the gauge was read.
		if !l.Pending() {
			return false // checkpointed already: try again
		}
		if lag <= 0 {
			t.Fatalf("wallet_checkpoint_lag_seconds = %v with a group waiting for a checkpoint, want > 0", lag)
		}
		return true
	})
	eventually(t, "wallet_checkpoint_lag_seconds to be 0 once the checkpointer has run", func() bool {
		return tw.metric("wallet_checkpoint_lag_seconds") == 0
	})
	if l.Pending() {
		t.Errorf("wallet_checkpoint_lag_seconds = 0 with a group still waiting for a checkpoint")
	}
	eventually(t, "the scrubber to complete a pass", func() bool {
		return tw.metric("wallet_scrub_passes_total") >= 1
	})
}
