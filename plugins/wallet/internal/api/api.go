// Package api is the wallet's HTTP interface: it decodes and validates
// requests, runs the Idempotency-Key protocol, submits ledger operations to
// the committer, answers reads from the view, streams committed receipts
// as server-sent events, and maps every error to an HTTP status in one
// place (classify).
//
// The routes are declared once, by Register, on the plugin's sdk.Mux; they
// serve through whichever API is current. The lifecycle of an API is New →
// requests from any goroutine → Close, which refuses new requests and
// waits for those in flight so that the ledger can be closed under nobody.
//
// Idempotency: every POST carries an Idempotency-Key, read and checked by
// sdk/idem, whose protocol errors classify maps. Its first request claims
// the key in memory (idem.Claims) while it is in progress (a second
// request with it gets 409, or 422 with a different body); the outcome is
// recorded by the ledger in the committing group, so a replay, also after
// a restart, is answered with the recorded bytes and Idempotent-Replayed:
// true (idem.Replay): by the committer, which finds the record, or, when
// the committer refuses the operation (429, 503), from a ledger lookup.
// Validation failures and nonce mismatches are not recorded.
//
// The package must not write the ledger itself, start goroutines that
// outlive a request, or hold a lock across a wait.
package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/plugins/wallet/internal/bus"
	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/view"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/idem"
)

// Register declares the API's routes on mux, relative to the mount point.
// Each request is served by the API current returns; while it returns nil
// (the plugin is not configured yet) the answer is 503 not_configured, and
// once that API's Close has begun, 503 draining.
func Register(mux *sdk.Mux, current func() *API) {
	post := func(kind ledger.Kind, decode decoder) func(*API, http.ResponseWriter, *http.Request) {
		return func(a *API, w http.ResponseWriter, r *http.Request) { a.post(w, r, kind, decode) }
	}
	for _, rt := range []struct {
		pattern string
		serve   func(*API, http.ResponseWriter, *http.Request)
		opts    []sdk.RouteOption
	}{
		{"POST /v1/issue", post(ledger.KindIssue, decodeIssue), nil},
		{"POST /v1/transfer", post(ledger.KindTransfer, decodeTransfer), nil},
		{"POST /v1/burn", post(ledger.KindBurn, decodeBurn), nil},
		{"POST /v1/batch", post(ledger.KindBatch, decodeBatch), nil},
		{"GET /v1/accounts/{id}", (*API).account, nil},
		{"GET /v1/supply", (*API).supply, nil},
		{"GET /v1/receipts/{tx_id}", (*API).receipt, nil},
		{"GET /v1/events", (*API).stream, []sdk.RouteOption{sdk.Streaming()}},
	} {
		serve := rt.serve
		mux.HandleFunc(rt.pattern, func(w http.ResponseWriter, r *http.Request) {
			a := current()
			if a == nil {
				sdk.WriteError(w, http.StatusServiceUnavailable, "not_configured", "the wallet is not configured yet")
				return
			}
			if !a.gate.enter() {
				a.writeError(w, errDraining)
				return
			}
			defer a.gate.leave()
			serve(a, w, r)
		}, rt.opts...)
	}
}

// Options configure New; all but Logger and Registerer are required.
type Options struct {
	Ledger     *ledger.Ledger
	Committer  *durable.Committer[ledger.Op, ledger.Result]
	View       *view.View
	Events     *bus.Bus[*ledger.Receipt]
	Logger     hclog.Logger
	Registerer prometheus.Registerer
	// Drain is closed when the plugin begins to drain: event streams end
	// and reads stop waiting for a seq.
	Drain <-chan struct{}
	// KeepAlive is the interval of comment lines on idle event streams;
	// default 15s.
	KeepAlive time.Duration
	// Backfill is the most receipts an event stream resumed with
	// Last-Event-ID replays from the ledger; default 1024.
	Backfill int
}

// API serves the wallet's routes. Create one with New and call Close.
type API struct {
	ledger    *ledger.Ledger
	committer *durable.Committer[ledger.Op, ledger.Result]
	view      *view.View
	events    *bus.Bus[*ledger.Receipt]
	logger    hclog.Logger
	drain     <-chan struct{}
	keepAlive time.Duration
	backfill  int

	claims idem.Claims
	gate   gate
	busy   *prometheus.CounterVec
}

