package api

import (
	"encoding/json"
	"errors"
	"math/bits"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/sdk/idem"
)

// The fuzz targets check, for every decoder of untrusted input, that no
// input panics it, that every refusal is a 400, and that what it accepts
// is well-formed and survives a round trip through its canonical JSON
// (which is what the idempotency fingerprint hashes).

var bodySeeds = []string{
	`{"to":"alice","amount":5}`,
	`{"from":"a","to":"b","amount":3,"nonce":1}`,
	`{"from":"a","amount":3,"nonce":2}`,
	`{"from":"a","nonce":1,"transfers":[{"to":"b","amount":1},{"to":"c","amount":2}]}`,
	`{"to":"a","amount":18446744073709551616}`,
	`{"to":"a","amount":1.5}`,
	`{"to":"a","amount":-1}`,
	`{"to":"a","amount":1e3}`,
	`{"to":"a","amount":1,"amount":2}`,
	`{"to":"a","amount":1}{"x":1}`,
	`{"a": [1, 2`,
	`[null, true, {"": -1e999}]`,
	"{\"to\":\"\xff\",\"amount\":1}",
	`{"from":"a","nonce":1,"transfers":[{"to":"b","amount":18446744073709551615},{"to":"c","amount":1}]}`,
	`{"from":"a","nonce":1,"transfers":[[]]}`,
	`{"from":"a","nonce":1,"transfers":null}`,
	`{"from":"a","to":"a","amount":1,"nonce":1}`,
	`  {"to" : "a" , "amount" : 00}`,
	``,
	`null`,
	`{"to":"a","amount":0}`,
	`{"to":"a","amount":01}`,
	"{\"to\":\"a\x7f\",\"amount\":1}",
	`{"to":"\u0061","amount":1}`,
	` {"to":"a" ,"amount":1 } `,
	`{"to":"a","amount":1,}`,
	`{"to":"a","amount":1} x`,
	`{"to":"a","amount":1`,
	`{"to":"a","amount":1 2}`,
	`{"to":"a","amount":"1"}`,
	`{"amount":1}`,
	`{}`,
}

func fuzzDecoder(f *testing.F, decode decoder, check func(t *testing.T, r request)) {
	for _, s := range bodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := decode(body)
		if err != nil {
			var invalid *invalidError
			if !errors.As(err, &invalid) {
				t.Fatalf("decode(%q) = %v, want an invalidError", body, err)
			}
			if status, _ := classify(err); status != http.StatusBadRequest {
				t.Fatalf("decode(%q) refusal maps to %d, want 400", body, status)
			}
			return
		}
		check(t, r)
		canon, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("encode %+v: %v", r, err)
		}
		again, err := decode(canon)
		if err != nil {
			t.Fatalf("decode(%s) of an accepted request's canonical JSON = %v", canon, err)
		}
		if diff := cmp.Diff(r, again); diff != "" {
			t.Fatalf("round trip of %q mismatch (-first +again):\n%s", body, diff)
		}
	})
}

func checkID(t *testing.T, what, id string) {
	t.Helper()
	if err := checkAccountID(id); err != nil {
		t.Fatalf("accepted %s %q: %v", what, id, err)
	}
}

func FuzzDecodeIssue(f *testing.F) {
	fuzzDecoder(f, decodeIssue, func(t *testing.T, r request) {
		q := r.(*issueRequest)
		checkID(t, "to", q.To)
		if q.Amount == 0 {
			t.Fatalf("accepted issue of 0")
		}
	})
}

func FuzzDecodeTransfer(f *testing.F) {
	fuzzDecoder(f, decodeTransfer, func(t *testing.T, r request) {
		q := r.(*transferRequest)
		checkID(t, "from", q.From)
		checkID(t, "to", q.To)
		if q.Amount == 0 || q.From == q.To {
			t.Fatalf("accepted transfer %+v", q)
		}
	})
}

func FuzzDecodeBurn(f *testing.F) {
	fuzzDecoder(f, decodeBurn, func(t *testing.T, r request) {
		q := r.(*burnRequest)
		checkID(t, "from", q.From)
		if q.Amount == 0 {
			t.Fatalf("accepted burn of 0")
		}
	})
}

