package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/plughost/plughost/sdk/store"
)

// Quarantine reasons of settlement.
const (
	reasonUnavailable  = "settlement_unavailable"
	reasonFunds        = "insufficient_funds"
	reasonRejected     = "settlement_rejected"
	reasonArtifact     = "artifact_write_failed"
	maxWalletBodyBytes = 64 << 10
	// deadlineSlack is how close to its deadline a failed wallet call
	// counts as timed out.
	deadlineSlack = 10 * time.Millisecond
)

// quarantineReasons are every reason an epoch is quarantined with:
// quarantine_total's label values.
var quarantineReasons = []string{reasonZeroWeight, reasonOverflow, reasonDuplicate, reasonConservation,
	reasonUnavailable, reasonFunds, reasonRejected, reasonArtifact}

// settleLoop is one settlement emitter: it takes epochs from the intents
// queue until the drain begins.
func (r *running) settleLoop(ctx context.Context) {
	for {
		id, err := r.intents.Dequeue(ctx)
		if err != nil {
			return
		}
		if r.stopping() {
			r.release(id) // stays stored: the next process settles it
			r.m.canceled[kindSettle].Inc()
			continue
		}
		r.guard(id, func() { r.settleEpoch(ctx, id) })
		if r.stopping() && r.unsettled(id) {
			r.m.canceled[kindSettle].Inc()
		}
		r.release(id)
	}
}

// unsettled reports whether epoch id still waits for settlement.
func (r *running) unsettled(id string) bool {
	var e epoch
	err := r.db.View(func(s *store.Snapshot) (err error) { e, _, err = getEpoch(s, id); return err })
	return err == nil && (e.State == stateComputed || e.State == stateSettling)
}

// settleEpoch sends an epoch's unsettled parts to the wallet, in order,
// within one round bounded by epoch_duration/2. It returns when the epoch
// is settled or quarantined, or when the drain begins (the epoch stays
// settling, and the next process resumes it with the same keys).
func (r *running) settleEpoch(parent context.Context, id string) {
	ctx, cancel := context.WithDeadline(parent, r.now().Add(r.s.epochDuration/2))
	defer cancel()
	for {
		var e epoch
		err := r.db.View(func(s *store.Snapshot) (err error) {
			var ok bool
			if e, ok, err = getEpoch(s, id); err == nil && !ok {
				err = errStale
			}
			return err
		})
		if err != nil {
			r.log.Error("read an epoch to settle", "epoch", id, "error", err)
			return
		}
		if e.State != stateComputed && e.State != stateSettling {
			return
		}
		if e.Settlement.SettledParts == e.Settlement.Parts {
			now := r.now().UTC()
			_ = r.transition(ctx, id, e.State, func(e *epoch) { e.State, e.SettledAt = stateSettled, &now })
			return
		}
		if r.stopping() || parent.Err() != nil {
			return
		}
		if !r.settlePart(ctx, parent, e, e.Settlement.SettledParts) {
			return
		}
	}
}