// New returns the API.
func New(opts Options) (*API, error) {
	a := &API{
		ledger:    opts.Ledger,
		committer: opts.Committer,
		view:      opts.View,
		events:    opts.Events,
		logger:    opts.Logger,
		drain:     opts.Drain,
		keepAlive: opts.KeepAlive,
		backfill:  opts.Backfill,
		gate:      gate{idle: make(chan struct{})},
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "busy_rejections_total",
			Help: "POSTs refused with 429 because the commit queue was full, by endpoint.",
		}, []string{"endpoint"}),
	}
	if a.logger == nil {
		a.logger = hclog.NewNullLogger()
	}
	if a.keepAlive <= 0 {
		a.keepAlive = 15 * time.Second
	}
	if a.backfill <= 0 {
		a.backfill = 1024
	}
	for _, k := range ledger.Kinds {
		a.busy.WithLabelValues(k.String())
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(a.busy); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return a, nil
}

// Close refuses new requests and waits until those in flight have
// returned or ctx ends. POSTs in flight end when the committer answers
// them, so close the committer first; reads and event streams end when
// Options.Drain is closed.
func (a *API) Close(ctx context.Context) error {
	if n := a.gate.close(ctx); n > 0 {
		return fmt.Errorf("close api: %d requests still in flight: %w", n, ctx.Err())
	}
	return nil
}

// post serves one POST endpoint.
func (a *API) post(w http.ResponseWriter, r *http.Request, kind ledger.Kind, decode decoder) {
	if err := checkContentType(r.Header); err != nil {
		a.writeError(w, err)
		return
	}
	key, err := idem.Key(r.Header)
	if err != nil {
		a.writeError(w, err)
		return
	}
	body, err := readBody(r.Body)
	if err != nil {
		a.writeError(w, err)
		return
	}
	req, err := decode(body)
	if err != nil {
		a.writeError(w, err)
		return
	}
	a.submit(w, r, kind, key, fingerprint(kind, req), req.op())
}

// outcome is what the committer answered for one operation.
type outcome struct {
	res ledger.Result
	err error
}

// submit runs the idempotency protocol around one operation.
func (a *API) submit(w http.ResponseWriter, r *http.Request, kind ledger.Kind, key string, fp idem.Fingerprint, op ledger.Op) {
	if err := a.claims.Claim(key, fp); err != nil {
		// The holder may be a replay of a finished request, queued like
		// any operation: then the record is the answer, not 409.
		if errors.Is(err, idem.ErrInUse) && a.replayStored(w, key, fp) {
			return
		}
		a.writeError(w, err)
		return
	}
	// Claimed: no other request with this key runs until release. A
	// record may exist from a finished request: the committer finds it
	// and answers Replayed without applying anything, so a new key, by
	// far the common case, costs no lookup of its own.
	op.Idem = &ledger.Idem{Key: key, Fingerprint: fp}
	done := make(chan outcome, 1)
	err := a.committer.Submit(op, func(res ledger.Result, err error) {
		// The claim lasts until the outcome is known, even if this
		// handler has given up: a retry must not apply the op twice.
		// A commit stalled on the disk may still apply it: then the
		// claim lasts until Settled, and a retry meanwhile is told the
		// key is in use, never that nothing was applied.
		if !errors.Is(err, durable.ErrStalled) {
			a.claims.Release(key)
		}
		done <- outcome{res, err}
	})
	if err != nil {
		// Refused (full queue, breaker open, draining): a recorded
		// outcome is still the answer.
		replayed := a.replayStored(w, key, fp)
		a.claims.Release(key)
		if replayed {
			return
		}
		if errors.Is(err, durable.ErrBusy) {
			a.busy.WithLabelValues(kind.String()).Inc()
		}
		// Admitted just before the drain, which closed the committer
		// before this handler submitted: nothing was applied, so the
		// host may send the request to the process that replaces this
		// one.
		if errors.Is(err, durable.ErrDraining) && sdk.Refuse(w) {
			return
		}
		a.writeError(w, err)
		return
	}
	select {
	case o := <-done:
		a.answer(w, o, key, fp)
	case <-r.Context().Done():
		a.writeError(w, fmt.Errorf("%w: %w", errUnknown, r.Context().Err()))
	}
}

// answer writes the committer's outcome of an operation.
func (a *API) answer(w http.ResponseWriter, o outcome, key string, fp idem.Fingerprint) {
	switch {
	case o.err != nil:
		// The group failed, so nothing of it was recorded; but the key
		// may have a record from an earlier request, and then that is
		// the answer, not the failure.
		if !a.replayStored(w, key, fp) {
			a.writeError(w, o.err)
		}
	case o.res.Replayed:
		// The key has a record from an earlier request; the ledger
		// applied nothing.
		a.replay(w, *o.res.Record, fp)
	case o.res.Record != nil:
		writeRaw(w, o.res.Record.Status, o.res.Record.Body)
	case o.res.Err != nil:
		a.writeError(w, o.res.Err) // not recorded: a nonce mismatch
	default:
		// Every op carries a key, so a commit always has a record.
		status, body := Render(o.res)
		writeRaw(w, status, body)
	}
}

