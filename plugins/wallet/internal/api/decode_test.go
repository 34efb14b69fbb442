package api

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/idem"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestDecode(t *testing.T) {
	long := strings.Repeat("x", maxIDLen)
	tests := []struct {
		name   string
		decode decoder
		body   string
		want   request // nil: refused with 400
	}{
		{"issue", decodeIssue, `{"to":"alice","amount":5}`, &issueRequest{To: "alice", Amount: 5}},
		{"issue with whitespace and order", decodeIssue, " {\n\"amount\" : 5 , \"to\":\"alice\"}\n", &issueRequest{To: "alice", Amount: 5}},
		{"issue max amount", decodeIssue, `{"to":"a","amount":18446744073709551615}`, &issueRequest{To: "a", Amount: 1<<64 - 1}},
		{"issue amount over uint64", decodeIssue, `{"to":"a","amount":18446744073709551616}`, nil},
		{"issue zero amount", decodeIssue, `{"to":"a","amount":0}`, nil},
		{"issue negative amount", decodeIssue, `{"to":"a","amount":-5}`, nil},
		{"issue float amount", decodeIssue, `{"to":"a","amount":5.0}`, nil},
		{"issue exponent amount", decodeIssue, `{"to":"a","amount":5e2}`, nil},
		{"issue string amount", decodeIssue, `{"to":"a","amount":"5"}`, nil},
		{"issue null amount", decodeIssue, `{"to":"a","amount":null}`, nil},
		{"issue missing amount", decodeIssue, `{"to":"a"}`, nil},
		{"issue unknown field", decodeIssue, `{"to":"a","amount":1,"memo":"x"}`, nil},
		{"issue duplicate field", decodeIssue, `{"to":"a","amount":1,"amount":2}`, nil},
		{"issue trailing data", decodeIssue, `{"to":"a","amount":1}{}`, nil},
		{"issue not an object", decodeIssue, `[{"to":"a","amount":1}]`, nil},
		{"issue empty body", decodeIssue, ``, nil},
		{"issue truncated", decodeIssue, `{"to":"a","amount":1`, nil},
		{"issue invalid UTF-8", decodeIssue, "{\"to\":\"a\xff\",\"amount\":1}", nil},
		{"issue id of 128 characters", decodeIssue, `{"to":"` + long + `","amount":1}`, &issueRequest{To: long, Amount: 1}},
		{"issue id of 129 characters", decodeIssue, `{"to":"` + long + `x","amount":1}`, nil},
		{"issue empty id", decodeIssue, `{"to":"","amount":1}`, nil},
		{"issue id with a space", decodeIssue, `{"to":"a b","amount":1}`, nil},
		{"issue id with punctuation", decodeIssue, `{"to":"org:team.a_b-1","amount":1}`, &issueRequest{To: "org:team.a_b-1", Amount: 1}},
		{"issue id not a string", decodeIssue, `{"to":7,"amount":1}`, nil},
		{"transfer", decodeTransfer, `{"from":"a","to":"b","amount":3,"nonce":1}`, &transferRequest{From: "a", To: "b", Amount: 3, Nonce: 1}},
		{"transfer nonce 0 is the ledger's to refuse", decodeTransfer, `{"from":"a","to":"b","amount":3,"nonce":0}`, &transferRequest{From: "a", To: "b", Amount: 3}},
		{"transfer to itself", decodeTransfer, `{"from":"a","to":"a","amount":3,"nonce":1}`, nil},
		{"transfer without nonce", decodeTransfer, `{"from":"a","to":"b","amount":3}`, nil},
		{"transfer negative nonce", decodeTransfer, `{"from":"a","to":"b","amount":3,"nonce":-1}`, nil},
		{"burn", decodeBurn, `{"from":"a","amount":3,"nonce":2}`, &burnRequest{From: "a", Amount: 3, Nonce: 2}},
		{"burn with to", decodeBurn, `{"from":"a","to":"b","amount":3,"nonce":2}`, nil},
		{"batch", decodeBatch, `{"from":"a","nonce":1,"transfers":[{"to":"b","amount":1},{"to":"c","amount":2}]}`,
			&batchRequest{From: "a", Nonce: 1, Transfers: []ledger.Leg{{To: "b", Amount: 1}, {To: "c", Amount: 2}}}},
		{"batch no legs", decodeBatch, `{"from":"a","nonce":1,"transfers":[]}`, nil},
		{"batch legs not an array", decodeBatch, `{"from":"a","nonce":1,"transfers":{"to":"b","amount":1}}`, nil},
		{"batch leg to the sender", decodeBatch, `{"from":"a","nonce":1,"transfers":[{"to":"a","amount":1}]}`, nil},
		{"batch leg unknown field", decodeBatch, `{"from":"a","nonce":1,"transfers":[{"to":"b","amount":1,"x":1}]}`, nil},
		{"batch leg zero", decodeBatch, `{"from":"a","nonce":1,"transfers":[{"to":"b","amount":0}]}`, nil},
		{"batch leg not an object", decodeBatch, `{"from":"a","nonce":1,"transfers":[1]}`, nil},
		{"batch legs overflow", decodeBatch, `{"from":"a","nonce":1,"transfers":[{"to":"b","amount":18446744073709551615},{"to":"c","amount":1}]}`, nil},
		{"batch too many legs", decodeBatch, `{"from":"a","nonce":1,"transfers":[` + strings.Repeat(`{"to":"b","amount":1},`, maxLegs) + `{"to":"b","amount":1}]}`, nil},
	}
	// A number with a leading zero is not JSON, and says so, rather than
	// what its first digit would be as a value.
	for _, body := range []string{`{"to":"bob","amount":01}`, `{"to":"bob","amount":00005}`, `{"from":"a","nonce":1,"transfers":[{"to":"b","amount":01}]}`} {
		dec := decodeIssue
		if strings.Contains(body, "transfers") {
			dec = decodeBatch
		}
		if _, err := dec([]byte(body)); err == nil || !strings.Contains(err.Error(), "valid JSON: invalid character '") {
			t.Errorf("decode(%s) = %v, want a JSON syntax error", body, err)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.decode([]byte(tt.body))
			if tt.want == nil {
				var invalid *invalidError
				if !errors.As(err, &invalid) {
					t.Fatalf("decode(%q) = %+v, %v, want an invalidError", tt.body, got, err)
				}
				if status, _ := classify(err); status != http.StatusBadRequest {
					t.Errorf("decode(%q) error maps to %d, want 400", tt.body, status)
				}
				return
			}
			if err != nil {
				t.Fatalf("decode(%q) = %v", tt.body, err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported()); diff != "" {
				t.Errorf("decode(%q) mismatch (-want +got):\n%s", tt.body, diff)
			}
		})
	}
}

