package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/bus"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/store"
)

// Request limits the config does not set.
const (
	maxBatch     = 64       // entries per batch call
	maxBodyBytes = 16 << 20 // a whole batch; each artifact is also capped at maxArtifact
	maxRange     = 1000     // entries per GET /v1/entries
	defaultRange = 100
)

var (
	// errBadRequest marks a malformed request: 400.
	errBadRequest = errors.New("bad request")
	// errTooLarge marks an artifact over maxArtifact: 413.
	errTooLarge = errors.New("artifact too large")
	// errForbidden marks an unknown approver or a bad signature: 403.
	errForbidden = errors.New("forbidden")
	// errReadOnly refuses a proposal to a registry that declares no
	// approver, where nothing can commit: 403.
	errReadOnly = errors.New("the registry declares no approver: nothing can commit, and it serves its log read-only")
	// errNotFound marks what does not exist (yet): 404.
	errNotFound = errors.New("not found")
	// errQueueFull marks a full proposals or approvals queue: 429.
	errQueueFull = errors.New("queue full")
	// errCommitTimeout marks a commit past the caller's deadline: 503.
	errCommitTimeout = errors.New("commit outlasted its deadline")
	// errWriteUnready marks a write refused after the deep verifier
	// found a mismatch: 503.
	errWriteUnready = errors.New("writes refused")
)

func badRequest(format string, args ...any) error {
	return &requestError{fmt.Sprintf(format, args...)}
}

// requestError is a client's mistake: it is errBadRequest, and its text
// is the message alone, without errBadRequest's.
type requestError struct{ msg string }

func (e *requestError) Error() string        { return e.msg }
func (e *requestError) Is(target error) bool { return target == errBadRequest }

// decodeJSON decodes exactly one JSON object into v, refusing unknown
// fields and anything after the object.
func decodeJSON(body []byte, v any) error {
	if err := sdk.DecodeJSON(bytes.NewReader(body), v); err != nil {
		return badRequest("decode body: %v", err)
	}
	return nil
}

// proposalReq is POST /v1/proposals's body and an element of a batch.
type proposalReq struct {
	Artifact json.RawMessage `json:"artifact"`
}

