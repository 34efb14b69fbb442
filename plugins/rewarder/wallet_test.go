package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// walletStub is a fake of the wallet's batch and account routes, with
// its rules that settlement depends on: one nonce per debit, Idempotency-
// Keys that replay a recorded answer (200 and 422 insufficient_funds) and
// refuse another request with the same key, 409 nonce_mismatch unrecorded.
// The end-to-end test runs the real wallet; this stub lets in-process
// tests inject failures.
type walletStub struct {
	mu       sync.Mutex
	balance  map[string]uint64
	nonce    map[string]uint64
	records  map[string]stubRecord
	credits  map[string]int // legs received, by account
	batches  int            // batches committed
	requests int            // batch requests received
	// before, if set, may answer a batch request (with its 0-based number)
	// before the wallet looks at it; lose, if set, makes the wallet
	// commit a batch and then answer 503, as a lost response.
	before func(n int, req *http.Request) int
	lose   func(n int) bool
}

type stubRecord struct {
	body   string
	status int
	answer []byte
}

func newWalletStub(pool string, funds uint64) *walletStub {
	return &walletStub{balance: map[string]uint64{pool: funds}, nonce: map[string]uint64{},
		records: map[string]stubRecord{}, credits: map[string]int{}}
}

func (s *walletStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/accounts/{id}", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		id := r.PathValue("id")
		b, n := s.balance[id], s.nonce[id]
		s.mu.Unlock()
		fmt.Fprintf(w, `{"account":%q,"balance":%d,"nonce":%d}`, id, b, n)
	})
	mux.HandleFunc("POST /v1/batch", s.batch)
	mux.ServeHTTP(w, r)
}

func (s *walletStub) batch(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := s.requests
	s.requests++
	before := s.before
	s.mu.Unlock()
	if before != nil {
		if code := before(n, r); code != 0 {
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"error":{"code":"injected","message":"injected %d"}}`, code)
			return
		}
	}
	var b struct {
		From      string `json:"from"`
		Nonce     uint64 `json:"nonce"`
		Transfers []Leg  `json:"transfers"`
	}
	if err := json.Unmarshal(body, &b); err != nil || len(b.Transfers) == 0 || len(b.Transfers) > 1024 {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"code":"bad_request","message":"%v"}}`, err)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.records[key]; ok {
		if rec.body != string(body) {
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, `{"error":{"code":"idempotency_key_reused","message":"reused"}}`)
			return
		}
		w.WriteHeader(rec.status)
		w.Write(rec.answer)
		return
	}
	if want := s.nonce[b.From] + 1; b.Nonce != want {
		w.WriteHeader(http.StatusConflict)
		fmt.Fprintf(w, `{"error":{"code":"nonce_mismatch","message":"expects %d","expected_nonce":%d}}`, want, want)
		return
	}
	var total uint64
	for _, l := range b.Transfers {
		total += l.Amount
	}
	if s.balance[b.From] < total {
		ans := []byte(`{"error":{"code":"insufficient_funds","message":"the pool is short"}}`)
		s.records[key] = stubRecord{string(body), http.StatusUnprocessableEntity, ans}
		w.WriteHeader(http.StatusUnprocessableEntity)
		w.Write(ans)
		return
	}
	s.balance[b.From] -= total
	s.nonce[b.From]++
	for _, l := range b.Transfers {
		s.balance[l.To] += l.Amount
		s.credits[l.To]++
	}
	s.batches++
	ans := fmt.Appendf(nil, `{"kind":"batch","from":%q,"amount":%d,"nonce":%d}`, b.From, total, b.Nonce)
	s.records[key] = stubRecord{string(body), http.StatusOK, ans}
	if s.lose != nil && s.lose(n) {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.Write(ans)
}

// snapshot returns copies of the balances and credits.
func (s *walletStub) snapshot() (balance map[string]uint64, credits map[string]int, batches int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	balance, credits = map[string]uint64{}, map[string]int{}
	for k, v := range s.balance {
		balance[k] = v
	}
	for k, v := range s.credits {
		credits[k] = v
	}
	return balance, credits, s.batches
}
