package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plughost/plughost/plugins/wallet/internal/bus"
	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/view"
	"github.com/plughost/plughost/plugins/wallet/internal/wallettest"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/breaker"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/store"
)

// stalledWallet is the API served over real HTTP, on a real committer and
// ledger whose log fdatasync waits at gate: the first commit stalls on
// the disk until the test opens it. settled is closed once the committer
// has handed the stalled commit's operations to Settled.
type stalledWallet struct {
	srv     *httptest.Server
	ledger  *ledger.Ledger
	gate    *wallettest.Gate
	settled <-chan struct{}
}

func newStalledWallet(t *testing.T) *stalledWallet {
	t.Helper()
	hooks := &store.Hooks{}
	l, err := ledger.Open(filepath.Join(t.TempDir(), "wallet.db"), ledger.Options{Render: Render, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	gate := wallettest.NewGate()
	hooks.SetSync(func(f *os.File) error {
		if err := gate.Inject(context.Background(), "ledger.sync"); err != nil {
			return err
		}
		return store.Fdatasync(f)
	})

	settled := make(chan struct{})
	var settledOnce sync.Once
	var current atomic.Pointer[API]
	c, err := durable.New(durable.Options[ledger.Op, ledger.Result]{
		Store:      l,
		Apply:      l.Apply,
		Probe:      l.Probe,
		Committers: 1,
		// Long enough that the stalled commit has surely begun, and so
		// is answered outcome_unknown, on a loaded machine; the gate,
		// not the timeout, decides when the commit ends.
		CommitTimeout: 3 * time.Second,
		// The breaker, tripped by the stall, stays open throughout: the
		// answers do not depend on when it would half-open.
		Breaker: breaker.Settings{Cooldown: time.Hour},
		Settled: func(ops []ledger.Op) {
			current.Load().Settled(ops)
			settledOnce.Do(func() { close(settled) })
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	a, err := New(Options{
		Ledger:    l,
		Committer: c,
		View:      view.New(view.Options{Source: l}, l.Seq()),
		Events:    bus.New[*ledger.Receipt](16),
	})
	if err != nil {
		t.Fatal(err)
	}
	current.Store(a)
	mux := sdk.NewMux()
	Register(mux, current.Load)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(gate.Open) // first: the committer's Close waits for the stalled commit
	return &stalledWallet{srv: srv, ledger: l, gate: gate, settled: settled}
}

// response is what a POST was answered.
type response struct {
	status   int
	replayed bool
	body     []byte
}

// code returns the error code of an error response's body.
func (r response) code() string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Code
}

func (r response) String() string {
	return strings.TrimSpace(http.StatusText(r.status) + " " + string(r.body))
}

func (w *stalledWallet) post(t *testing.T, path, key, body string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, w.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := w.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read body: %v", path, err)
	}
	return response{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: b}
}

// TestRetryWhileCommitStalled pins the claim of a key whose commit is
// stalled on the disk: its caller is answered 503 outcome_unknown, and
// until the commit lands a retry with the key gets 409
// idempotency_key_in_use (422 with another body), never an answer that
// says nothing was applied. Once it has landed, the retry gets its
// recorded 200, replayed, and the issue was applied once.
func TestRetryWhileCommitStalled(t *testing.T) {
	w := newStalledWallet(t)
	const body = `{"to":"alice","amount":5}`
	if r := w.post(t, "/v1/issue", "k1", body); r.status != http.StatusServiceUnavailable || r.code() != "outcome_unknown" {
		t.Fatalf("POST k1 with the disk stalled = %v, want 503 outcome_unknown", r)
	}
	w.gate.WaitEntered(t) // the commit is held in its fdatasync

	for _, tt := range []struct {
		name   string
		body   string
		status int
		code   string
	}{
		{"same request", body, http.StatusConflict, "idempotency_key_in_use"},
		{"another request", `{"to":"alice","amount":6}`, http.StatusUnprocessableEntity, "idempotency_key_reused"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if r := w.post(t, "/v1/issue", "k1", tt.body); r.status != tt.status || r.code() != tt.code {
				t.Errorf("POST k1 %s while its commit is stalled = %v, want %d %s: the key must stay claimed until the commit settles", tt.body, r, tt.status, tt.code)
			}
		})
	}

	w.gate.Open()
	select {
	case <-w.settled:
	case <-time.After(20 * time.Second):
		t.Fatal("the stalled commit did not settle within 20s of the disk answering")
	}
	r := w.post(t, "/v1/issue", "k1", body)
	var rc ledger.Receipt
	if err := json.Unmarshal(r.body, &rc); err != nil || r.status != http.StatusOK || !r.replayed || rc.Seq != 1 {
		t.Fatalf("retry of k1 after the commit landed = %v (replayed %t), want 200 replaying the receipt of seq 1", r, r.replayed)
	}
	if s, seq, err := w.ledger.Supply(); err != nil || s.Issued != 5 || seq != 1 {
		t.Errorf("Supply() = %+v at seq %d, %v; want 5 issued at seq 1: the issue applied exactly once", s, seq, err)
	}
}