// settlePart sends part i of e until the wallet commits it, and reports
// whether settlement may go on. The part's key and nonce are stored
// before the first attempt; a retry sends the same request, so the
// wallet replays an attempt that committed and whose answer was lost. The
// nonce changes only after a 409 nonce_mismatch, which the wallet never
// records.
func (r *running) settlePart(ctx, parent context.Context, e epoch, i int) bool {
	id := e.Epoch
	tries := 0
	// fail counts a transient failure; it reports whether to try again.
	fail := func(what string, err error) bool {
		tries++
		r.log.Warn("settlement attempt failed", "epoch", id, "part", i, "try", tries, "what", what, "error", err)
		if parent.Err() != nil {
			return false // the drain ended: the next process resumes
		}
		if tries >= r.s.retries || ctx.Err() != nil {
			r.quarantine(parent, id, reasonUnavailable, fmt.Sprintf("part %d: %s: %v", i, what, err))
			return false
		}
		r.m.retries.Inc()
		select {
		case <-ctx.Done():
			r.quarantine(parent, id, reasonUnavailable, "the settlement round ended")
			return false
		case <-r.stop:
			return false
		case <-time.After(r.jitter(r.s.backoff, r.s.backoff*5/2)):
		}
		return true
	}
	for {
		if ctx.Err() != nil {
			if parent.Err() == nil {
				r.quarantine(parent, id, reasonUnavailable, "the settlement round ended")
			}
			return false
		}
		var p part
		if err := r.db.View(func(s *store.Snapshot) (err error) { p, err = getPart(s, id, i); return err }); err != nil {
			r.log.Error("read an outbox part", "epoch", id, "part", i, "error", err)
			return false
		}
		if p.Nonce == 0 {
			n, err := r.walletNonce(ctx, e.PoolAccount)
			if err != nil {
				if fail("read the pool's nonce", err) {
					continue
				}
				return false
			}
			if err := r.setNonce(ctx, id, i, p.Key, n+1); err != nil {
				return false
			}
			continue
		}
		code, werr, err := r.postBatch(ctx, e.PoolAccount, p)
		if err == nil {
			err = r.countAttempt(parent, id)
			if err != nil {
				return false
			}
		}
		switch {
		case err != nil:
			if fail("send a batch", err) {
				continue
			}
			return false
		case code == http.StatusOK:
			return r.markSettled(parent, id, i, p.Key) == nil
		case code == http.StatusConflict && werr.Code == "nonce_mismatch" && werr.ExpectedNonce > 0:
			if err := r.setNonce(ctx, id, i, p.Key, werr.ExpectedNonce); err != nil {
				return false
			}
		case code == http.StatusUnprocessableEntity && werr.Code == "insufficient_funds":
			r.quarantine(parent, id, reasonFunds, fmt.Sprintf("part %d: %s", i, werr.Message))
			return false
		case code == http.StatusConflict, code == http.StatusTooManyRequests, code == http.StatusNotFound, code >= 500:
			if fail("send a batch", fmt.Errorf("wallet answered %d %s", code, werr.Code)) {
				continue
			}
			return false
		default:
			r.quarantine(parent, id, reasonRejected, fmt.Sprintf("part %d: wallet answered %d %s: %s", i, code, werr.Code, werr.Message))
			return false
		}
	}
}

func (r *running) setNonce(ctx context.Context, id string, i int, key string, nonce uint64) error {
	var settling *epoch // the epoch, once this write moved it to settling
	err := r.commit(ctx, func(tx *store.Tx) error {
		e, ok, err := getEpoch(tx, id)
		if err != nil || !ok || (e.State != stateComputed && e.State != stateSettling) {
			return errors.Join(err, errStale)
		}
		p, err := getPart(tx, id, i)
		if err != nil || p.Key != key || p.Settled {
			return errors.Join(err, errStale)
		}
		p.Nonce = nonce
		if err := putPart(tx, id, i, p); err != nil {
			return err
		}
		if e.State == stateComputed {
			e.State = stateSettling
			settling = &e
			return putEpoch(tx, e)
		}
		return nil
	})
	if err == nil && settling != nil {
		r.emit(*settling)
	}
	if err != nil && !errors.Is(err, errStale) {
		r.log.Error("store a part's nonce", "epoch", id, "part", i, "error", err)
	}
	return err
}

func (r *running) countAttempt(ctx context.Context, id string) error {
	return r.commit(ctx, func(tx *store.Tx) error {
		e, ok, err := getEpoch(tx, id)
		if err != nil || !ok {
			return errors.Join(err, errStale)
		}
		e.Settlement.Attempts++
		return putEpoch(tx, e)
	})
}

