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
	"github.com/plughost/plughost/sdk/idem"
)

// Input limits.
const (
	// maxBodyBytes caps a POST body; a full batch fits well inside.
	maxBodyBytes = 256 << 10
	// maxLegs caps a batch's transfers.
	maxLegs = 1024
	// maxIDLen caps an account id.
	maxIDLen = 128
	// defaultWait is how long a read with min_seq waits when it names no
	// wait; maxWait caps wait.
	defaultWait = time.Second
	maxWait     = time.Minute
)

// request is a decoded POST body.
type request interface {
	// fields are its members, parsed into it.
	fields() fields
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
// order do not count, but every value does. It is the SHA-256 of kind,
// '\n' and the JSON, not idem.FingerprintOf's length-prefixed parts: the
// records in data dirs hold fingerprints made this way, and a retry must
// still match them.
func fingerprint(kind ledger.Kind, r request) idem.Fingerprint {
	b, _ := json.Marshal(r) // plain structs of strings and integers
	h := sha256.New()
	h.Write([]byte(kind.String()))
	h.Write([]byte{'\n'})
	h.Write(b)
	var fp idem.Fingerprint
	h.Sum(fp[:0])
	return fp
}

// decoder decodes the body of one POST endpoint.
type decoder func([]byte) (request, error)

func decodeIssue(b []byte) (request, error) {
	var r issueRequest
	if err := decodeBody(b, r.fields()); err != nil {
		return nil, err
	}
	return &r, nil
}

func (r *issueRequest) fields() fields {
	return fields{
		{name: "to", required: true, parse: accountField(&r.To)},
		{name: "amount", required: true, parse: amountField(&r.Amount)},
	}
}

func decodeTransfer(b []byte) (request, error) {
	var r transferRequest
	if err := decodeBody(b, r.fields()); err != nil {
		return nil, err
	}
	if r.From == r.To {
		return nil, invalidf("from and to are the same account %q", r.From)
	}
	return &r, nil
}

func (r *transferRequest) fields() fields {
	return fields{
		{name: "from", required: true, parse: accountField(&r.From)},
		{name: "to", required: true, parse: accountField(&r.To)},
		{name: "amount", required: true, parse: amountField(&r.Amount)},
		{name: "nonce", required: true, parse: nonceField(&r.Nonce)},
	}
}

func decodeBurn(b []byte) (request, error) {
	var r burnRequest
	if err := decodeBody(b, r.fields()); err != nil {
		return nil, err
	}
	return &r, nil
}

func (r *burnRequest) fields() fields {
	return fields{
		{name: "from", required: true, parse: accountField(&r.From)},
		{name: "amount", required: true, parse: amountField(&r.Amount)},
		{name: "nonce", required: true, parse: nonceField(&r.Nonce)},
	}
}

func decodeBatch(b []byte) (request, error) {
	var r batchRequest
	if err := decodeBody(b, r.fields()); err != nil {
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

func (r *batchRequest) fields() fields {
	return fields{
		{name: "from", required: true, parse: accountField(&r.From)},
		{name: "nonce", required: true, parse: nonceField(&r.Nonce)},
		{name: "transfers", required: true, parse: legsField(&r.Transfers)},
	}
}

// field is one member of a JSON object: its name, whether it must be
// there and how to parse its raw value.
type field struct {
	name     string
	required bool
	parse    func(json.RawMessage) error
}

// fields are the members of one object; decodeFlat takes at most 64.
type fields []field

// lookup returns the index of the member called name, or -1.
func (fs fields) lookup(name []byte) int {
	for i := range fs {
		if fs[i].name == string(name) {
			return i
		}
	}
	return -1
}

// decodeBody decodes a whole body as one JSON object with the given
// members: it refuses invalid UTF-8, unknown and duplicate members,
// missing required ones, and anything after the object.
//
// Almost every body is a flat object of plain strings and integers, which
// decodeFlat takes in one pass; it gives up on anything else, refusals
// included, and decodeStrict, the general decoder, then decides.
// FuzzDecodeFlat checks that the two agree.
func decodeBody(b []byte, fs fields) error {
	if decodeFlat(b, fs) {
		return nil
	}
	return decodeStrict(b, fs)
}

// decodeStrict is decodeBody for any input: it decides every body and
// words every refusal.
func decodeStrict(b []byte, fs fields) error {
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

// decodeFlat decodes b and reports true if it is one JSON object whose
// members are all in fs, each at most once, with every required one
// there, and whose values are strings of printable ASCII without escapes
// or integers without sign, fraction, exponent or leading zero, each
// accepted by its parse. It reports false for anything else, leaving the
// decision and the wording of the error to decodeStrict, which parses
// every field again.
func decodeFlat(b []byte, fs fields) bool {
	if len(fs) > 64 {
		return false
	}
	var seen uint64
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			name, next, ok := plainString(b, i)
			if !ok {
				return false
			}
			f := fs.lookup(name[1 : len(name)-1])
			if f < 0 || seen&(1<<f) != 0 {
				return false
			}
			seen |= 1 << f
			i = skipSpace(b, next)
			if i == len(b) || b[i] != ':' {
				return false
			}
			var raw []byte
			if raw, i, ok = plainValue(b, skipSpace(b, i+1)); !ok || fs[f].parse(raw) != nil {
				return false
			}
			i = skipSpace(b, i)
			if i < len(b) && b[i] == '}' {
				i++
				break
			}
			if i == len(b) || b[i] != ',' {
				return false
			}
			i = skipSpace(b, i+1)
		}
	}
	if skipSpace(b, i) != len(b) {
		return false
	}
	for f := range fs {
		if fs[f].required && seen&(1<<f) == 0 {
			return false
		}
	}
	return true
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString returns the JSON string that starts at b[i], quotes
// included, and the index after it, if it holds only printable ASCII and
// no backslash.
func plainString(b []byte, i int) (s []byte, next int, ok bool) {
	if i == len(b) || b[i] != '"' {
		return nil, i, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i : j+1], j + 1, true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return nil, i, false
		}
	}
	return nil, i, false
}

// plainValue returns the value that starts at b[i] and the index after
// it, if it is a plain string or an integer 0 or [1-9][0-9]*.
func plainValue(b []byte, i int) (raw []byte, next int, ok bool) {
	if i < len(b) && b[i] == '"' {
		return plainString(b, i)
	}
	j := i
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	if j == i || (b[i] == '0' && j > i+1) {
		return nil, i, false
	}
	// What follows must end the number: 1.5, 1e3 and 1x are not plain.
	if j < len(b) {
		switch b[j] {
		case ' ', '\t', '\n', '\r', ',', '}':
		default:
			return nil, i, false
		}
	}
	return b[i:j], j, true
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
	seen := make([]bool, len(fs))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return invalidf("%sinvalid JSON: %v", path, err)
		}
		name, _ := tok.(string) // object keys are always strings
		f := fs.lookup([]byte(name))
		if f < 0 {
			return invalidf("%sunknown field %q", path, name)
		}
		if seen[f] {
			return invalidf("%sfield %q appears twice", path, name)
		}
		seen[f] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return invalidf("%s%s: invalid JSON: %v", path, name, err)
		}
		if err := fs[f].parse(raw); err != nil {
			if serr := restSyntax(dec); serr != nil {
				// "amount":01 reads as 0 and then fails on the 1: the body
				// is not JSON, which says more than "must be positive".
				return invalidf("body is not valid JSON: %v", serr)
			}
			return invalidf("%s%s: %v", path, name, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return invalidf("%sinvalid JSON: %v", path, err)
	}
	for f := range fs {
		if fs[f].required && !seen[f] {
			return invalidf("%smissing field %q", path, fs[f].name)
		}
	}
	return nil
}

// restSyntax reads the rest of dec's input and returns its first syntax
// error, or nil if it is well-formed to its end.
func restSyntax(dec *json.Decoder) error {
	for {
		if _, err := dec.Token(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
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
		if p, _, ok := plainString(raw, 0); ok && len(p) == len(raw) {
			s = string(raw[1 : len(raw)-1]) // what json.Unmarshal would give
		} else if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
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
				{name: "to", required: true, parse: accountField(&l.To)},
				{name: "amount", required: true, parse: amountField(&l.Amount)},
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
