package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/idem"
)

// Errors of the HTTP layer, besides *invalidError.
var (
	errMediaType = errors.New("Content-Type must be application/json")
	errTooLarge  = fmt.Errorf("body is larger than %d bytes", maxBodyBytes)
	// errDraining: the API is closed for the drain.
	errDraining = errors.New("the wallet is draining; retry on another instance or later")
	// errUnknown: the caller gave up before the outcome was known.
	errUnknown = errors.New("the request ended before its outcome was known; retry with the same Idempotency-Key to learn it")
	// errAheadOfHead marks a Last-Event-ID past the ledger's last seq,
	// which this ledger never sent: 409.
	errAheadOfHead = errors.New("this ledger never sent it; reconnect without it")
)

// invalidError is input the caller must fix; its message says how.
type invalidError struct {
	code string // default "invalid_request"
	msg  string
}

func (e *invalidError) Error() string { return e.msg }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// errorDetail is an error response's error object.
type errorDetail struct {
	Code    string
	Message string
	// ExpectedNonce is the nonce the account's next debit must carry.
	ExpectedNonce *uint64
}

// body encodes d as the platform's JSON error body, with the wallet's own
// members after code and message.
func (d errorDetail) body() []byte {
	if d.ExpectedNonce == nil {
		return sdk.ErrorBody(d.Code, d.Message, nil)
	}
	return sdk.ErrorBody(d.Code, d.Message, struct {
		ExpectedNonce uint64 `json:"expected_nonce"`
	}{*d.ExpectedNonce})
}

// classify maps an error to its HTTP status and JSON error. It is the one
// place where the wallet's errors become statuses; writeError and Render
// both use it.
func classify(err error) (int, errorDetail) {
	d := errorDetail{Message: err.Error()}
	var invalid *invalidError
	var nonce *ledger.NonceError
	// The Idempotency-Key protocol's answers are sdk/idem's: 400 for a
	// missing or malformed key, 409 in use, 422 reused.
	if status, code, ok := idem.Status(err); ok {
		d.Code = code
		return status, d
	}
	switch {
	case errors.As(err, &invalid):
		d.Code = invalid.code
		if d.Code == "" {
			d.Code = "invalid_request"
		}
		return http.StatusBadRequest, d
	case errors.Is(err, errMediaType):
		d.Code = "unsupported_media_type"
		return http.StatusUnsupportedMediaType, d
	case errors.Is(err, errTooLarge):
		d.Code = "body_too_large"
		return http.StatusRequestEntityTooLarge, d
	case errors.Is(err, errAheadOfHead):
		d.Code = "ahead_of_head"
		return http.StatusConflict, d
	case errors.As(err, &nonce):
		d.Code = "nonce_mismatch"
		d.ExpectedNonce = &nonce.Expected
		return http.StatusConflict, d
	case errors.Is(err, ledger.ErrInsufficientFunds):
		d.Code = "insufficient_funds"
		return http.StatusUnprocessableEntity, d
	case errors.Is(err, ledger.ErrSupplyOverflow):
		d.Code = "supply_overflow"
		return http.StatusUnprocessableEntity, d
	case errors.Is(err, ledger.ErrInvalid):
		d.Code = "invalid_request"
		return http.StatusBadRequest, d
	case errors.Is(err, ledger.ErrNotFound):
		d.Code = "not_found"
		return http.StatusNotFound, d
	case errors.Is(err, ledger.ErrCorrupt):
		// Never served, and not the client's to retry: an operator must
		// check and repair the data dir (docs/plugins/wallet.md).
		d.Code = "storage_corrupt"
		d.Message = err.Error()
		return http.StatusInternalServerError, d
	case errors.Is(err, durable.ErrBusy):
		d.Code = "busy"
		return http.StatusTooManyRequests, d
	case errors.Is(err, ledger.ErrOutcomeUnknown):
		// A disk error after the group's log record was written, or a
		// commit still waiting on a stalled disk at the commit timeout:
		// it may yet be applied, and a retry with its key tells.
		d.Code = "outcome_unknown"
		d.Message = "the wallet could not confirm this request's commit: the disk failed or did not answer in time, so it may or may not have been applied; retry with the same Idempotency-Key to learn its outcome"
		return http.StatusServiceUnavailable, d
	case errors.Is(err, durable.ErrUnavailable):
		d.Code = "storage_unavailable"
		return http.StatusServiceUnavailable, d
	case errors.Is(err, durable.ErrDraining), errors.Is(err, errDraining), errors.Is(err, ledger.ErrClosed):
		d.Code = "draining"
		d.Message = errDraining.Error()
		return http.StatusServiceUnavailable, d
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, errUnknown):
		// Usually nobody reads this: the caller left, or the host has
		// answered 504.
		d.Code = "cancelled"
		return http.StatusServiceUnavailable, d
	default:
		d.Code = "internal"
		d.Message = "the wallet failed while handling the request"
		return http.StatusInternalServerError, d
	}
}

// writeError answers err. 429 and 503 carry Retry-After: the rest of the
// breaker's cool-down for storage_unavailable and outcome_unknown, else
// one second (which
// sdk.WriteErrorBody sets).
func (a *API) writeError(w http.ResponseWriter, err error) {
	status, d := classify(err)
	if status == http.StatusInternalServerError {
		a.logger.Error("request failed", "error", err)
	}
	if d.Code == "storage_unavailable" || d.Code == "outcome_unknown" {
		retry := a.committer.RetryAfter()
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retry.Seconds()))))
	}
	sdk.WriteErrorBody(w, status, d.body())
}

// Render is the response to a recorded ledger outcome: 200 with the
// receipt, or the refusal's error. The ledger stores it with the
// idempotency record inside the committing transaction, and the first
// response and every replay send exactly these bytes.
func Render(r ledger.Result) (int, []byte) {
	if r.Err != nil {
		status, d := classify(r.Err)
		return status, d.body()
	}
	receipt := r.ReceiptJSON // as the ledger stored it: not encoded twice
	if receipt == nil {
		receipt = r.Receipt.AppendJSON(nil)
	}
	return http.StatusOK, append(append(make([]byte, 0, len(receipt)+1), receipt...), '\n')
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeRaw(w, status, encode(v))
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// encode is JSON with a trailing newline, like json.Encoder's.
func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain structs come here; this would be a programming error.
		b = []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	return append(b, '\n')
}
