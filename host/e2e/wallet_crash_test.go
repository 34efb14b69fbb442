package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// ackedTransfer is a transfer the wallet answered 200.
type ackedTransfer struct {
	key, body string
	resp      []byte
	rc        receipt
	start     time.Time
}

// transferWorker owns one source account and its nonce sequence.
type transferWorker struct {
	id    int
	from  string
	nonce uint64 // acknowledged debits of from
	acked []ackedTransfer

	unknown, replayedAfterUnknown, refused int
	codes                                  map[int]int
	err                                    error
}

func TestWalletKill9UnderLoad(t *testing.T) {
	h := startHost(t, baseConfig("2s")+walletBlock(""))
	old := readyPlugin(t, h, "wallet")
	kill9UnderLoad(t, h, "kill9", func() *hostProc {
		if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 wallet (pid %d): %v", old.Pid, err)
		}
		return h
	})
	st := h.plugins()["wallet"]
	if st.Pid == old.Pid || st.Pid == 0 || st.Restarts < 1 {
		t.Errorf("wallet after kill -9: pid %d restarts %d, want a new pid (old %d) and restarts >= 1", st.Pid, st.Restarts, old.Pid)
	}
}

// TestWalletKill9HostUnderLoad kills the host, and with it the wallet,
// under transfer load, then starts a new host on the same data directory:
// the wallet recovers its ledger from the write-ahead log.
func TestWalletKill9HostUnderLoad(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	cfg := strings.Replace(baseConfig("2s"), `"./data"`, strconv.Quote(data), 1) + walletBlock("")
	h := startHost(t, cfg)
	old := readyPlugin(t, h, "wallet")
	kill9UnderLoad(t, h, "kill9host", func() *hostProc {
		h.signal(syscall.SIGKILL)
		if _, ok := h.waitExit(5 * time.Second); !ok {
			t.Fatal("host still running 5s after SIGKILL")
		}
		if !waitGone(old.Pid, 5*time.Second) {
			t.Fatalf("wallet (pid %d) still alive 5s after kill -9 of the host", old.Pid)
		}
		if _, err := os.Stat(filepath.Join(data, "wallet", "wallet.db.wal")); err != nil {
			t.Errorf("the killed wallet left no write-ahead log: %v", err)
		}
		return startHost(t, cfg)
	})
}