// markSettled stores part i as settled, and the epoch as settled with its
// last part.
func (r *running) markSettled(ctx context.Context, id string, i int, key string) error {
	last := false
	var out epoch
	now := r.now().UTC()
	err := r.commit(ctx, func(tx *store.Tx) error {
		e, ok, err := getEpoch(tx, id)
		if err != nil || !ok {
			return errors.Join(err, errStale)
		}
		p, err := getPart(tx, id, i)
		if err != nil || p.Key != key {
			return errors.Join(err, errStale)
		}
		if p.Settled {
			return nil
		}
		p.Settled = true
		if err := putPart(tx, id, i, p); err != nil {
			return err
		}
		e.Settlement.SettledParts++
		if e.Settlement.SettledParts == e.Settlement.Parts {
			e.State, e.SettledAt = stateSettled, &now
			last, out = true, e
		}
		return putEpoch(tx, e)
	})
	if err != nil {
		r.log.Error("store a settled part", "epoch", id, "part", i, "error", err)
		return err
	}
	if last {
		r.m.epochs.WithLabelValues(stateSettled).Inc()
		r.emit(out)
	}
	return nil
}

// walletError is the wallet's JSON error body.
type walletError struct {
	Code          string `json:"code"`
	Message       string `json:"message"`
	ExpectedNonce uint64 `json:"expected_nonce"`
}

// Operations of wallet calls, rewarder_wallet_timeouts_total's op label.
const (
	walletOpAccount = "account" // GET /v1/accounts/{pool}: the pool's nonce
	walletOpBatch   = "batch"   // POST /v1/batch: one settlement part
)

// call sends one request to the wallet through the host, within
// settle.timeout, and returns its status and body. A call past its
// deadline counts in rewarder_wallet_timeouts_total{op}.
func (r *running) call(ctx context.Context, op, method, path string, h http.Header, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := r.host.Call(ctx, r.s.wallet, req)
	if err == nil {
		defer resp.Body.Close()
		body, err = io.ReadAll(io.LimitReader(resp.Body, maxWalletBodyBytes))
	}
	if err != nil {
		// The host carries the call's deadline to its side, which may
		// answer DeadlineExceeded (a gRPC status, not ctx's error) a
		// moment before ctx's own timer fires.
		if d, _ := ctx.Deadline(); errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || time.Until(d) < deadlineSlack {
			r.m.walletTimeouts.WithLabelValues(op).Inc()
		}
		return 0, nil, fmt.Errorf("call %s %s: %w", r.s.wallet, path, err)
	}
	return resp.StatusCode, body, nil
}

// walletNonce returns the account's nonce.
func (r *running) walletNonce(ctx context.Context, account string) (uint64, error) {
	code, body, err := r.call(ctx, walletOpAccount, http.MethodGet, "/v1/accounts/"+url.PathEscape(account), nil, nil)
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("wallet answered %d: %.200s", code, body)
	}
	return decodeNonce(body)
}

// decodeNonce reads the nonce of a wallet account answer.
func decodeNonce(body []byte) (uint64, error) {
	var a struct {
		Nonce *uint64 `json:"nonce"`
	}
	if err := json.Unmarshal(body, &a); err != nil || a.Nonce == nil {
		return 0, fmt.Errorf("decode the pool account: %v: %.200q", err, body)
	}
	return *a.Nonce, nil
}

// decodeWalletError reads the wallet's JSON error body; a body that is
// not one leaves the code empty.
func decodeWalletError(body []byte) (walletError, error) {
	var eb struct {
		Error walletError `json:"error"`
	}
	err := json.Unmarshal(body, &eb)
	return eb.Error, err
}

// postBatch sends part p as one wallet batch with its key and nonce.
func (r *running) postBatch(ctx context.Context, from string, p part) (int, walletError, error) {
	body, _ := json.Marshal(struct {
		From      string `json:"from"`
		Nonce     uint64 `json:"nonce"`
		Transfers []Leg  `json:"transfers"`
	}{from, p.Nonce, p.Legs})
	h := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {p.Key}}
	code, resp, err := r.call(ctx, walletOpBatch, http.MethodPost, "/v1/batch", h, body)
	var we walletError
	if err == nil && code != http.StatusOK {
		we, _ = decodeWalletError(resp)
	}
	return code, we, err
}
