package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
)

// Input limits.
const (
	// maxBodyBytes caps a POST body; a full batch fits well inside.
	maxBodyBytes = 256 << 10
	// maxLegs caps a batch's transfers.
	maxLegs = 1024
	// maxIDLen caps an account id.
	maxIDLen = 128
	// maxKeyLen caps an Idempotency-Key, as Stripe does.
	maxKeyLen = 255
	// defaultWait is how long a read with min_seq waits when it names no
	// wait; maxWait caps wait.
	defaultWait = time.Second
	maxWait     = time.Minute
)

// request is a decoded POST body.
type request interface {
	op() ledger.Op
}

type issueRequest struct {
	To     string `json:"to"`
	Amount uint64 `json:"amount"`
}

func (r *issueRequest) op() ledger.Op {
	return ledger.Op{Kind: ledger.KindIssue, To: r.To, Amount: r.Amount}
}

type transferRequest struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Amount uint64 `json:"amount"`
	Nonce  uint64 `json:"nonce"`
}

func (r *transferRequest) op() ledger.Op {
	return ledger.Op{Kind: ledger.KindTransfer, From: r.From, To: r.To, Amount: r.Amount, Nonce: r.Nonce}
}

type burnRequest struct {
	From   string `json:"from"`
	Amount uint64 `json:"amount"`
	Nonce  uint64 `json:"nonce"`
}

func (r *burnRequest) op() ledger.Op {
	return ledger.Op{Kind: ledger.KindBurn, From: r.From, Amount: r.Amount, Nonce: r.Nonce}
}

type batchRequest struct {
	From      string       `json:"from"`
	Nonce     uint64       `json:"nonce"`
	Transfers []ledger.Leg `json:"transfers"`
}

func (r *batchRequest) op() ledger.Op {
	return ledger.Op{Kind: ledger.KindBatch, From: r.From, Nonce: r.Nonce, Legs: r.Transfers}
}

// fingerprint identifies a request's meaning for idempotency: the kind and
// the canonical JSON of the decoded body, so that whitespace and member
// order do not count, but every value does.
func fingerprint(kind ledger.Kind, r request) [32]byte {
	b, _ := json.Marshal(r) // plain structs of strings and integers
	h := sha256.New()
	h.Write([]byte(kind.String()))
	h.Write([]byte{'\n'})
	h.Write(b)
	var fp [32]byte
	h.Sum(fp[:0])
	return fp
}

// decoder decodes the body of one POST endpoint.
type decoder func([]byte) (request, error)

func decodeIssue(b []byte) (request, error) {
	var r issueRequest
	err := decodeBody(b, fields{
		"to":     {required: true, parse: accountField(&r.To)},
		"amount": {required: true, parse: amountField(&r.Amount)},
	})
	if err != nil {
		return nil, err
	}
	return &r, nil
}

func decodeTransfer(b []byte) (request, error) {
	var r transferRequest
	err := decodeBody(b, fields{
		"from":   {required: true, parse: accountField(&r.From)},
		"to":     {required: true, parse: accountField(&r.To)},
		"amount": {required: true, parse: amountField(&r.Amount)},
		"nonce":  {required: true, parse: nonceField(&r.Nonce)},
	})
	if err != nil {
		return nil, err
	}
	if r.From == r.To {
		return nil, invalidf("from and to are the same account %q", r.From)
	}
	return &r, nil
}

func decodeBurn(b []byte) (request, error) {
	var r burnRequest
	err := decodeBody(b, fields{
		"from":   {required: true, parse: accountField(&r.From)},
		"amount": {required: true, parse: amountField(&r.Amount)},
		"nonce":  {required: true, parse: nonceField(&r.Nonce)},
	})
	if err != nil {
		return nil, err
	}
	return &r, nil
}

func decodeBatch(b []byte) (request, error) {
	var r batchRequest
	err := decodeBody(b, fields{
		"from":      {required: true, parse: accountField(&r.From)},
		"nonce":     {required: true, parse: nonceField(&r.Nonce)},
		"transfers": {required: true, parse: legsField(&r.Transfers)},
	})
	if err != nil {
		return nil, err
	}
	var sum, carry uint64
	for i, l := range r.Transfers {
		if l.To == r.From {
			return nil, invalidf("transfers[%d]: to is the sender %q", i, l.To)
		}
		if sum, carry = bits.Add64(sum, l.Amount, 0); carry != 0 {
			return nil, invalidf("the transfers' amounts add up to more than %d", uint64(1<<64-1))
		}
	}
	return &r, nil
}

// field is one member of a JSON object: whether it must be there and how
// to parse its raw value.
type field struct {
	required bool
	parse    func(json.RawMessage) error
}

type fields map[string]field

// decodeBody decodes a whole body as one JSON object with the given
// members: it refuses invalid UTF-8, unknown and duplicate members,
// missing required ones, and anything after the object.
func decodeBody(b []byte, fs fields) error {
	if !utf8.Valid(b) {
		// encoding/json would quietly turn bad bytes into U+FFFD.
		return invalidf("body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := decodeObject(dec, fs, ""); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalidf("body must hold one JSON object and nothing after it")
	}
	return nil
}

// decodeObject decodes the next JSON value from dec as an object with
// members fs; path prefixes error messages.
func decodeObject(dec *json.Decoder, fs fields, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return invalidf("%sbody is not valid JSON: %v", path, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return invalidf("%smust be a JSON object", orBody(path))
	}
	seen := make(map[string]bool, len(fs))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return invalidf("%sinvalid JSON: %v", path, err)
		}
		name, _ := tok.(string) // object keys are always strings
		f, ok := fs[name]
		if !ok {
			return invalidf("%sunknown field %q", path, name)
		}
		if seen[name] {
			return invalidf("%sfield %q appears twice", path, name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return invalidf("%s%s: invalid JSON: %v", path, name, err)
		}
		if err := f.parse(raw); err != nil {
			return invalidf("%s%s: %v", path, name, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return invalidf("%sinvalid JSON: %v", path, err)
	}
	for name, f := range fs {
		if f.required && !seen[name] {
			return invalidf("%smissing field %q", path, name)
		}
	}
	return nil
}

func orBody(path string) string {
	if path == "" {
		return "body "
	}
	return path
}

func accountField(dst *string) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		var s string
		if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			return errors.New("must be a string")
		}
		if err := checkAccountID(s); err != nil {
			return err
		}
		*dst = s
		return nil
	}
}