// kill9UnderLoad runs transfers from 16 workers through h, calls kill
// once 200 are acknowledged, goes on through the host kill returns until
// 200 more sent after it are acknowledged, and then checks the ledger
// against a model of the acknowledged transfers: balances, nonces and the
// supply match, every acknowledged receipt is stored and replays byte for
// byte, nothing unacknowledged was applied in part.
func kill9UnderLoad(t *testing.T, h *hostProc, prefix string, kill func() *hostProc) {
	t.Helper()
	const (
		workers    = 16
		initial    = 1_000_000
		maxAmount  = 100
		maxPerWork = 3000 // bounds the load even if the test stalls
	)
	// maxPerWork × maxAmount stays below initial: no debit can be refused
	// for funds, so every refusal is a failure of the test's model.
	if maxPerWork*maxAmount >= initial {
		t.Fatal("maxPerWork × maxAmount must stay below initial")
	}
	accounts := make([]string, workers)
	for i := range accounts {
		accounts[i] = fmt.Sprintf("%s-%02d", prefix, i)
		walletIssue(t, h, prefix+"-issue-"+accounts[i], accounts[i], initial)
	}

	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	t.Cleanup(tr.CloseIdleConnections)
	lc := &http.Client{Transport: tr, Timeout: 15 * time.Second}
	var target atomic.Pointer[hostProc]
	target.Store(h)
	url := func() string { return target.Load().ingress + "/wallet/v1/transfer" }

	var killedAt atomic.Int64 // unix nanos of the kill; 0 before
	var acksAfterKill, acksTotal, failed atomic.Int64
	ws := make([]*transferWorker, workers)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range ws {
		w := &transferWorker{id: i, from: accounts[i], codes: map[int]int{}}
		ws[i] = w
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			w.err = w.run(t.Context(), lc, url, rng, accounts, maxAmount, maxPerWork, stop, func(a ackedTransfer) {
				acksTotal.Add(1)
				if k := killedAt.Load(); k != 0 && a.start.UnixNano() > k {
					acksAfterKill.Add(1)
				}
			})
			if w.err != nil {
				failed.Add(1)
			}
		})
	}
	stopLoad := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	t.Cleanup(stopLoad)

	// A worker that finds the wallet inconsistent with its model stops;
	// its error is reported below.
	waitFor(t, 20*time.Second, "200 acknowledged transfers before the kill", func() bool { return acksTotal.Load() >= 200 || failed.Load() > 0 })
	killedAt.Store(time.Now().UnixNano())
	h = kill()
	target.Store(h)
	waitFor(t, 30*time.Second, "200 acknowledged transfers sent after the kill", func() bool { return acksAfterKill.Load() >= 200 || failed.Load() > 0 })
	stopLoad()

	// The model: balances and nonces from the acknowledged transfers only.
	balance := map[string]uint64{}
	for _, a := range accounts {
		balance[a] = initial
	}
	var all []ackedTransfer
	var unknown, replayedAfterUnknown, refused int
	codes := map[int]int{}
	for _, w := range ws {
		if w.err != nil {
			t.Errorf("worker %d (%s): %v", w.id, w.from, w.err)
		}
		for _, a := range w.acked {
			balance[a.rc.From] -= a.rc.Amount
			balance[a.rc.To] += a.rc.Amount
		}
		all = append(all, w.acked...)
		unknown += w.unknown
		replayedAfterUnknown += w.replayedAfterUnknown
		refused += w.refused
		for c, n := range w.codes {
			codes[c] += n
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d transfers acknowledged (%d sent after the kill); first answers by status (0: no answer): %v; "+
		"%d unknown outcomes resolved by replay (%d of them had committed before their answer was lost); %d refused and retried with a new key",
		len(all), acksAfterKill.Load(), codes, unknown, replayedAfterUnknown, refused)
	if unknown+refused == 0 {
		t.Errorf("no request failed around the kill -9, want the kill to hit the load (503s or cut connections)")
	}

	// Every acknowledged transfer has a receipt of its own: tx_ids and
	// seqs are unique.
	txIDs, seqs := map[string]bool{}, map[uint64]bool{}
	var maxSeq uint64
	for _, a := range all {
		if txIDs[a.rc.TxID] || seqs[a.rc.Seq] {
			t.Errorf("receipt %+v repeats a tx_id or seq of another acknowledged transfer", a.rc)
		}
		txIDs[a.rc.TxID], seqs[a.rc.Seq] = true, true
		maxSeq = max(maxSeq, a.rc.Seq)
	}

	// Balances and nonces equal the model: nothing acknowledged was lost,
	// nothing unacknowledged was applied, in whole or in part.
	var sum uint64
	for i, id := range accounts {
		got := walletAccount(t, h, id, maxSeq)
		want := accountSnap{Account: id, Balance: balance[id], Nonce: ws[i].nonce, Seq: got.Seq}
		if got != want {
			t.Errorf("GET /wallet/v1/accounts/%s = %+v, want %+v (the model of acknowledged transfers)", id, got, want)
		}
		sum += got.Balance
	}
	s := walletSupply(t, h, maxSeq)
	if want := uint64(workers * initial); s.Issued != want || s.Burned != 0 || s.Supply != want || sum != want {
		t.Errorf("supply = %+v and the balances sum to %d; want issued = supply = sum = %d, burned 0", s, sum, want)
	}

	// Then, read-only as far as a correct wallet goes: each acknowledged
	// receipt is served by GET /v1/receipts/{tx_id}, and each replay of
	// an acknowledged key answers its bytes. Each worker's transfers are
	// checked in a goroutine of their own; errors are reported here.
	errs := make([][]string, workers)
	var cwg sync.WaitGroup
	for i, w := range ws {
		cwg.Go(func() { errs[i] = w.verify(t.Context(), client, h.ingress) })
	}
	cwg.Wait()
	var bad []string
	for _, e := range errs {
		bad = append(bad, e...)
	}
	if len(bad) > 0 {
		t.Errorf("%d acknowledged transfers are not in the ledger as acknowledged; first ones:\n%s", len(bad), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
}

// transfersFrom runs one transferWorker per account, each making
// perWorker acknowledged transfers of at most 100 from its account to
// the others over c (rng seeded by the worker's index and seed), and
// returns them once all are done; a worker's error fails the test.
func transfersFrom(t *testing.T, h *hostProc, c *http.Client, accounts []string, perWorker int, seed uint64) []*transferWorker {
	t.Helper()
	ws := make([]*transferWorker, len(accounts))
	never := make(chan struct{})
	url := func() string { return h.ingress + "/wallet/v1/transfer" }
	var wg sync.WaitGroup
	for i := range ws {
		w := &transferWorker{id: i, from: accounts[i], codes: map[int]int{}}
		ws[i] = w
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), seed))
			w.err = w.run(t.Context(), c, url, rng, accounts, 100, perWorker, never, func(ackedTransfer) {})
		})
	}
	wg.Wait()
	for _, w := range ws {
		if w.err != nil {
			t.Fatalf("worker %d: %v", w.id, w.err)
		}
	}
	return ws
}