// proposalOp checks a proposal and makes its op, with a fresh id.
func (p proposalReq) op() (op, error) {
	if len(p.Artifact) == 0 {
		return op{}, badRequest("artifact is required")
	}
	if len(p.Artifact) > 4*maxArtifact { // spaces and escapes; the canonical form is checked below
		return op{}, fmt.Errorf("artifact over %d bytes: %w", maxArtifact, errTooLarge)
	}
	canon, err := canonicalArtifact(p.Artifact)
	if err != nil {
		return op{}, badRequest("%v", err)
	}
	if len(canon) > maxArtifact {
		return op{}, fmt.Errorf("artifact over %d bytes: %w", maxArtifact, errTooLarge)
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	return op{kind: opPropose, id: hex.EncodeToString(id[:]), digest: digestOf(canon), artifact: canon}, nil
}

// decodeProposal decodes POST /v1/proposals's body.
func decodeProposal(body []byte) (op, error) {
	var p proposalReq
	if err := decodeJSON(body, &p); err != nil {
		return op{}, err
	}
	return p.op()
}

// decodeProposalBatch decodes POST /v1/proposals/batch's body
// {"proposals":[...]}: one op or error per element.
func decodeProposalBatch(body []byte) ([]op, []error, error) {
	var b struct {
		Proposals []proposalReq `json:"proposals"`
	}
	if err := decodeJSON(body, &b); err != nil {
		return nil, nil, err
	}
	if len(b.Proposals) == 0 || len(b.Proposals) > maxBatch {
		return nil, nil, badRequest("a batch holds 1 to %d proposals, got %d", maxBatch, len(b.Proposals))
	}
	ops, errs := make([]op, len(b.Proposals)), make([]error, len(b.Proposals))
	for i, p := range b.Proposals {
		ops[i], errs[i] = p.op()
	}
	return ops, errs, nil
}

// approvalReq is POST /v1/proposals/{id}/approvals's body and, with its
// proposal id, an element of POST /v1/approvals/batch.
type approvalReq struct {
	ProposalID string `json:"proposal_id,omitempty"`
	Approver   string `json:"approver"`
	Signature  string `json:"signature"`
}

var idRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// check checks an approval's form (not yet its signature) and makes its
// op.
func (a approvalReq) op(id string) (op, []byte, error) {
	if !idRE.MatchString(id) {
		return op{}, nil, fmt.Errorf("no proposal %q: %w", id, errNotFound)
	}
	if a.Approver == "" {
		return op{}, nil, badRequest("approver is required")
	}
	sig, err := base64.StdEncoding.DecodeString(a.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return op{}, nil, fmt.Errorf("signature must be standard base64 of %d bytes: %w", ed25519.SignatureSize, errForbidden)
	}
	return op{kind: opApprove, id: id, approval: approval{Approver: a.Approver, Signature: a.Signature}}, sig, nil
}

type signedOp struct {
	o   op
	sig []byte
}

// decodeApproval decodes POST /v1/proposals/{id}/approvals's body.
func decodeApproval(id string, body []byte) (signedOp, error) {
	var a approvalReq
	if err := decodeJSON(body, &a); err != nil {
		return signedOp{}, err
	}
	if a.ProposalID != "" && a.ProposalID != id {
		return signedOp{}, badRequest("proposal_id %q is not the path's %q", a.ProposalID, id)
	}
	o, sig, err := a.op(id)
	return signedOp{o, sig}, err
}

// decodeApprovalBatch decodes POST /v1/approvals/batch's body
// {"approvals":[...]}: one op or error per element.
func decodeApprovalBatch(body []byte) ([]signedOp, []error, error) {
	var b struct {
		Approvals []approvalReq `json:"approvals"`
	}
	if err := decodeJSON(body, &b); err != nil {
		return nil, nil, err
	}
	if len(b.Approvals) == 0 || len(b.Approvals) > maxBatch {
		return nil, nil, badRequest("a batch holds 1 to %d approvals, got %d", maxBatch, len(b.Approvals))
	}
	ops, errs := make([]signedOp, len(b.Approvals)), make([]error, len(b.Approvals))
	for i, a := range b.Approvals {
		if a.ProposalID == "" { // a null element too
			errs[i] = badRequest("approvals[%d]: proposal_id is required", i)
			continue
		}
		o, sig, err := a.op(a.ProposalID)
		ops[i], errs[i] = signedOp{o, sig}, err
	}
	return ops, errs, nil
}

// parseEventID parses a stream's Last-Event-ID: the last version the
// consumer has, a decimal number; empty is 0.
func parseEventID(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	if len(s) > 20 {
		return 0, badRequest("Last-Event-ID too long")
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, badRequest("Last-Event-ID must be a version")
	}
	return v, nil
}

func (rg *registry) routes(mux *sdk.Mux) {
	mux.HandleFunc("POST /v1/proposals", rg.handle("proposals", rg.propose))
	mux.HandleFunc("POST /v1/proposals/batch", rg.handle("proposals_batch", rg.proposeBatch))
	mux.HandleFunc("POST /v1/proposals/{id}/approvals", rg.handle("approvals", rg.approve))
	mux.HandleFunc("POST /v1/approvals/batch", rg.handle("approvals_batch", rg.approveBatch))
	mux.HandleFunc("GET /v1/head", rg.handle("head", rg.getHead))
	mux.HandleFunc("GET /v1/entries/{version}", rg.handle("entry", rg.getEntry))
	mux.HandleFunc("GET /v1/entries", rg.handle("entries", rg.getEntries))
	mux.HandleFunc("GET /v1/checkpoint", rg.handle("checkpoint", rg.getCheckpoint))
	mux.HandleFunc("POST /v1/checkpoint", rg.handle("checkpoint_sign", rg.signCheckpoint), sdk.NoBody())
	mux.HandleFunc("GET /v1/key", rg.handle("key", rg.getKey))
	mux.HandleFunc("GET /v1/proof/inclusion", rg.handle("inclusion", rg.inclusion))
	mux.HandleFunc("GET /v1/proof/consistency", rg.handle("consistency", rg.consistency))
	mux.HandleFunc("GET /v1/stream", rg.handle("stream", rg.stream), sdk.Streaming())
}

// handler is a route's handler once the registry runs; endpoint names it
// in metrics.
type handler func(w http.ResponseWriter, r *http.Request, run *running, endpoint string, body []byte)

// handle reads the body (at most maxBodyBytes).
func (rg *registry) handle(endpoint string, h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		run := rg.running.Load()
		if run == nil {
			sdk.WriteError(w, http.StatusServiceUnavailable, "unavailable", "not configured")
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
		switch {
		case err != nil:
			sdk.WriteError(w, http.StatusBadRequest, "bad_request", "read body: "+err.Error())
			return
		case len(body) > maxBodyBytes:
			sdk.WriteError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body over %d bytes", maxBodyBytes))
			return
		}
		h(w, r, run, endpoint, body)
	}
}

// statusOf maps an error to its HTTP status and error code: the one place
// the registry's errors become statuses.
func statusOf(err error) (int, string) {
	var ce *store.CorruptError
	switch {
	case errors.Is(err, errBadRequest):
		return http.StatusBadRequest, "bad_request"
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge, "too_large"
	case errors.Is(err, errForbidden):
		return http.StatusForbidden, "forbidden"
	case errors.Is(err, errReadOnly):
		return http.StatusForbidden, "read_only"
	case errors.Is(err, errNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, errQueueFull), errors.Is(err, durable.ErrBusy):
		return http.StatusTooManyRequests, "busy"
	case errors.Is(err, errCommitTimeout):
		return http.StatusServiceUnavailable, "commit_timeout"
	case errors.Is(err, errWriteUnready):
		return http.StatusServiceUnavailable, "write_unready"
	case errors.Is(err, durable.ErrDraining):
		return http.StatusServiceUnavailable, "draining"
	case errors.As(err, &ce), errors.Is(err, store.ErrCorrupt):
		return http.StatusInternalServerError, "storage_corrupt"
	case errors.Is(err, durable.ErrUnavailable), errors.Is(err, durable.ErrStalled), errors.Is(err, durable.ErrFailed),
		errors.Is(err, durable.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, "unavailable"
	}
	return http.StatusInternalServerError, "internal"
}

// fail answers err; a 429 or 503 carries Retry-After and a 429 counts in
// busy_rejections_total{endpoint}.
func (run *running) fail(w http.ResponseWriter, endpoint string, err error) {
	status, code := statusOf(err)
	switch status {
	case http.StatusTooManyRequests:
		run.m.busy.WithLabelValues(endpoint).Inc()
		fallthrough
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(run.c.RetryAfter().Seconds()))))
	}
	sdk.WriteError(w, status, code, err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := marshal(v)
	if err != nil {
		sdk.WriteError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// pending is an op submitted to the committer; wait returns its result.
type pending struct {
	done chan struct{}
	res  result
	err  error
}

// submit hands o to the committer through the bounded intake n of
// capacity limit: past it, errQueueFull.
func (run *running) submit(o op, queue string, n *atomic.Int64, limit int) *pending {
	p := &pending{done: make(chan struct{})}
	if msg := run.corrupt.Load(); msg != nil {
		p.err = fmt.Errorf("%w: the deep verifier found %s", errWriteUnready, *msg)
		close(p.done)
		return p
	}
	if n.Add(1) > int64(limit) {
		n.Add(-1)
		if c := run.m.dropped[queue]; c != nil {
			c.Inc()
		}
		p.err = fmt.Errorf("%w: %d operations waiting", errQueueFull, limit)
		close(p.done)
		return p
	}
	if err := run.c.Submit(o, func(r result, err error) {
		n.Add(-1)
		p.res, p.err = r, err
		close(p.done)
	}); err != nil {
		n.Add(-1)
		p.err = err
		close(p.done)
	}
	return p
}

// wait waits for p until ctx ends; a commit past ctx's deadline counts in
// io_timeouts_total{op="commit"}.
func (run *running) wait(ctx context.Context, p *pending) (result, error) {
	select {
	case <-p.done:
		return p.res, p.err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			run.m.timeouts.Inc()
			return result{}, fmt.Errorf("%w: %w", errCommitTimeout, ctx.Err())
		}
		return result{}, ctx.Err()
	}
}

func (run *running) commitCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), run.s.commitDeadline)
}

