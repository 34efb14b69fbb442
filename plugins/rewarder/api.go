package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/store"
)

// computeMaxBody is the compute route's own body limit (sdk.MaxBody),
// sized for max_contributions' default of 200,000: a contribution in
// compact JSON, {"account":"…","weight":…} and its comma, takes 25 bytes
// besides its account id and its weight's digits, about 40 in all with
// the short ids the issue counts (100,000 ≈ 4 MB). 16 MiB holds 200,000
// of up to 83 bytes each, twice that: ids of up to 48 bytes with
// 10-digit weights. The longest ids and weights (128 bytes, 20 digits)
// would take 34.6 MB, over the host's 32 MiB ceiling. The host answers a
// larger body 413 before the rewarder reads it; the plugin block's
// max_body_bytes lowers the limit.
const computeMaxBody = 16 << 20

// routes declares the API, each route where it is registered.
func (rw *rewarder) routes(mux *sdk.Mux) {
	mux.HandleFunc("POST /v1/epochs/{id}/compute", rw.handle(rw.compute), sdk.MaxBody(computeMaxBody))
	mux.HandleFunc("GET /v1/epochs/{id}", rw.handle(rw.manifest))
	mux.HandleFunc("GET /v1/epochs/{id}/run.json", rw.handle(rw.runJSON))
	mux.HandleFunc("POST /v1/epochs/{id}/retry", rw.handle(rw.retry))
	mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, req *http.Request) {
		if r := rw.serving(w); r != nil {
			rw.events(w, req, r)
		}
	}, sdk.Streaming())
}

// serving returns the running rewarder, or answers 503 and returns nil
// while it is not configured or draining.
func (rw *rewarder) serving(w http.ResponseWriter) *running {
	r := rw.run
	if r == nil || r.draining.Load() {
		w.Header().Set("Retry-After", "1")
		sdk.WriteError(w, http.StatusServiceUnavailable, "draining", "the rewarder is draining")
		return nil
	}
	return r
}

// handle checks the epoch id and that the plugin takes requests, then
// calls h.
func (rw *rewarder) handle(h func(w http.ResponseWriter, req *http.Request, r *running, id string)) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		r := rw.serving(w)
		if r == nil {
			return
		}
		id := req.PathValue("id")
		if !validEpoch(id) {
			writeField(w, "epoch", "an epoch id is 1 to 64 of A-Z a-z 0-9 _ -")
			return
		}
		h(w, req, r, id)
	}
}

func writeField(w http.ResponseWriter, field, msg string) {
	sdk.WriteErrorBody(w, http.StatusBadRequest, sdk.ErrorBody("bad_request", field+": "+msg, map[string]string{"field": field}))
}

// writeStoreError answers a write the committer did not take or could
// not finish: 429 when its queue is full, 503 otherwise.
func writeStoreError(w http.ResponseWriter, r *running, err error) {
	w.Header().Set("Retry-After", fmt.Sprint(max(1, int(r.c.RetryAfter().Seconds()))))
	if errors.Is(err, durable.ErrBusy) {
		r.m.busy.WithLabelValues("compute").Inc()
		sdk.WriteError(w, http.StatusTooManyRequests, "busy", err.Error())
		return
	}
	sdk.WriteError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type accepted struct {
	Epoch string `json:"epoch"`
	State string `json:"state"`
}

// errConflict is a compute whose inputs differ from the sealed ones.
var errConflict = errors.New("the epoch was sealed with other inputs")

// compute seals an epoch's inputs and queues it: 202 the first time (and
// while it is queued or computing), 200 with the manifest once computed,
// 409 for other inputs than the sealed ones.
func (rw *rewarder) compute(w http.ResponseWriter, req *http.Request, r *running, id string) {
	in, err := decodeInputs(req.Body, r.s.maxContributions)
	var fe *FieldError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe): // the host caps bodies first; this is the plugin's own guard
		sdk.WriteError(w, http.StatusRequestEntityTooLarge, "too_large", err.Error())
		return
	case errors.As(err, &fe):
		writeField(w, fe.Field, fe.Message)
		return
	}
	canonical, inputsHash := seal(id, in)
	var e epoch
	created := false
	err = r.commit(req.Context(), func(tx *store.Tx) error {
		cur, ok, err := getEpoch(tx, id)
		switch {
		case err != nil:
			return err
		case ok && cur.InputsHash != inputsHash:
			e = cur // for the 409's message
			return errConflict
		case ok:
			e, created = cur, false
			return nil
		}
		created = true
		e = epoch{Epoch: id, State: stateQueued, InputsHash: inputsHash, PoolAccount: in.PoolAccount,
			PoolAmount: in.PoolAmount, CodeVersion: codeVersion}
		if err := tx.Put(bucketInputs, []byte(id), canonical); err != nil {
			return err
		}
		return putEpoch(tx, e)
	})
	switch {
	case errors.Is(err, errConflict):
		sdk.WriteError(w, http.StatusConflict, "inputs_conflict", fmt.Sprintf("epoch %q was sealed with inputs_hash %s", id, e.InputsHash))
		return
	case err != nil:
		writeStoreError(w, r, err)
		return
	}
	if created {
		r.emit(e)
	}
	switch e.State {
	case stateQueued, stateComputing:
		if err := r.schedule(req.Context(), id); errors.Is(err, errBusy) {
			r.m.busy.WithLabelValues("compute").Inc()
			w.Header().Set("Retry-After", "1")
			sdk.WriteError(w, http.StatusTooManyRequests, "busy", "the work queue is full; the inputs are sealed, retry the same request")
			return
		}
		writeJSON(w, http.StatusAccepted, accepted{Epoch: id, State: e.State})
	default:
		writeJSON(w, http.StatusOK, e)
	}
}