// replayStored answers the request with the record stored under key, if
// the ledger has one, and reports whether it did. It is for the paths
// where the committer cannot say (the operation was refused or failed,
// or another request holds the key): a lookup that fails answers nothing,
// and the caller's own error stands.
func (a *API) replayStored(w http.ResponseWriter, key string, fp idem.Fingerprint) bool {
	rec, ok, err := a.ledger.Idempotency(key)
	if err != nil || !ok {
		return false
	}
	a.replay(w, rec, fp)
	return true
}

// replay answers a request whose key has a record: its recorded answer,
// or 422 if the record is another request's.
func (a *API) replay(w http.ResponseWriter, rec ledger.Record, fp idem.Fingerprint) {
	stored := idem.Record{Fingerprint: rec.Fingerprint, Status: rec.Status, ContentType: "application/json", Body: rec.Body}
	if err := idem.Replay(w, stored, fp); errors.Is(err, idem.ErrReused) {
		a.writeError(w, err)
	}
}

// accountJSON is the answer of GET /v1/accounts/{id}.
type accountJSON struct {
	Account string    `json:"account"`
	Balance uint64    `json:"balance"`
	Nonce   uint64    `json:"nonce"`
	Seq     uint64    `json:"seq"`
	AsOf    time.Time `json:"as_of"`
}

func (a *API) account(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := checkAccountID(id); err != nil {
		a.writeError(w, invalidf("%v", err))
		return
	}
	q, err := parseReadQuery(r.URL.RawQuery)
	if err != nil {
		a.writeError(w, err)
		return
	}
	s, err := a.view.Account(r.Context(), id, q.minSeq, waitWithin(r.Context(), q.wait))
	if err != nil {
		a.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, accountJSON{Account: s.ID, Balance: s.Balance, Nonce: s.Nonce, Seq: s.Seq, AsOf: s.AsOf.UTC()})
}

// supplyJSON is the answer of GET /v1/supply.
type supplyJSON struct {
	Issued uint64    `json:"issued"`
	Burned uint64    `json:"burned"`
	Supply uint64    `json:"supply"`
	Seq    uint64    `json:"seq"`
	AsOf   time.Time `json:"as_of"`
}

func (a *API) supply(w http.ResponseWriter, r *http.Request) {
	q, err := parseReadQuery(r.URL.RawQuery)
	if err != nil {
		a.writeError(w, err)
		return
	}
	s, err := a.view.Supply(r.Context(), q.minSeq, waitWithin(r.Context(), q.wait))
	if err != nil {
		a.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, supplyJSON{Issued: s.Issued, Burned: s.Burned, Supply: s.Issued - s.Burned, Seq: s.Seq, AsOf: s.AsOf.UTC()})
}

func (a *API) receipt(w http.ResponseWriter, r *http.Request) {
	if err := checkNoQuery(r.URL.RawQuery); err != nil {
		a.writeError(w, err)
		return
	}
	rc, err := a.ledger.Receipt(r.PathValue("tx_id"))
	if err != nil {
		a.writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, rc)
}

// deadlineMargin is kept between a read's wait and its request deadline,
// so that the snapshot is answered before the host gives up with 504.
const deadlineMargin = 100 * time.Millisecond

// waitWithin shortens wait to end deadlineMargin before ctx's deadline.
func waitWithin(ctx context.Context, wait time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)-deadlineMargin)
	}
	return max(wait, 0)
}

// Settled releases the keys of operations whose commit stalled on the
// disk, once the committer knows their outcome (durable.Options.Settled):
// a retry now finds the recorded outcome, or commits afresh. There is at
// most one claim per operation queued or committing, so the queue bounds
// the claims.
func (a *API) Settled(ops []ledger.Op) {
	for _, op := range ops {
		if op.Idem != nil {
			a.claims.Release(op.Idem.Key)
		}
	}
}

// gate counts requests in flight and refuses new ones once closed.
type gate struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed when closed and n reaches 0
}

func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.n++
	return true
}

func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.closed && g.n == 0 {
		close(g.idle)
	}
}

// close refuses new requests, waits for the rest or ctx, and returns how
// many are still in flight.
func (g *gate) close(ctx context.Context) int {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		if g.n == 0 {
			close(g.idle)
		}
	}
	g.mu.Unlock()
	select {
	case <-g.idle:
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}