// answer is one result's JSON: a proposal's, an approval's, or a refusal.
type answer struct {
	Status     int       `json:"status,omitempty"` // in batches
	ProposalID string    `json:"proposal_id,omitempty"`
	Digest     string    `json:"digest,omitempty"`
	Committed  *bool     `json:"committed,omitempty"`
	Version    uint64    `json:"version,omitempty"`
	Hash       string    `json:"hash,omitempty"`
	Error      *sdkError `json:"error,omitempty"`
}

type sdkError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func answerOf(r result, approval bool) answer {
	if r.refusal {
		return answer{Status: r.status, Error: &sdkError{r.code, r.msg}}
	}
	a := answer{Status: r.status, ProposalID: r.id, Digest: r.digest}
	if approval {
		c := r.status == http.StatusOK
		a.Committed = &c
		if c {
			a.Version, a.Hash = r.head.Version, hex.EncodeToString(r.head.Hash[:])
		}
	}
	return a
}

func errAnswer(err error) answer {
	status, code := statusOf(err)
	return answer{Status: status, Error: &sdkError{code, err.Error()}}
}

func (run *running) writeResult(w http.ResponseWriter, endpoint string, r result, err error, approval bool) {
	switch {
	case err != nil:
		run.fail(w, endpoint, err)
	case r.refusal:
		sdk.WriteError(w, r.status, r.code, r.msg)
	default:
		a := answerOf(r, approval)
		a.Status = 0
		writeJSON(w, r.status, a)
	}
}