func TestFingerprint(t *testing.T) {
	a, _ := decodeTransfer([]byte(`{"from":"a","to":"b","amount":3,"nonce":1}`))
	b, _ := decodeTransfer([]byte(`{ "nonce":1, "amount":3, "to":"b", "from":"a" }`))
	c, _ := decodeTransfer([]byte(`{"from":"a","to":"b","amount":4,"nonce":1}`))
	if fingerprint(ledger.KindTransfer, a) != fingerprint(ledger.KindTransfer, b) {
		t.Errorf("fingerprints of the same transfer written differently differ")
	}
	if fingerprint(ledger.KindTransfer, a) == fingerprint(ledger.KindTransfer, c) {
		t.Errorf("fingerprints of transfers of different amounts are equal")
	}
	i1, _ := decodeIssue([]byte(`{"to":"b","amount":3}`))
	i2, _ := decodeIssue([]byte(`{"to":"b","amount":3}`))
	if fingerprint(ledger.KindIssue, i1) != fingerprint(ledger.KindIssue, i2) {
		t.Errorf("fingerprints of equal issues differ")
	}
	if fingerprint(ledger.KindIssue, i1) == fingerprint(ledger.KindBurn, i1) {
		t.Errorf("fingerprints ignore the endpoint")
	}
}

// TestFingerprintBytes pins how a fingerprint is made: the records in
// existing data dirs hold fingerprints made this way, and a retry of
// their requests must still match them (not idem.FingerprintOf's
// length-prefixed parts).
func TestFingerprintBytes(t *testing.T) {
	r, err := decodeTransfer([]byte(`{ "nonce":1, "amount":3, "to":"b", "from":"a" }`))
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256([]byte("transfer\n" + `{"from":"a","to":"b","amount":3,"nonce":1}`))
	if got := fingerprint(ledger.KindTransfer, r); got != want {
		t.Errorf("fingerprint(transfer) = %x, want %x: the SHA-256 of the kind, a newline and the canonical JSON", got, want)
	}
}

func TestIdempotencyKey(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   string
		code   string
	}{
		{"uuid", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", ""},
		{"255 characters", []string{strings.Repeat("k", 255)}, strings.Repeat("k", 255), ""},
		{"missing", nil, "", "idempotency_key_missing"},
		{"empty", []string{""}, "", "invalid_idempotency_key"},
		{"256 characters", []string{strings.Repeat("k", 256)}, "", "invalid_idempotency_key"},
		{"space", []string{"a b"}, "", "invalid_idempotency_key"},
		{"non-ASCII", []string{"clé"}, "", "invalid_idempotency_key"},
		{"twice", []string{"a", "b"}, "", "invalid_idempotency_key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tt.values {
				h.Add("Idempotency-Key", v)
			}
			got, err := idem.Key(h)
			if tt.code == "" {
				if err != nil || got != tt.want {
					t.Errorf("idempotencyKey(%q) = %q, %v, want %q", tt.values, got, err, tt.want)
				}
				return
			}
			status, d := classify(err)
			if status != http.StatusBadRequest || d.Code != tt.code {
				t.Errorf("idempotencyKey(%q) = %v (%d %s), want 400 %s", tt.values, err, status, d.Code, tt.code)
			}
		})
	}
}