func FuzzDecodeBatch(f *testing.F) {
	fuzzDecoder(f, decodeBatch, func(t *testing.T, r request) {
		q := r.(*batchRequest)
		checkID(t, "from", q.From)
		if len(q.Transfers) == 0 || len(q.Transfers) > maxLegs {
			t.Fatalf("accepted batch of %d transfers", len(q.Transfers))
		}
		var sum, carry uint64
		for _, l := range q.Transfers {
			checkID(t, "leg to", l.To)
			if l.To == q.From || l.Amount == 0 {
				t.Fatalf("accepted leg %+v of batch from %q", l, q.From)
			}
			if sum, carry = bits.Add64(sum, l.Amount, 0); carry != 0 {
				t.Fatalf("accepted batch whose legs overflow")
			}
		}
		// The ledger must agree that the shape is valid.
		op := q.op()
		if op.Kind != ledger.KindBatch || len(op.Legs) != len(q.Transfers) {
			t.Fatalf("op() = %+v", op)
		}
	})
}

func FuzzParseReadQuery(f *testing.F) {
	for _, s := range []string{"", "min_seq=5", "min_seq=5&wait=250ms", "wait=1m", "wait=1m1ns", "min_seq=-1",
		"a=%ff%fe&%zz=1&;;&=&x=" + strings.Repeat("9", 400), "min_seq=1&min_seq=1", "wait=1e3s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := parseReadQuery(raw)
		if err != nil {
			if status, _ := classify(err); status != http.StatusBadRequest {
				t.Fatalf("parseReadQuery(%q) refusal maps to %d, want 400", raw, status)
			}
			return
		}
		if q.wait < 0 || q.wait > maxWait {
			t.Fatalf("parseReadQuery(%q).wait = %v, out of range", raw, q.wait)
		}
	})
}

func FuzzIdempotencyKey(f *testing.F) {
	for _, s := range []string{"k", "8e03978e-40d5-43e8-bc93-6894a57f9324", "", " ", "a\x00b", strings.Repeat("k", 256), "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := idem.Key(http.Header{"Idempotency-Key": {v}})
		if err != nil {
			if status, _ := classify(err); status != http.StatusBadRequest {
				t.Fatalf("idempotencyKey(%q) refusal maps to %d, want 400", v, status)
			}
			return
		}
		if k != v || len(k) == 0 || len(k) > idem.MaxKeyLen {
			t.Fatalf("idempotencyKey(%q) = %q", v, k)
		}
		for i := range len(k) {
			if k[i] < 0x21 || k[i] > 0x7e {
				t.Fatalf("idempotencyKey accepted byte %#x", k[i])
			}
		}
	})
}

// FuzzDecodeFlat checks the fast path of decodeBody against the general
// decoder: whatever decodeFlat accepts, decodeStrict accepts with the same
// result, for every endpoint's members; and the canonical JSON of an
// accepted flat request takes the fast path, so that it stays in use.
func FuzzDecodeFlat(f *testing.F) {
	for _, s := range bodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, kind := range []struct {
			name  string
			fresh func() request
			flat  bool // every accepted body of this kind can be flat
		}{
			{"issue", func() request { return &issueRequest{} }, true},
			{"transfer", func() request { return &transferRequest{} }, true},
			{"burn", func() request { return &burnRequest{} }, true},
			{"batch", func() request { return &batchRequest{} }, false},
		} {
			fast, strict := kind.fresh(), kind.fresh()
			ok := decodeFlat(body, fast.fields())
			err := decodeStrict(body, strict.fields())
			if ok {
				if err != nil {
					t.Fatalf("%s: decodeFlat accepted %q, decodeStrict refused it: %v", kind.name, body, err)
				}
				if diff := cmp.Diff(strict, fast, cmp.AllowUnexported()); diff != "" {
					t.Fatalf("%s: %q decodes differently (-strict +flat):\n%s", kind.name, body, diff)
				}
			}
			if err != nil || !kind.flat {
				continue
			}
			canon, err := json.Marshal(strict)
			if err != nil {
				t.Fatalf("encode %+v: %v", strict, err)
			}
			if again := kind.fresh(); !decodeFlat(canon, again.fields()) {
				t.Fatalf("%s: the canonical %s of an accepted body does not take the fast path", kind.name, canon)
			}
		}
	})
}