func (rg *registry) propose(w http.ResponseWriter, r *http.Request, run *running, endpoint string, body []byte) {
	o, err := decodeProposal(body)
	if err == nil && len(run.s.approvers) == 0 {
		err = errReadOnly
	}
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	ctx, cancel := run.commitCtx(r)
	defer cancel()
	res, err := run.wait(ctx, run.submit(o, "proposals", &run.proposals, run.s.proposalsQueue))
	run.writeResult(w, endpoint, res, err, false)
}

func (rg *registry) proposeBatch(w http.ResponseWriter, r *http.Request, run *running, endpoint string, body []byte) {
	ops, errs, err := decodeProposalBatch(body)
	if err == nil && len(run.s.approvers) == 0 {
		err = errReadOnly
	}
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	ps := make([]*pending, len(ops))
	for i, o := range ops {
		if errs[i] == nil {
			ps[i] = run.submit(o, "proposals", &run.proposals, run.s.proposalsQueue)
		}
	}
	run.writeBatch(w, r, endpoint, ps, errs, false)
}

// writeBatch waits for each op of a batch and answers one result each.
func (run *running) writeBatch(w http.ResponseWriter, r *http.Request, endpoint string, ps []*pending, errs []error, approval bool) {
	ctx, cancel := run.commitCtx(r)
	defer cancel()
	out := make([]answer, len(ps))
	for i, p := range ps {
		if errs[i] != nil {
			out[i] = errAnswer(errs[i])
			continue
		}
		res, err := run.wait(ctx, p)
		if err != nil {
			if s, _ := statusOf(err); s == http.StatusTooManyRequests {
				run.m.busy.WithLabelValues(endpoint).Inc()
			}
			out[i] = errAnswer(err)
			continue
		}
		out[i] = answerOf(res, approval)
	}
	writeJSON(w, http.StatusOK, struct {
		Results []answer `json:"results"`
	}{out})
}