// run sends transfers from w.from until stop is closed or maxOps have
// been made, and returns the first inconsistency. It never leaves an operation
// with an unknown outcome behind: such an operation is replayed with its
// key and body until the wallet says what became of it.
func (w *transferWorker) run(ctx context.Context, c *http.Client, url func() string, rng *rand.Rand, accounts []string,
	maxAmount uint64, maxOps int, stop <-chan struct{}, onAck func(ackedTransfer)) error {
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for range maxOps {
		if stopped() {
			return nil
		}
		to := accounts[(w.id+1+rng.IntN(len(accounts)-1))%len(accounts)]
		amount := 1 + rng.Uint64N(maxAmount)
		nonce := w.nonce + 1
		body := fmt.Sprintf(`{"from":%q,"to":%q,"amount":%d,"nonce":%d}`, w.from, to, amount, nonce)
		for try := 0; ; try++ {
			key := fmt.Sprintf("%s-n%d-t%d", w.from, nonce, try)
			start := time.Now()
			r, err := walletPost(ctx, c, url(), key, body)
			if err == nil {
				w.codes[r.code]++
			} else {
				w.codes[0]++
			}
			if err != nil || (r.code != http.StatusOK && !notApplied(r)) {
				if err == nil && (r.code == http.StatusConflict || r.code == http.StatusUnprocessableEntity || r.code == http.StatusBadRequest) {
					return fmt.Errorf("transfer %s (key %s) = %v; the model expects nonce %d to be next and funds to suffice", body, key, r, nonce)
				}
				w.unknown++
				if r, err = resolve(ctx, c, url, key, body); err != nil {
					return err
				}
				if r.code == http.StatusOK && r.replayed() {
					w.replayedAfterUnknown++
				}
			}
			if r.code != http.StatusOK {
				// Not applied: a new key for the same nonce.
				w.refused++
				if stopped() {
					return nil
				}
				continue
			}
			rc, err := decodeReceipt(r.body)
			if err != nil {
				return err
			}
			if rc.Kind != "transfer" || rc.From != w.from || rc.To != to || rc.Amount != amount || rc.Nonce != nonce {
				return fmt.Errorf("transfer %s (key %s) answered receipt %s, which is not of this transfer", body, key, r.body)
			}
			a := ackedTransfer{key: key, body: body, resp: r.body, rc: rc, start: start}
			w.acked = append(w.acked, a)
			w.nonce = nonce
			onAck(a)
			break
		}
	}
	return nil
}

// resolve replays key and body until the wallet answers 200 (the
// operation is committed, then or now) or a refusal that proves it was
// not applied. A replay reaches the ledger's idempotency record before it
// could commit anything, so a refusal means no record, and no commit.
func resolve(ctx context.Context, c *http.Client, url func() string, key, body string) (walletResp, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := walletPost(ctx, c, url(), key, body)
		if err == nil {
			switch {
			case r.code == http.StatusOK || notApplied(r):
				return r, nil
			case r.code == http.StatusConflict && r.errCode() == "idempotency_key_in_use":
				// The first request is still being committed.
			case r.code == http.StatusBadGateway || r.code == http.StatusServiceUnavailable || r.code == http.StatusGatewayTimeout:
				// The wallet is still down or restarting.
			default:
				return r, fmt.Errorf("replay of %s with key %s = %v, want 200 or a refusal", body, key, r)
			}
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("replay of %s with key %s: no definite answer within 30s (last %v, error %v)", body, key, r, err)
		}
		time.Sleep(20 * time.Millisecond) // pace the retries, as a client would
	}
}

// verify checks that every transfer w had acknowledged is in the ledger:
// GET /v1/receipts/{tx_id} serves its receipt, and a replay of its key and
// body answers the same bytes with Idempotent-Replayed: true.
func (w *transferWorker) verify(ctx context.Context, c *http.Client, ingress string) []string {
	var bad []string
	for _, a := range w.acked {
		resp, err := c.Get(ingress + "/wallet/v1/receipts/" + a.rc.TxID)
		if err != nil {
			bad = append(bad, fmt.Sprintf("GET receipt %s: %v", a.rc.TxID, err))
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			bad = append(bad, fmt.Sprintf("GET /wallet/v1/receipts/%s = %d %s (%v), want 200", a.rc.TxID, resp.StatusCode, b, err))
			continue
		}
		got, err := decodeReceipt(b)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		if d := cmp.Diff(a.rc, got); d != "" {
			bad = append(bad, fmt.Sprintf("GET /wallet/v1/receipts/%s differs from the acknowledged receipt (-acked +stored):\n%s", a.rc.TxID, d))
		}
		r, err := walletPost(ctx, c, ingress+"/wallet/v1/transfer", a.key, a.body)
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("replay of key %s: %v", a.key, err))
		case r.code != http.StatusOK || !bytes.Equal(r.body, a.resp) || !r.replayed():
			bad = append(bad, fmt.Sprintf("replay of key %s = %v (Idempotent-Replayed %q), want 200 %s, replayed",
				a.key, r, r.header.Get("Idempotent-Replayed"), bytes.TrimSpace(a.resp)))
		}
	}
	return bad
}