func amountField(dst *uint64) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		v, err := parseUint(raw)
		if err != nil {
			return err
		}
		if v == 0 {
			return errors.New("must be positive")
		}
		*dst = v
		return nil
	}
}

func nonceField(dst *uint64) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		v, err := parseUint(raw)
		if err != nil {
			return err
		}
		*dst = v
		return nil
	}
}

func legsField(dst *[]ledger.Leg) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		dec := json.NewDecoder(bytes.NewReader(raw))
		tok, err := dec.Token()
		if d, ok := tok.(json.Delim); err != nil || !ok || d != '[' {
			return errors.New("must be an array of {\"to\", \"amount\"} objects")
		}
		var legs []ledger.Leg
		for dec.More() {
			if len(legs) == maxLegs {
				return fmt.Errorf("more than %d transfers", maxLegs)
			}
			var l ledger.Leg
			err := decodeObject(dec, fields{
				"to":     {required: true, parse: accountField(&l.To)},
				"amount": {required: true, parse: amountField(&l.Amount)},
			}, fmt.Sprintf("[%d].", len(legs)))
			if err != nil {
				return err
			}
			legs = append(legs, l)
		}
		if _, err := dec.Token(); err != nil {
			return fmt.Errorf("invalid JSON: %v", err)
		}
		if len(legs) == 0 {
			return errors.New("must hold at least one transfer")
		}
		*dst = legs
		return nil
	}
}

// parseUint accepts a JSON number that is a non-negative integer of at
// most 64 bits, written without fraction or exponent.
func parseUint(raw json.RawMessage) (uint64, error) {
	s := string(raw)
	if s == "" || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, errors.New("must be a JSON number")
	}
	if s[0] == '-' {
		return 0, errors.New("must not be negative")
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return 0, errors.New("must be an integer, without fraction or exponent")
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("must be at most %d", uint64(1<<64-1))
	}
	return v, nil
}

// checkAccountID accepts 1 to maxIDLen characters of [A-Za-z0-9_.:-].
func checkAccountID(id string) error {
	if id == "" || len(id) > maxIDLen {
		return fmt.Errorf("account id must be 1 to %d characters", maxIDLen)
	}
	for i := range len(id) {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == ':' || c == '-') {
			return fmt.Errorf("account id %q may hold only letters, digits and _ . : -", id)
		}
	}
	return nil
}

// idempotencyKey returns the request's single Idempotency-Key: 1 to
// maxKeyLen visible ASCII characters.
func idempotencyKey(h http.Header) (string, error) {
	vs := h.Values("Idempotency-Key")
	switch {
	case len(vs) == 0:
		return "", errMissingKey
	case len(vs) > 1:
		return "", &invalidError{code: "invalid_idempotency_key", msg: "send one Idempotency-Key header"}
	}
	k := vs[0]
	if k == "" || len(k) > maxKeyLen {
		return "", &invalidError{code: "invalid_idempotency_key", msg: fmt.Sprintf("Idempotency-Key must be 1 to %d characters", maxKeyLen)}
	}
	for i := range len(k) {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "", &invalidError{code: "invalid_idempotency_key", msg: "Idempotency-Key may hold only visible ASCII characters"}
		}
	}
	return k, nil
}

// checkContentType accepts application/json, with parameters.
func checkContentType(h http.Header) error {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return errMediaType
	}
	return nil
}

// readBody reads at most maxBodyBytes.
func readBody(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxBodyBytes+1))
	if err != nil {
		return nil, invalidf("read body: %v", err)
	}
	if len(b) > maxBodyBytes {
		return nil, errTooLarge
	}
	return b, nil
}

// readQuery is the query of the GET routes that read snapshots.
type readQuery struct {
	minSeq uint64
	wait   time.Duration
}

// parseReadQuery accepts min_seq (an unsigned integer) and wait (a Go
// duration up to maxWait), each at most once, and nothing else. wait
// defaults to defaultWait when min_seq is given.
func parseReadQuery(raw string) (readQuery, error) {
	var q readQuery
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return q, invalidf("query does not parse: %v", err)
	}
	for name, vs := range vals {
		if name != "min_seq" && name != "wait" {
			return q, invalidf("unknown query parameter %q; want min_seq and wait", name)
		}
		if len(vs) != 1 {
			return q, invalidf("query parameter %q appears %d times", name, len(vs))
		}
	}
	if s, ok := vals["min_seq"]; ok {
		if q.minSeq, err = strconv.ParseUint(s[0], 10, 64); err != nil {
			return q, invalidf("min_seq must be an unsigned integer")
		}
		q.wait = defaultWait
	}
	if s, ok := vals["wait"]; ok {
		d, err := time.ParseDuration(s[0])
		if err != nil || d < 0 || d > maxWait {
			return q, invalidf("wait must be a duration from 0s to %v, such as 500ms", maxWait)
		}
		q.wait = d
	}
	return q, nil
}

// checkNoQuery refuses any query on routes that take none.
func checkNoQuery(raw string) error {
	if raw != "" {
		return invalidf("this route takes no query parameters")
	}
	return nil
}