// authorize checks an approval's approver and its signature over the
// proposal's digest, which it reads from the store.
func (run *running) authorize(s signedOp) error {
	pub, ok := run.s.approvers[s.o.approval.Approver]
	if !ok {
		return fmt.Errorf("unknown approver %q: %w", s.o.approval.Approver, errForbidden)
	}
	var digest []byte
	err := run.db.View(func(sn *store.Snapshot) error {
		b := sn.Get(bucketProposals, []byte(s.o.id))
		if b == nil {
			return fmt.Errorf("no proposal %q: %w", s.o.id, errNotFound)
		}
		var p proposal
		if err := json.Unmarshal(b, &p); err != nil {
			return fmt.Errorf("proposal %q: %v: %w", s.o.id, err, store.ErrCorrupt)
		}
		var err error
		digest, err = hex.DecodeString(p.Digest)
		return err
	})
	if err != nil {
		return err
	}
	if !ed25519.Verify(pub, digest, s.sig) {
		return fmt.Errorf("signature of %q does not verify over the digest: %w", s.o.approval.Approver, errForbidden)
	}
	return nil
}

func (rg *registry) approve(w http.ResponseWriter, r *http.Request, run *running, endpoint string, body []byte) {
	s, err := decodeApproval(r.PathValue("id"), body)
	if err == nil {
		err = run.authorize(s)
	}
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	ctx, cancel := run.commitCtx(r)
	defer cancel()
	res, err := run.wait(ctx, run.submit(s.o, "approvals", &run.approvals, run.s.approvalsQueue))
	run.writeResult(w, endpoint, res, err, true)
}

func (rg *registry) approveBatch(w http.ResponseWriter, r *http.Request, run *running, endpoint string, body []byte) {
	ss, errs, err := decodeApprovalBatch(body)
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	ps := make([]*pending, len(ss))
	for i, s := range ss {
		if errs[i] == nil {
			errs[i] = run.authorize(s)
		}
		if errs[i] == nil {
			ps[i] = run.submit(s.o, "approvals", &run.approvals, run.s.approvalsQueue)
		}
	}
	run.writeBatch(w, r, endpoint, ps, errs, true)
}

type headJSON struct {
	Version uint64 `json:"version"`
	Hash    string `json:"hash"`
}

func (rg *registry) getHead(w http.ResponseWriter, _ *http.Request, run *running, _ string, _ []byte) {
	h := run.head.Load()
	writeJSON(w, http.StatusOK, headJSON{h.Version, hex.EncodeToString(h.Hash[:])})
}

// gone answers 410 for a pruned version, with the checkpoint that covers
// it.
func (run *running) gone(w http.ResponseWriter, v uint64) {
	var extra struct {
		Checkpoint string `json:"checkpoint,omitempty"`
	}
	if ck := run.ckpt.Load(); ck != nil {
		extra.Checkpoint = string(ck.note)
	}
	sdk.WriteErrorBody(w, http.StatusGone, sdk.ErrorBody("pruned",
		fmt.Sprintf("entry %d was pruned; the checkpoint covers it and proofs still verify", v), extra))
}

func parseVersion(s, name string) (uint64, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == 0 {
		return 0, badRequest("%s must be a version from 1", name)
	}
	return v, nil
}

func (rg *registry) getEntry(w http.ResponseWriter, r *http.Request, run *running, endpoint string, _ []byte) {
	v, err := parseVersion(r.PathValue("version"), "version")
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	rg.writeEntries(w, run, endpoint, v, 1, false)
}

// query returns r's query parameters, refusing any not in names and any
// given twice: a misspelt or doubled parameter is not taken for its
// default, nor one copy of it for the other.
func query(r *http.Request, names ...string) (url.Values, error) {
	q := r.URL.Query()
	for k, vs := range q {
		switch {
		case !slices.Contains(names, k):
			return nil, badRequest("unknown query parameter %q: want %s", k, strings.Join(names, ", "))
		case len(vs) != 1:
			return nil, badRequest("query parameter %q: give it once", k)
		}
	}
	return q, nil
}

func (rg *registry) getEntries(w http.ResponseWriter, r *http.Request, run *running, endpoint string, _ []byte) {
	q, err := query(r, "from", "limit")
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	from, limit := uint64(1), uint64(defaultRange)
	if s := q.Get("from"); s != "" {
		from, err = parseVersion(s, "from")
	}
	if s := q.Get("limit"); s != "" && err == nil {
		limit, err = strconv.ParseUint(s, 10, 64)
		if err != nil || limit == 0 || limit > maxRange {
			err = badRequest("limit must be from 1 to %d", maxRange)
		}
	}
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	rg.writeEntries(w, run, endpoint, from, limit, true)
}

