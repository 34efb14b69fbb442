package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
)

// testConfig keeps retries fast: a short backoff and rescan.
const testConfig = `rescan = "50ms"
settle {
  backoff = "1ms"
  timeout = "1s"
}
`

// start serves the rewarder in-process with wallet as the "wallet"
// plugin, and drains it when the test ends.
func start(t *testing.T, dir, config string, wallet http.Handler) *plugintest.Harness {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	h := plugintest.New(t, definition(), plugintest.Options{DataDir: dir, Config: testConfig + config,
		Plugins: map[string]http.Handler{"wallet": wallet}})
	t.Cleanup(func() {
		if _, _, err := h.Drain(context.Background(), time.Now().Add(5*time.Second)); err != nil {
			t.Errorf("Drain = %v", err)
		}
	})
	return h
}

func call(t *testing.T, h http.Handler, method, path, body string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// inputs returns a compute body paying pool from "pool" to n recipients
// r-0000…, recipient i with weight i+1.
func inputs(pool uint64, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"pool_account":"pool","pool_amount":%d,"contributions":[`, pool)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"account":"r-%04d","weight":%d}`, i, i+1)
	}
	b.WriteString("]}")
	return b.String()
}

// waitState polls the epoch's manifest until its state is want, with a
// deadline, and returns it.
func waitState(t *testing.T, h http.Handler, id, want string) epoch {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body := call(t, h, "GET", "/v1/epochs/"+id, "")
		var e epoch
		if code == http.StatusOK && json.Unmarshal([]byte(body), &e) == nil && e.State == want {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("epoch %s = %d %s, want state %s", id, code, body, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkPaidOnce checks that the wallet paid each of n recipients exactly
// once and debited the pool by exactly pool.
func checkPaidOnce(t *testing.T, w *walletStub, funds, pool uint64, n int) {
	t.Helper()
	bal, credits, _ := w.snapshot()
	if got := funds - bal["pool"]; got != pool {
		t.Errorf("pool debited %d, want %d", got, pool)
	}
	var paid uint64
	for i := range n {
		a := fmt.Sprintf("r-%04d", i)
		paid += bal[a]
		if bal[a] > 0 && credits[a] != 1 {
			t.Errorf("%s credited %d times, want once", a, credits[a])
		}
	}
	if paid != pool {
		t.Errorf("recipients received %d, want %d", paid, pool)
	}
}

func metric(t *testing.T, h *plugintest.Harness, series string) string {
	t.Helper()
	m, err := h.Metrics(t.Context())
	must(t, err)
	for _, l := range strings.Split(m, "\n") {
		if strings.HasPrefix(l, series+" ") {
			return strings.TrimPrefix(l, series+" ")
		}
	}
	return ""
}

func TestComputeAndSettle(t *testing.T) {
	const funds, pool, n = 1 << 40, 10_000_000_007, 2500 // three parts, each recipient paid
	w := newWalletStub("pool", funds)
	dir := t.TempDir()
	h := start(t, dir, `artifact_dir = "`+filepath.Join(dir, "art")+`"`, w)
	body := inputs(pool, n)
	if code, got := call(t, h, "POST", "/v1/epochs/e1/compute", body); code != http.StatusAccepted || !strings.Contains(got, `"epoch":"e1"`) {
		t.Fatalf("POST compute = %d %s, want 202", code, got)
	}
	e := waitState(t, h, "e1", stateSettled)
	if e.Settlement.Parts != 3 || e.Settlement.SettledParts != 3 || e.PayoutsTotal != pool || e.Recipients != n || e.CodeVersion != codeVersion {
		t.Errorf("manifest = %+v, want 3 parts settled, %d paid to %d", e, pool, n)
	}
	checkPaidOnce(t, w, funds, pool, n)
	// The artifacts: run.json as served and on disk, with the commitment.
	code, runJSON := call(t, h, "GET", "/v1/epochs/e1/run.json", "")
	disk, err := os.ReadFile(filepath.Join(dir, "art", "e1", "run.json"))
	must(t, err)
	com, err := os.ReadFile(filepath.Join(dir, "art", "e1", "commitment"))
	must(t, err)
	if code != http.StatusOK || runJSON != string(disk) || string(com) != e.Commitment+"\n" {
		t.Errorf("run.json = %d, served equals disk %v, commitment file %q, manifest %s", code, runJSON == string(disk), com, e.Commitment)
	}
	// The same inputs again, in another order: 200 with the manifest.
	var in Inputs
	must(t, json.Unmarshal([]byte(body), &in))
	in.Contributions[0], in.Contributions[1] = in.Contributions[1], in.Contributions[0]
	again, _ := json.Marshal(in)
	if code, got := call(t, h, "POST", "/v1/epochs/e1/compute", string(again)); code != http.StatusOK || !strings.Contains(got, `"state":"settled"`) {
		t.Errorf("POST compute again = %d %s, want 200 with the manifest", code, got)
	}
	// Other inputs: 409, naming the inputs_hash the epoch was sealed with.
	if code, got := call(t, h, "POST", "/v1/epochs/e1/compute", inputs(pool+1, n)); code != http.StatusConflict ||
		!strings.Contains(got, `"inputs_conflict"`) || !strings.Contains(got, "inputs_hash "+e.InputsHash+`"`) || e.InputsHash == "" {
		t.Errorf("POST compute with other inputs = %d %s, want 409 inputs_conflict naming inputs_hash %s", code, got, e.InputsHash)
	}
	if _, _, batches := w.snapshot(); batches != 3 {
		t.Errorf("wallet committed %d batches, want 3", batches)
	}
}

func TestConcurrentPostsComputeOnce(t *testing.T) {
	const funds, pool, n = 1 << 40, 777_777, 1500
	w := newWalletStub("pool", funds)
	h := start(t, "", "", w)
	body := inputs(pool, n)
	var wg sync.WaitGroup
	codes := make([]int, 100)
	for i := range codes {
		wg.Go(func() { codes[i], _ = call(t, h, "POST", "/v1/epochs/c1/compute", body) })
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusAccepted && c != http.StatusOK {
			t.Errorf("POST %d = %d, want 202 or 200", i, c)
		}
	}
	waitState(t, h, "c1", stateSettled)
	checkPaidOnce(t, w, funds, pool, n)
	if got := metric(t, h, `rewarder_epochs_total{state="computed"}`); got != "1" {
		t.Errorf("epochs computed = %s, want 1", got)
	}
	if _, _, batches := w.snapshot(); batches != 2 {
		t.Errorf("wallet committed %d batches, want 2", batches)
	}
}

// TestLostResponses: the wallet commits every first attempt and answers
// 503; the retries, with the same key and nonce, get the replay.
func TestLostResponses(t *testing.T) {
	const funds, pool, n = 1 << 40, 10_000, 2100
	w := newWalletStub("pool", funds)
	seen := map[int]bool{}
	w.lose = func(n int) bool { first := !seen[n]; seen[n] = true; return n%2 == 0 && first }
	h := start(t, "", "", w)
	call(t, h, "POST", "/v1/epochs/l1/compute", inputs(pool, n))
	e := waitState(t, h, "l1", stateSettled)
	checkPaidOnce(t, w, funds, pool, n)
	if e.Settlement.Attempts <= e.Settlement.Parts {
		t.Errorf("attempts = %d, want more than the %d parts (the lost answers were retried)", e.Settlement.Attempts, e.Settlement.Parts)
	}
}

// TestNonceMoved: another debit of the pool moves its nonce between the
// rewarder's read and its batch; the 409 is retried with the same key and
// the expected nonce.
func TestNonceMoved(t *testing.T) {
	const funds, pool, n = 1 << 40, 5000, 10
	w := newWalletStub("pool", funds)
	w.before = func(n int, _ *http.Request) int {
		if n == 0 {
			w.mu.Lock()
			w.nonce["pool"] += 3 // someone else debited the pool
			w.mu.Unlock()
		}
		return 0
	}
	h := start(t, "", "", w)
	call(t, h, "POST", "/v1/epochs/n1/compute", inputs(pool, n))
	waitState(t, h, "n1", stateSettled)
	checkPaidOnce(t, w, funds, pool, n)
}

// TestWalletUnavailable: the wallet answers 503 until the epoch is
// quarantined as settlement_unavailable; retry, once it is back, settles
// with the same keys, once.
func TestWalletUnavailable(t *testing.T) {
	const funds, pool, n = 1 << 40, 9000, 1100
	w := newWalletStub("pool", funds)
	var down sync.Mutex
	up := false
	w.before = func(n int, _ *http.Request) int {
		down.Lock()
		defer down.Unlock()
		if n >= 1 && !up { // the first part settles, then the wallet goes away
			return http.StatusServiceUnavailable
		}
		return 0
	}
	h := start(t, "", "", w)
	// Every reason is there from the start, at 0.
	for _, reason := range quarantineReasons {
		if got := metric(t, h, `quarantine_total{reason="`+reason+`"}`); got != "0" {
			t.Errorf("quarantine_total{reason=%q} at start = %q, want 0", reason, got)
		}
	}
	call(t, h, "POST", "/v1/epochs/u1/compute", inputs(pool, n))
	e := waitState(t, h, "u1", stateQuarantined)
	if e.Reason != reasonUnavailable || e.Settlement.SettledParts != 1 {
		t.Fatalf("manifest = %+v, want quarantined as %s after 1 part", e, reasonUnavailable)
	}
	if got := metric(t, h, `quarantine_total{reason="settlement_unavailable"}`); got != "1" {
		t.Errorf("quarantine_total = %q, want 1", got)
	}
	down.Lock()
	up = true
	down.Unlock()
	if code, body := call(t, h, "POST", "/v1/epochs/u1/retry", ""); code != http.StatusAccepted {
		t.Fatalf("POST retry = %d %s, want 202", code, body)
	}
	e = waitState(t, h, "u1", stateSettled)
	if e.Generation != 0 {
		t.Errorf("generation = %d, want 0: settlement_unavailable keeps the keys", e.Generation)
	}
	checkPaidOnce(t, w, funds, pool, n)
}

// TestInsufficientFunds: the pool holds less than the epoch; the epoch is
// quarantined and nothing more is paid; once topped up, retry settles
// with the next generation of keys (the wallet recorded the 422).
func TestInsufficientFunds(t *testing.T) {
	const pool, n = 100_000, 1500
	w := newWalletStub("pool", 60_000) // enough for the first part only
	h := start(t, "", "", w)
	call(t, h, "POST", "/v1/epochs/f1/compute", inputs(pool, n))
	e := waitState(t, h, "f1", stateQuarantined)
	if e.Reason != reasonFunds {
		t.Fatalf("reason = %q, want %s", e.Reason, reasonFunds)
	}
	_, _, batches := w.snapshot()
	time.Sleep(100 * time.Millisecond) // several rescans: none may send more
	if _, _, again := w.snapshot(); again != batches {
		t.Fatalf("batches went from %d to %d while quarantined", batches, again)
	}
	w.mu.Lock()
	w.balance["pool"] += 1_000_000
	w.mu.Unlock()
	if code, body := call(t, h, "POST", "/v1/epochs/f1/retry", ""); code != http.StatusAccepted {
		t.Fatalf("POST retry = %d %s, want 202", code, body)
	}
	e = waitState(t, h, "f1", stateSettled)
	if e.Generation != 1 {
		t.Errorf("generation = %d, want 1", e.Generation)
	}
	checkPaidOnce(t, w, 60_000+1_000_000, pool, n)
}

// TestConservationFailure: a defect in the computation quarantines the
// epoch before any settlement; retry, once fixed, computes and settles.
func TestConservationFailure(t *testing.T) {
	const funds, pool, n = 1 << 40, 1000, 7
	w := newWalletStub("pool", funds)
	tamper = func(p []Payout) { p[0].Amount++ }
	t.Cleanup(func() { tamper = nil })
	h := start(t, "", "", w)
	call(t, h, "POST", "/v1/epochs/k1/compute", inputs(pool, n))
	e := waitState(t, h, "k1", stateQuarantined)
	if e.Reason != reasonConservation {
		t.Fatalf("reason = %q, want %s", e.Reason, reasonConservation)
	}
	if code, _ := call(t, h, "GET", "/v1/epochs/k1/run.json", ""); code != http.StatusNotFound {
		t.Errorf("GET run.json of a quarantined computation = %d, want 404", code)
	}
	if _, _, b := w.snapshot(); b != 0 {
		t.Fatalf("wallet committed %d batches, want none", b)
	}
	tamper = nil
	if code, body := call(t, h, "POST", "/v1/epochs/k1/retry", ""); code != http.StatusAccepted {
		t.Fatalf("POST retry = %d %s, want 202", code, body)
	}
	waitState(t, h, "k1", stateSettled)
	checkPaidOnce(t, w, funds, pool, n)
	if code, _ := call(t, h, "POST", "/v1/epochs/k1/retry", ""); code != http.StatusConflict {
		t.Errorf("POST retry of a settled epoch = %d, want 409", code)
	}
}

// TestDrainResumes: the drain ends while part 1 is stuck in the wallet;
// the next process, on the same data directory, resumes with the same
// key and nonce, and the epoch settles once.
func TestDrainResumes(t *testing.T) {
	const funds, pool, n = 1 << 40, 50_000, 3000
	w := newWalletStub("pool", funds)
	stuck := make(chan struct{})
	var once sync.Once
	w.before = func(n int, r *http.Request) int {
		if n == 1 {
			once.Do(func() { close(stuck) })
			<-r.Context().Done() // held until the rewarder gives up
			return http.StatusServiceUnavailable
		}
		return 0
	}
	dir := t.TempDir()
	h := plugintest.New(t, definition(), plugintest.Options{DataDir: dir, Config: testConfig, Plugins: map[string]http.Handler{"wallet": w}})
	call(t, h, "POST", "/v1/epochs/d1/compute", inputs(pool, n))
	<-stuck
	if _, _, err := h.Drain(t.Context(), time.Now().Add(300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if got := metric(t, h, `rewarder_tasks_canceled_total{kind="settle"}`); got != "1" {
		t.Errorf(`rewarder_tasks_canceled_total{kind="settle"} = %q, want 1: the drain ended d1's round`, got)
	}
	w.before = nil
	h2 := start(t, dir, "", w)
	e := waitState(t, h2, "d1", stateSettled)
	if e.Settlement.Parts != 3 {
		t.Errorf("parts = %d, want 3", e.Settlement.Parts)
	}
	checkPaidOnce(t, w, funds, pool, n)
}

func TestBadRequests(t *testing.T) {
	h := start(t, "", "max_contributions = 3", newWalletStub("pool", 1))
	tests := []struct {
		path, body string
		code       int
		field      string
	}{
		{"/v1/epochs/e/compute", inputs(10, 4), 400, "contributions"},
		{"/v1/epochs/e/compute", `{"pool_account":"pool","pool_amount":0,"contributions":[]}`, 400, "pool_amount"},
		{"/v1/epochs/e/compute", `{"pool_account":"pool","pool_amount":1,"contributions":[],"extra":1}`, 400, "body"},
		{"/v1/epochs/e.x/compute", inputs(10, 2), 400, "epoch"},
	}
	for _, tt := range tests {
		code, body := call(t, h, "POST", tt.path, tt.body)
		if code != tt.code || (tt.field != "" && !strings.Contains(body, `"field":"`+tt.field+`"`)) {
			t.Errorf("POST %s %.60s = %d %s, want %d about %s", tt.path, tt.body, code, body, tt.code, tt.field)
		}
	}
	if code, _ := call(t, h, "GET", "/v1/epochs/none", ""); code != http.StatusNotFound {
		t.Errorf("GET of an unknown epoch = %d, want 404", code)
	}
}

// TestComputeBodyLimit: the compute route takes bodies up to its own
// limit, over the host's 1 MiB default, and the host refuses one whose
// Content-Length is over it before the rewarder reads it.
func TestComputeBodyLimit(t *testing.T) {
	// Recipient i weighs i+1: a pool of the weights' sum pays each.
	const n = 40_000
	const pool = n * (n + 1) / 2
	h := start(t, "", "", newWalletStub("pool", pool))
	big := inputs(pool, n)
	if len(big) <= 1<<20 {
		t.Fatalf("the body is %d bytes, want over the host's 1 MiB default", len(big))
	}
	if code, body := call(t, h, "POST", "/v1/epochs/big/compute", big); code != http.StatusAccepted {
		t.Fatalf("POST /v1/epochs/big/compute with %d contributions (%d bytes) = %d %s, want 202", n, len(big), code, body)
	}
	if e := waitState(t, h, "big", "settled"); e.Recipients != n {
		t.Errorf("epoch big has %d recipients, want %d", e.Recipients, n)
	}

	// The head declares one byte over the limit; the body that follows
	// is never read.
	req := httptest.NewRequest("POST", "/v1/epochs/over/compute", strings.NewReader(inputs(10, 2)))
	req.ContentLength = computeMaxBody + 1
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(rec.Body.String(), fmt.Sprintf("the limit is %d", computeMaxBody)) {
		t.Errorf("POST /v1/epochs/over/compute with Content-Length %d = %d %s, want 413 naming the limit of %d", computeMaxBody+1, rec.Code, rec.Body.String(), computeMaxBody)
	}
	if code, _ := call(t, h, "GET", "/v1/epochs/over", ""); code != http.StatusNotFound {
		t.Errorf("GET of the refused epoch = %d, want 404", code)
	}
}

func TestConfigRefused(t *testing.T) {
	for _, tt := range []struct{ config, attr, message string }{
		{`work_queue = 0`, "work_queue", ""},
		{`compute_workers = 1.5`, "compute_workers", ""},
		{`epoch_duration = "48h"`, "epoch_duration", "must be from 1s to 24h0m0s, got 48h0m0s"},
		{`epoch_duration = "500ms"`, "epoch_duration", "must be from 1s to 24h0m0s, got 500ms"},
		{`wallet_plugin = ""`, "wallet_plugin", ""},
		{`retention = "30m"`, "retention", ""},
		{`event_consumers = ["other"]`, "event_consumers", ""},
		{`events_buffer = 0`, "events_buffer", ""},
		{"settle {\n retries = 0\n}", "settle.retries", ""},
	} {
		_, err := plugintest.Start(t, definition(), plugintest.Options{Config: tt.config})
		var ce *sdk.ConfigError
		if !errors.As(err, &ce) || ce.Attribute != tt.attr || tt.message != "" && ce.Message != tt.message {
			t.Errorf("Start(%s) = %v, want a ConfigError about %s %s", tt.config, err, tt.attr, tt.message)
		}
	}
}

// TestWorkerPanicRestarts: a compute that panics takes its worker down;
// the supervisor restarts it, the epoch is offered again, and it settles.
func TestWorkerPanicRestarts(t *testing.T) {
	const funds, pool, n = 1 << 40, 1000, 5
	w := newWalletStub("pool", funds)
	var once sync.Once
	tamper = func([]Payout) { once.Do(func() { panic("injected") }) }
	t.Cleanup(func() { tamper = nil })
	h := start(t, "", "compute_workers = 1", w)
	call(t, h, "POST", "/v1/epochs/p1/compute", inputs(pool, n))
	waitState(t, h, "p1", stateSettled)
	checkPaidOnce(t, w, funds, pool, n)
	if got := metric(t, h, `service_restarts_total{task="worker"}`); got != "1" {
		t.Errorf("service_restarts_total{task=worker} = %q, want 1", got)
	}
}
