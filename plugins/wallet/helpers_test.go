package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/durable"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		// go-plugin's test-mode Serve, which plugintest runs in-process,
		// gives each harness stdio pipes whose write ends it never closes:
		// the goroutines copying them end only once the garbage collector
		// finalizes the writers. Without a collection here, whether the
		// last harnesses' goroutines are gone when goleak looks depends on
		// when the last GC ran.
		runtime.GC()
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: Errors on successful test run:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testWallet is the wallet served in-process over real gRPC by plugintest.
type testWallet struct {
	t *testing.T
	h *plugintest.Harness
	w *wallet
}

// start serves the wallet with config in dir (a fresh temporary directory
// when empty). faults, if not nil, stands in for the Runtime's fault
// points. The wallet is drained when the test ends, before the harness
// stops, so that nothing it started outlives the test.
func start(t *testing.T, config string, faults durable.Injector, dir string) *testWallet {
	t.Helper()
	w := &wallet{faults: faults, now: plugintest.Now}
	if dir == "" {
		dir = t.TempDir()
	}
	h := plugintest.New(t, newDefinition(w), plugintest.Options{Config: config, DataDir: dir})
	tw := &testWallet{t: t, h: h, w: w}
	t.Cleanup(func() { tw.drain(10 * time.Second) })
	return tw
}

// drain drains the wallet with the given deadline and returns the SDK's
// counts of requests that completed and were abandoned.
func (tw *testWallet) drain(d time.Duration) (completed, abandoned int64) {
	tw.t.Helper()
	completed, abandoned, err := tw.h.Drain(context.Background(), time.Now().Add(d))
	if err != nil {
		tw.t.Errorf("Drain = %v", err)
	}
	return completed, abandoned
}

// response is a recorded answer.
type response struct {
	code   int
	header http.Header
	body   string
}

func (r response) String() string { return strconv.Itoa(r.code) + " " + strings.TrimSpace(r.body) }

// errorCode returns the code of an error body.
func (r response) errorCode() string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(r.body), &e)
	return e.Error.Code
}

// do sends one request through the harness. It is safe to call from any
// goroutine.
func (tw *testWallet) do(method, path string, header http.Header, body string) response {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	for k, vs := range header {
		req.Header[k] = vs
	}
	rec := httptest.NewRecorder()
	tw.h.ServeHTTP(rec, req)
	return response{code: rec.Code, header: rec.Header(), body: rec.Body.String()}
}

// post sends a JSON POST with an Idempotency-Key.
func (tw *testWallet) post(path, key, body string) response {
	h := http.Header{"Content-Type": {"application/json"}}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return tw.do(http.MethodPost, path, h, body)
}

func (tw *testWallet) get(path string) response {
	return tw.do(http.MethodGet, path, nil, "")
}

// mustPost posts and fails the test unless the answer is want.
func (tw *testWallet) mustPost(path, key, body string, want int) response {
	tw.t.Helper()
	r := tw.post(path, key, body)
	if r.code != want {
		tw.t.Fatalf("POST %s %s = %s, want %d", path, body, r, want)
	}
	return r
}

// receiptJSON is a receipt as the API answers it.
type receiptJSON struct {
	TxID string `json:"tx_id"`
	Kind string `json:"kind"`
	From string `json:"from"`
	To   string `json:"to"`
	Legs []struct {
		To     string `json:"to"`
		Amount uint64 `json:"amount"`
	} `json:"legs"`
	Amount      uint64    `json:"amount"`
	Nonce       uint64    `json:"nonce"`
	Seq         uint64    `json:"seq"`
	CommittedAt time.Time `json:"committed_at"`
}

func decodeReceipt(t *testing.T, r response) receiptJSON {
	t.Helper()
	var rc receiptJSON
	if err := json.Unmarshal([]byte(r.body), &rc); err != nil || rc.TxID == "" {
		t.Fatalf("receipt %s: %v", r, err)
	}
	return rc
}

type accountJSON struct {
	Account string    `json:"account"`
	Balance uint64    `json:"balance"`
	Nonce   uint64    `json:"nonce"`
	Seq     uint64    `json:"seq"`
	AsOf    time.Time `json:"as_of"`
}

// account reads an account with a snapshot that includes minSeq, failing
// the test if it cannot. Call it on the test goroutine only.
func (tw *testWallet) account(id string, minSeq uint64) accountJSON {
	tw.t.Helper()
	a, err := tw.tryAccount(id, minSeq)
	if err != nil {
		tw.t.Fatal(err)
	}
	return a
}

// tryAccount is account for any goroutine: it returns the error instead of
// failing the test.
func (tw *testWallet) tryAccount(id string, minSeq uint64) (accountJSON, error) {
	r := tw.get("/v1/accounts/" + id + "?min_seq=" + strconv.FormatUint(minSeq, 10))
	var a accountJSON
	if r.code != http.StatusOK || json.Unmarshal([]byte(r.body), &a) != nil {
		return a, fmt.Errorf("GET account %s = %s", id, r)
	}
	if a.Seq < minSeq {
		return a, fmt.Errorf("GET account %s?min_seq=%d answered seq %d", id, minSeq, a.Seq)
	}
	return a, nil
}

type supplyJSON struct {
	Issued uint64 `json:"issued"`
	Burned uint64 `json:"burned"`
	Supply uint64 `json:"supply"`
	Seq    uint64 `json:"seq"`
}

func (tw *testWallet) supply(minSeq uint64) supplyJSON {
	tw.t.Helper()
	r := tw.get("/v1/supply?min_seq=" + strconv.FormatUint(minSeq, 10))
	var s supplyJSON
	if r.code != http.StatusOK || json.Unmarshal([]byte(r.body), &s) != nil {
		tw.t.Fatalf("GET supply = %s", r)
	}
	return s
}

// metric returns the value of one series, such as
// `queue_depth{queue="commit"}`, from the plugin's metrics.
func (tw *testWallet) metric(series string) float64 {
	tw.t.Helper()
	text, err := tw.h.Metrics(context.Background())
	if err != nil {
		tw.t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tw.t.Fatalf("metric %s = %q", series, v)
			}
			return f
		}
	}
	tw.t.Fatalf("metric %s not found in:\n%s", series, text)
	return 0
}

// eventually polls cond every 5ms until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not a stand-in for the condition
	}
}

// async runs fn on a goroutine and returns a channel with its result.
func async[T any](fn func() T) <-chan T {
	ch := make(chan T, 1)
	go func() { ch <- fn() }()
	return ch
}

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatal("no result within 20s")
		var zero T
		return zero
	}
}

// faultSet is the SDK's own fault set, as the host's admin API sets it.
func faultSet(t *testing.T, list ...sdk.Fault) *sdk.Faults {
	t.Helper()
	f := walletFaults()
	if err := f.Set(list); err != nil {
		t.Fatal(err)
	}
	return f
}

// walletFaults returns fault points with the wallet's declared, as the
// committer and Configure declare them on the Runtime's, so that a test
// may set faults before either runs.
func walletFaults() *sdk.Faults {
	f := &sdk.Faults{}
	f.Declare(commitFaultPoint, SyncFaultPoint)
	return f
}