// writeEntries answers up to limit entries from version from, as a list
// or (one) as an object.
func (rg *registry) writeEntries(w http.ResponseWriter, run *running, endpoint string, from, limit uint64, list bool) {
	h := run.head.Load()
	if !list && from > h.Version {
		run.fail(w, endpoint, fmt.Errorf("no entry %d: head is %d: %w", from, h.Version, errNotFound))
		return
	}
	if from < run.pruned.Load() {
		run.gone(w, from)
		return
	}
	var out []json.RawMessage
	err := run.db.View(func(sn *store.Snapshot) error {
		for v := from; v <= h.Version && v < from+limit; v++ {
			b := sn.Get(bucketEntries, be64(v))
			if b == nil {
				return fmt.Errorf("entry %d: %w", v, errPrunedNow)
			}
			out = append(out, json.RawMessage(bytes.Clone(b)))
		}
		return nil
	})
	switch {
	case errors.Is(err, errPrunedNow):
		run.gone(w, from)
	case err != nil:
		run.fail(w, endpoint, err)
	case list:
		if out == nil {
			out = []json.RawMessage{}
		}
		writeJSON(w, http.StatusOK, struct {
			Entries []json.RawMessage `json:"entries"`
		}{out})
	default:
		writeJSON(w, http.StatusOK, out[0])
	}
}

// errPrunedNow: an entry went between the pruned mark's read and the
// snapshot.
var errPrunedNow = errors.New("pruned")

func (rg *registry) getCheckpoint(w http.ResponseWriter, _ *http.Request, run *running, endpoint string, _ []byte) {
	ck := run.ckpt.Load()
	if ck == nil {
		run.fail(w, endpoint, fmt.Errorf("no checkpoint signed yet: %w", errNotFound))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write(ck.note)
}

// signCheckpoint signs a checkpoint of HEAD now (or returns the one of
// that size).
func (rg *registry) signCheckpoint(w http.ResponseWriter, r *http.Request, run *running, endpoint string, _ []byte) {
	ctx, cancel := run.commitCtx(r)
	defer cancel()
	var n atomic.Int64
	res, err := run.wait(ctx, run.submit(op{kind: opCheckpoint}, "", &n, 1))
	switch {
	case err != nil:
		run.fail(w, endpoint, err)
	case res.ckpt == nil:
		run.fail(w, endpoint, fmt.Errorf("the log is empty: %w", errNotFound))
	default:
		run.retainBelow(res.ckptN)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write(res.ckpt)
	}
}

func (rg *registry) getKey(w http.ResponseWriter, _ *http.Request, run *running, _ string, _ []byte) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, run.vkey)
}

// proofJSON is a proof: hashes in standard base64, and the root of the
// tree of size Size as the registry computes it (check it against a
// checkpoint).
type proofJSON struct {
	Index *uint64  `json:"index,omitempty"` // inclusion: version-1
	Old   uint64   `json:"old,omitempty"`
	Size  uint64   `json:"size"`
	Root  string   `json:"root"`
	Proof []string `json:"proof"`
}

func encodeHashes(hs []tlog.Hash) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = base64.StdEncoding.EncodeToString(h[:])
	}
	return out
}

// sizes parses two query parameters a ≤ b ≤ head.
func (run *running) sizes(r *http.Request, na, nb string) (uint64, uint64, error) {
	q, err := query(r, na, nb)
	if err != nil {
		return 0, 0, err
	}
	a, err := parseVersion(q.Get(na), na)
	if err != nil {
		return 0, 0, err
	}
	b, err := parseVersion(q.Get(nb), nb)
	if err != nil {
		return 0, 0, err
	}
	if h := run.head.Load().Version; a > b || b > h {
		return 0, 0, badRequest("want %s ≤ %s ≤ %d (head), got %d and %d", na, nb, h, a, b)
	}
	return a, b, nil
}