func TestParseReadQuery(t *testing.T) {
	tests := []struct {
		raw  string
		want readQuery
		ok   bool
	}{
		{"", readQuery{}, true},
		{"min_seq=5", readQuery{minSeq: 5, wait: defaultWait}, true},
		{"min_seq=5&wait=250ms", readQuery{minSeq: 5, wait: 250 * time.Millisecond}, true},
		{"min_seq=18446744073709551615&wait=0s", readQuery{minSeq: 1<<64 - 1}, true},
		{"wait=1s", readQuery{wait: time.Second}, true},
		{"min_seq=-1", readQuery{}, false},
		{"min_seq=1.5", readQuery{}, false},
		{"min_seq=18446744073709551616", readQuery{}, false},
		{"min_seq=1&min_seq=2", readQuery{}, false},
		{"wait=2m", readQuery{}, false},
		{"wait=-1s", readQuery{}, false},
		{"wait=soon", readQuery{}, false},
		{"minseq=1", readQuery{}, false},
		{"a=%ff%fe&%zz=1", readQuery{}, false},
	}
	for _, tt := range tests {
		got, err := parseReadQuery(tt.raw)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("parseReadQuery(%q) = %+v, %v, want %+v, ok %v", tt.raw, got, err, tt.want, tt.ok)
		}
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{invalidf("bad"), 400, "invalid_request"},
		{idem.ErrMissing, 400, "idempotency_key_missing"},
		{errMediaType, 415, "unsupported_media_type"},
		{errTooLarge, 413, "body_too_large"},
		{idem.ErrReused, 422, "idempotency_key_reused"},
		{idem.ErrInUse, 409, "idempotency_key_in_use"},
		{&ledger.NonceError{Account: "a", Got: 3, Expected: 2}, 409, "nonce_mismatch"},
		{&ledger.InsufficientFundsError{Account: "a", Balance: 1, Needed: 2}, 422, "insufficient_funds"},
		{ledger.ErrSupplyOverflow, 422, "supply_overflow"},
		{ledger.ErrInvalid, 400, "invalid_request"},
		{ledger.ErrNotFound, 404, "not_found"},
		{ledger.ErrClosed, 503, "draining"},
		{durable.ErrBusy, 429, "busy"},
		{durable.ErrUnavailable, 503, "storage_unavailable"},
		// As the committer wraps a group's failure.
		{fmt.Errorf("%w: commit failed: %w", durable.ErrUnavailable, ledger.ErrOutcomeUnknown), 503, "outcome_unknown"},
		{fmt.Errorf("%w: commit failed: %w", durable.ErrUnavailable, ledger.ErrFailed), 503, "storage_unavailable"},
		{durable.ErrDraining, 503, "draining"},
		{errDraining, 503, "draining"},
		{errUnknown, 503, "cancelled"},
		{errors.New("boom"), 500, "internal"},
	}
	for _, tt := range tests {
		status, d := classify(tt.err)
		if status != tt.status || d.Code != tt.code {
			t.Errorf("classify(%v) = %d %s, want %d %s", tt.err, status, d.Code, tt.status, tt.code)
		}
	}
	_, d := classify(&ledger.NonceError{Expected: 7})
	if d.ExpectedNonce == nil || *d.ExpectedNonce != 7 {
		t.Errorf("classify(NonceError).ExpectedNonce = %v, want 7", d.ExpectedNonce)
	}
}

func TestRender(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name   string
		res    ledger.Result
		status int
		body   string
	}{
		{"receipt", ledger.Result{Receipt: &ledger.Receipt{TxID: "tx_0000000000000001", Kind: "issue", To: "a", Amount: 5, Seq: 1, CommittedAt: at}},
			200, `{"tx_id":"tx_0000000000000001","kind":"issue","to":"a","amount":5,"seq":1,"committed_at":"2025-01-02T03:04:05Z"}` + "\n"},
		{"insufficient funds", ledger.Result{Err: &ledger.InsufficientFundsError{Account: "a", Balance: 1, Needed: 2}},
			422, `{"error":{"code":"insufficient_funds","message":"account \"a\" holds 1, needs 2"}}` + "\n"},
	}
	for _, tt := range tests {
		status, body := Render(tt.res)
		if status != tt.status || string(body) != tt.body {
			t.Errorf("Render(%s) = %d %s, want %d %s", tt.name, status, body, tt.status, tt.body)
		}
	}
}