// lookup returns the epoch's record, or answers 404 or 500.
func lookup(w http.ResponseWriter, r *running, id string) (epoch, bool) {
	var e epoch
	var ok bool
	err := r.db.View(func(s *store.Snapshot) (err error) { e, ok, err = getEpoch(s, id); return err })
	switch {
	case err != nil:
		sdk.WriteError(w, http.StatusInternalServerError, "storage_corrupt", err.Error())
	case !ok:
		sdk.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no epoch %q", id))
	}
	return e, err == nil && ok
}

func (rw *rewarder) manifest(w http.ResponseWriter, _ *http.Request, r *running, id string) {
	if e, ok := lookup(w, r, id); ok {
		writeJSON(w, http.StatusOK, e)
	}
}

func (rw *rewarder) runJSON(w http.ResponseWriter, _ *http.Request, r *running, id string) {
	e, ok := lookup(w, r, id)
	if !ok {
		return
	}
	if e.Commitment == "" {
		sdk.WriteError(w, http.StatusNotFound, "not_computed", fmt.Sprintf("epoch %q is %s", id, e.State))
		return
	}
	if e.Pruned || r.due(e) {
		sdk.WriteError(w, http.StatusGone, "pruned", fmt.Sprintf("epoch %q settled at %s; its artifacts were removed after the retention of %s", id, e.SettledAt.Format(time.RFC3339), r.s.retention))
		return
	}
	b, err := os.ReadFile(filepath.Join(r.s.artifactDir, id, "run.json"))
	if err == nil && !bytes.Contains(b, []byte(`"commitment":"`+e.Commitment+`"`)) {
		err = errors.New("run.json does not carry the stored commitment")
	}
	if err != nil {
		sdk.WriteError(w, http.StatusInternalServerError, "artifact_unreadable", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// retry resumes a quarantined epoch: computed again if it failed before
// settlement; settled again with the same keys after
// settlement_unavailable; with the next generation of keys for the parts
// not yet settled after the wallet refused one definitively.
func (rw *rewarder) retry(w http.ResponseWriter, req *http.Request, r *running, id string) {
	var e epoch
	err := r.commit(req.Context(), func(tx *store.Tx) error {
		cur, ok, err := getEpoch(tx, id)
		switch {
		case err != nil:
			return err
		case !ok:
			return errNotFound
		case cur.State != stateQuarantined:
			e = cur
			return errNotQuarantined
		}
		switch {
		case cur.Settlement.Parts == 0:
			cur.State = stateQueued // never computed
		case cur.Reason == reasonUnavailable:
			cur.State = stateSettling
		default:
			cur.Generation++
			for i := cur.Settlement.SettledParts; i < cur.Settlement.Parts; i++ {
				p, err := getPart(tx, id, i)
				if err != nil {
					return err
				}
				p.Key, p.Nonce = idemKey(id, cur.Generation, i), 0
				if err := putPart(tx, id, i, p); err != nil {
					return err
				}
			}
			cur.State = stateSettling
		}
		cur.Reason = ""
		e = cur
		return putEpoch(tx, cur)
	})
	switch {
	case errors.Is(err, errNotFound):
		sdk.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no epoch %q", id))
		return
	case errors.Is(err, errNotQuarantined):
		sdk.WriteError(w, http.StatusConflict, "not_quarantined", fmt.Sprintf("epoch %q is %s", id, e.State))
		return
	case err != nil:
		writeStoreError(w, r, err)
		return
	}
	r.emit(e)
	if e.State == stateQueued {
		_ = r.schedule(req.Context(), id) // if busy, the rescanner takes it
	} else if r.claim(id) {
		r.offer(id)
	}
	writeJSON(w, http.StatusAccepted, accepted{Epoch: id, State: e.State})
}

// due reports whether e is settled and past retention: the pruner may
// have removed its artifacts already.
func (r *running) due(e epoch) bool {
	return r.s.retention > 0 && e.SettledAt != nil && e.SettledAt.Before(r.now().Add(-r.s.retention))
}

var (
	errNotFound       = errors.New("no such epoch")
	errNotQuarantined = errors.New("the epoch is not quarantined")
)
