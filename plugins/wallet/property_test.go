package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Bounds of the property test: workers × opsPerWorker requests, or
// propertyBudget, whichever ends first.
const (
	propertyWorkers = 8
	opsPerWorker    = 60
	propertyBudget  = 60 * time.Second
)

var propertyAccounts = []string{"acct-0", "acct-1", "acct-2", "acct-3"}

// sent is one recorded request and the answer it first got.
type sent struct {
	path, key, body string
	first           response
}

// history is what every worker saw, shared.
type history struct {
	mu       sync.Mutex
	receipts map[string]receiptJSON // by tx_id, every 200 that was not a replay
	recorded []sent                 // every 200 or 422 answered first-hand: replayable
	fresh    map[string]int         // first-hand 200s per key

	// counts of what happened, for the log
	nonceRaces, inUse, replays atomic.Int64
}

func (h *history) add(s sent, rc *receiptJSON) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recorded = append(h.recorded, s)
	if rc != nil {
		h.receipts[rc.TxID] = *rc
		h.fresh[s.key]++
	}
}

func (h *history) pick(r *rand.Rand) (sent, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.recorded) == 0 {
		return sent{}, false
	}
	return h.recorded[r.IntN(len(h.recorded))], true
}

// TestPropertyConservation runs random issues, transfers, burns and
// batches among a few accounts from many goroutines, with racing nonces,
// replays and concurrent duplicates, and then checks the ledger against
// what the clients were told:
//
//   - supply = issued − burned = the sum of all balances;
//   - replaying the receipts in seq order never takes a balance below 0,
//     and ends at the balances the wallet reports;
//   - each account's nonce is its number of successful debits;
//   - every 200 receipt is in the ledger, seqs run 1…N without gaps, and
//     nothing else was applied;
//   - every replay is byte-identical, and no key applies twice.
func TestPropertyConservation(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("WALLET_PROPERTY_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d (set WALLET_PROPERTY_SEED to repeat)", seed)

	tw := start(t, `
committers = 2
max_batch = 16
queue_capacity = 64
staleness_window = "50ms"`, nil, "")
	h := &history{receipts: map[string]receiptJSON{}, fresh: map[string]int{}}
	deadline := time.Now().Add(propertyBudget)

	var wg sync.WaitGroup
	for w := range propertyWorkers {
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for i := 0; i < opsPerWorker && time.Now().Before(deadline); i++ {
				key := fmt.Sprintf("w%d-op%d", w, i)
				switch p := r.IntN(100); {
				case p < 12:
					replay(t, tw, h, r)
				case p < 17:
					duplicate(t, tw, h, key, r)
				default:
					path, body := randomOp(t, tw, r, 0)
					send(t, tw, h, path, key, body)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	checkLedger(t, tw, h)
}

// randomOp returns a random POST. Debits guess the nonce from a snapshot
// read, which races with the other workers; nonce, if not 0, is used
// instead. It runs on the workers' goroutines, where t.Fatal must not be
// called: a failed read is reported with t.Errorf and guesses nonce 1.
func randomOp(t *testing.T, tw *testWallet, r *rand.Rand, nonce uint64) (path, body string) {
	acct := func() string { return propertyAccounts[r.IntN(len(propertyAccounts))] }
	other := func(not string) string {
		for {
			if a := acct(); a != not {
				return a
			}
		}
	}
	from := acct()
	if nonce == 0 {
		a, err := tw.tryAccount(from, 0)
		if err != nil {
			t.Errorf("guess the nonce: %v", err)
		}
		nonce = a.Nonce + 1
	}
	switch p := r.IntN(100); {
	case p < 25:
		return "/v1/issue", fmt.Sprintf(`{"to":%q,"amount":%d}`, from, 1+r.IntN(100))
	case p < 65:
		return "/v1/transfer", fmt.Sprintf(`{"from":%q,"to":%q,"amount":%d,"nonce":%d}`, from, other(from), 1+r.IntN(60), nonce)
	case p < 80:
		return "/v1/burn", fmt.Sprintf(`{"from":%q,"amount":%d,"nonce":%d}`, from, 1+r.IntN(30), nonce)
	default:
		legs := ""
		for j := range 1 + r.IntN(3) {
			if j > 0 {
				legs += ","
			}
			legs += fmt.Sprintf(`{"to":%q,"amount":%d}`, other(from), 1+r.IntN(30))
		}
		return "/v1/batch", fmt.Sprintf(`{"from":%q,"nonce":%d,"transfers":[%s]}`, from, nonce, legs)
	}
}

// send posts one request, retrying a nonce mismatch once under the same
// key with the nonce the wallet expects, and records the outcome.
func send(t *testing.T, tw *testWallet, h *history, path, key, body string) {
	for attempt := 0; ; attempt++ {
		resp := tw.post(path, key, body)
		switch {
		case resp.code == 429:
			time.Sleep(time.Millisecond) // back off as a client told 429 would
			continue
		case resp.code == 409 && resp.errorCode() == "nonce_mismatch" && attempt == 0:
			h.nonceRaces.Add(1)
			var e struct {
				Error struct {
					ExpectedNonce uint64 `json:"expected_nonce"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(resp.body), &e); err != nil || e.Error.ExpectedNonce == 0 {
				t.Errorf("POST %s %s = %s: no expected_nonce", path, body, resp)
				return
			}
			body = withNonce(body, e.Error.ExpectedNonce)
			continue
		}
		record(t, h, sent{path: path, key: key, body: body, first: resp})
		return
	}
}

// withNonce replaces the nonce of a JSON body.
func withNonce(body string, nonce uint64) string {
	var m map[string]json.RawMessage
	_ = json.Unmarshal([]byte(body), &m)
	m["nonce"] = json.RawMessage(strconv.FormatUint(nonce, 10))
	b, _ := json.Marshal(m)
	return string(b)
}

// record checks a first-hand answer and files it.
func record(t *testing.T, h *history, s sent) {
	r := s.first
	switch {
	case r.header.Get("Idempotent-Replayed") != "":
		t.Errorf("POST %s key %s answered as a replay on its first use: %s", s.path, s.key, r)
	case r.code == 200:
		var rc receiptJSON
		if err := json.Unmarshal([]byte(r.body), &rc); err != nil || rc.TxID == "" {
			t.Errorf("POST %s = %s: not a receipt", s.path, r)
			return
		}
		h.add(s, &rc)
	case r.code == 422 && r.errorCode() == "insufficient_funds":
		h.add(s, nil)
	case r.code == 409 && r.errorCode() == "nonce_mismatch":
		// Lost the race twice; not recorded by the wallet either.
	default:
		t.Errorf("POST %s %s = %s, want 200, 409 nonce_mismatch or 422 insufficient_funds", s.path, s.body, r)
	}
}

// replay resends a recorded request: it must get the same bytes.
func replay(t *testing.T, tw *testWallet, h *history, r *rand.Rand) {
	s, ok := h.pick(r)
	if !ok {
		return
	}
	h.replays.Add(1)
	got := tw.post(s.path, s.key, s.body)
	if got.code != s.first.code || got.body != s.first.body || got.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay of %s = %s (replayed %q), want %s byte for byte", s.key, got, got.header.Get("Idempotent-Replayed"), s.first)
	}
}

// duplicate sends one new request twice at once. At most one of the two
// applies; the other is told it is in progress, or replays the first.
func duplicate(t *testing.T, tw *testWallet, h *history, key string, r *rand.Rand) {
	path, body := randomOp(t, tw, r, 0)
	var wg sync.WaitGroup
	var rs [2]response
	for i := range rs {
		wg.Go(func() { rs[i] = tw.post(path, key, body) })
	}
	wg.Wait()
	fresh := 0
	for _, resp := range rs {
		switch {
		case resp.code == 409 && resp.errorCode() == "idempotency_key_in_use":
			h.inUse.Add(1)
		case resp.code == 429:
		case resp.header.Get("Idempotent-Replayed") == "true":
			h.replays.Add(1)
		default:
			fresh++
			record(t, h, sent{path: path, key: key, body: body, first: resp})
		}
	}
	if fresh == 2 && (rs[0].code == 200 || rs[1].code == 200) {
		t.Errorf("both concurrent duplicates of %s were applied: %s and %s", key, rs[0], rs[1])
	}
}

// checkLedger compares the wallet's state with the client-side history.
func checkLedger(t *testing.T, tw *testWallet, h *history) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for key, n := range h.fresh {
		if n > 1 {
			t.Errorf("key %s applied %d times", key, n)
		}
	}
	receipts := make([]receiptJSON, 0, len(h.receipts))
	for _, rc := range h.receipts {
		receipts = append(receipts, rc)
	}
	slices.SortFunc(receipts, func(a, b receiptJSON) int { return int(a.Seq) - int(b.Seq) })
	t.Logf("%d receipts, %d recorded outcomes, %d nonce races, %d duplicates in progress, %d replays",
		len(receipts), len(h.recorded), h.nonceRaces.Load(), h.inUse.Load(), h.replays.Load())
	if len(receipts) == 0 {
		t.Fatal("no operation committed")
	}

	// Replay the receipts in seq order on a model.
	balance := map[string]uint64{}
	nonce := map[string]uint64{}
	var issued, burned uint64
	debit := func(rc receiptJSON) {
		if balance[rc.From] < rc.Amount {
			t.Errorf("receipt %d takes %d from %s, which holds %d: a balance would go negative", rc.Seq, rc.Amount, rc.From, balance[rc.From])
		}
		balance[rc.From] -= rc.Amount
		nonce[rc.From]++
		if rc.Nonce != nonce[rc.From] {
			t.Errorf("receipt %d carries nonce %d, want %d: %s's %dth debit", rc.Seq, rc.Nonce, nonce[rc.From], rc.From, nonce[rc.From])
		}
	}
	for i, rc := range receipts {
		if rc.Seq != uint64(i+1) {
			t.Fatalf("receipt seqs are not 1…%d: position %d holds seq %d (a gap is an operation applied that no client was told of)", len(receipts), i, rc.Seq)
		}
		switch rc.Kind {
		case "issue":
			balance[rc.To] += rc.Amount
			issued += rc.Amount
		case "transfer":
			debit(rc)
			balance[rc.To] += rc.Amount
		case "burn":
			debit(rc)
			burned += rc.Amount
		case "batch":
			debit(rc)
			var sum uint64
			for _, l := range rc.Legs {
				balance[l.To] += l.Amount
				sum += l.Amount
			}
			if sum != rc.Amount {
				t.Errorf("batch receipt %d: legs sum to %d, amount is %d", rc.Seq, sum, rc.Amount)
			}
		default:
			t.Errorf("receipt %d has kind %q", rc.Seq, rc.Kind)
		}
		got := tw.get("/v1/receipts/" + rc.TxID)
		if got.code != 200 || cmp.Diff(rc, decodeReceipt(t, got)) != "" {
			t.Errorf("GET receipt %s = %s, want %+v", rc.TxID, got, rc)
		}
	}
	last := receipts[len(receipts)-1].Seq

	var sum uint64
	for _, id := range propertyAccounts {
		a := tw.account(id, last)
		sum += a.Balance
		if a.Balance != balance[id] || a.Nonce != nonce[id] {
			t.Errorf("account %s = balance %d, nonce %d; the receipts say balance %d, nonce %d", id, a.Balance, a.Nonce, balance[id], nonce[id])
		}
	}
	s := tw.supply(last)
	if s.Seq != last {
		t.Errorf("supply is at seq %d, but the last receipt is %d: something was applied that no client was told of", s.Seq, last)
	}
	if s.Issued != issued || s.Burned != burned || s.Supply != issued-burned || s.Supply != sum {
		t.Errorf("supply = %+v, sum of balances %d; the receipts say issued %d, burned %d", s, sum, issued, burned)
	}
	audit, err := tw.w.running.Load().ledger.Audit()
	if err != nil {
		t.Fatal(err)
	}
	if audit.Overflow || audit.Balances != audit.Issued-audit.Burned || audit.Receipts != len(receipts) {
		t.Errorf("ledger audit = %+v, want the balances of all accounts to sum to issued − burned and %d receipts", audit, len(receipts))
	}

	// Every recorded outcome still replays byte for byte.
	for _, r := range h.recorded {
		got := tw.post(r.path, r.key, r.body)
		if got.code != r.first.code || got.body != r.first.body || got.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("final replay of %s = %s, want %s byte for byte", r.key, got, r.first)
		}
	}
}