func (rg *registry) inclusion(w http.ResponseWriter, r *http.Request, run *running, endpoint string, _ []byte) {
	v, size, err := run.sizes(r, "version", "size")
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	var out proofJSON
	err = run.db.View(func(sn *store.Snapshot) error {
		hr := hashReader{sn}
		p, err := tlog.ProveRecord(int64(size), int64(v-1), hr)
		if err != nil {
			return err
		}
		root, err := tlog.TreeHash(int64(size), hr)
		idx := v - 1
		out = proofJSON{Index: &idx, Size: size, Root: base64.StdEncoding.EncodeToString(root[:]), Proof: encodeHashes(p)}
		return err
	})
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (rg *registry) consistency(w http.ResponseWriter, r *http.Request, run *running, endpoint string, _ []byte) {
	old, n, err := run.sizes(r, "old", "new")
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	var out proofJSON
	err = run.db.View(func(sn *store.Snapshot) error {
		hr := hashReader{sn}
		p, err := tlog.ProveTree(int64(n), int64(old), hr)
		if err != nil {
			return err
		}
		root, err := tlog.TreeHash(int64(n), hr)
		out = proofJSON{Old: old, Size: n, Root: base64.StdEncoding.EncodeToString(root[:]), Proof: encodeHashes(p)}
		return err
	})
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// stream sends each committed entry as a server-sent event (event
// "entry", id its version, data {version, hash}) from the version after
// Last-Event-ID, first from the store, then live. A consumer a whole
// buffer behind gets event "lagged" and the stream ends: re-read
// /v1/head. It ends too when the drain begins.
func (rg *registry) stream(w http.ResponseWriter, r *http.Request, run *running, endpoint string, _ []byte) {
	last, err := parseEventID(r.Header.Get("Last-Event-ID"))
	consumer, ok := bus.Consumer(r)
	if err == nil && !ok {
		err = badRequest("consumer must match %s", bus.ConsumerPattern)
	}
	if h := run.head.Load().Version; err == nil && last > h {
		// Versions are only ever sent once committed, and the head only
		// grows: this consumer followed another log, or this one before
		// it was restored. A 4xx ends an EventSource's reconnecting.
		sdk.WriteError(w, http.StatusConflict, "ahead_of_head",
			fmt.Sprintf("Last-Event-ID %d is past the head, version %d: this log never sent it; re-read /v1/head", last, h))
		return
	}
	if err != nil {
		run.fail(w, endpoint, err)
		return
	}
	sub := run.bus.Subscribe(consumer, run.s.streamBuffer)
	defer sub.Close()
	sw := bus.NewWriter(w)
	send := func(ev event) bool {
		b, _ := marshal(ev)
		last = ev.Version
		return sw.Event("entry", strconv.FormatUint(ev.Version, 10), b) == nil
	}
	lagged := func() {
		h := run.head.Load()
		b, _ := marshal(headJSON{h.Version, hex.EncodeToString(h.Hash[:])})
		_ = sw.Event("lagged", "", b)
		sw.Flush()
	}
	// Catch up from the store: the events of the entries committed
	// before the subscription are not on the bus.
	for h := run.head.Load().Version; last < h; {
		if last+1 < run.pruned.Load() {
			lagged()
			return
		}
		var evs []event
		err := run.db.View(func(sn *store.Snapshot) error {
			for v := last + 1; v <= h && len(evs) < 256; v++ {
				var e entry
				if err := json.Unmarshal(sn.Get(bucketEntries, be64(v)), &e); err != nil {
					return fmt.Errorf("entry %d: %w", v, err)
				}
				evs = append(evs, event{e.Version, e.Hash})
			}
			return nil
		})
		if err != nil {
			lagged()
			return
		}
		for _, ev := range evs {
			if !send(ev) {
				return
			}
		}
		sw.Flush()
	}
	for {
		ev, err := sub.Next(r.Context())
		if errors.Is(err, bus.ErrLagged) {
			run.logger.Warn("stream consumer lagged: cut off", "consumer", consumer, "last_version", last, "stream_buffer", run.s.streamBuffer)
			lagged()
			return
		}
		if err != nil {
			return
		}
		if ev.Version <= last {
			continue
		}
		if !send(ev) {
			return
		}
		sw.Flush()
	}
}
