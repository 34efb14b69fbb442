package main

import (
	"bytes"
	"strconv"
	"testing"
)

// The decoders of untrusted input: request bodies and the stream's
// Last-Event-ID. Each must refuse or accept without panicking, and what it
// accepts must satisfy the rules the handlers rely on.

func FuzzDecodeProposal(f *testing.F) {
	for _, s := range []string{`{"artifact":{"a":1}}`, `{"artifact":{"b":[1,2,{"c":null}],"a":"\u003c"}}`, `{"artifact":[]}`,
		`{"artifact":{}} x`, `{"artifact":{"a":1e400}}`, `{"artifact":{"a":1,"a":2}}`, `{}`, `{"x":1}`, `nul`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		o, err := decodeProposal(body)
		if err != nil {
			return
		}
		if len(o.artifact) > maxArtifact || o.artifact[0] != '{' {
			t.Fatalf("accepted artifact %q", o.artifact)
		}
		again, err := canonicalArtifact(o.artifact)
		if err != nil || !bytes.Equal(again, o.artifact) {
			t.Fatalf("canonical form %q is not canonical: %q, %v", o.artifact, again, err)
		}
		if o.digest != digestOf(o.artifact) || !idRE.MatchString(o.id) {
			t.Fatalf("op %+v: digest or id wrong", o)
		}
	})
}

func FuzzDecodeProposalBatch(f *testing.F) {
	f.Add([]byte(`{"proposals":[{"artifact":{"a":1}},{"artifact":1}]}`))
	f.Add([]byte(`{"proposals":[]}`))
	f.Add([]byte(`{"proposals":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		ops, errs, err := decodeProposalBatch(body)
		if err != nil {
			return
		}
		if len(ops) == 0 || len(ops) > maxBatch || len(errs) != len(ops) {
			t.Fatalf("accepted a batch of %d (%d errors)", len(ops), len(errs))
		}
	})
}

func FuzzDecodeApproval(f *testing.F) {
	id := "0123456789abcdef0123456789abcdef"
	f.Add(id, []byte(`{"approver":"a","signature":"`+string(bytes.Repeat([]byte("A"), 86))+`=="}`))
	f.Add(id, []byte(`{"approver":"a","signature":"!!"}`))
	f.Add("x", []byte(`{"approver":"","signature":""}`))
	f.Add(id, []byte(`{"proposal_id":"y","approver":"a","signature":""}`))
	f.Fuzz(func(t *testing.T, id string, body []byte) {
		s, err := decodeApproval(id, body)
		if err != nil {
			return
		}
		if s.o.kind != opApprove || s.o.id != id || !idRE.MatchString(id) || len(s.sig) != 64 || s.o.approval.Approver == "" {
			t.Fatalf("accepted %+v", s)
		}
	})
}

func FuzzDecodeApprovalBatch(f *testing.F) {
	f.Add([]byte(`{"approvals":[{"proposal_id":"0123456789abcdef0123456789abcdef","approver":"a","signature":"eA=="}]}`))
	f.Add([]byte(`{"approvals":[{}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		ss, errs, err := decodeApprovalBatch(body)
		if err != nil {
			return
		}
		if len(ss) == 0 || len(ss) > maxBatch || len(errs) != len(ss) {
			t.Fatalf("accepted a batch of %d", len(ss))
		}
		for i, s := range ss {
			if errs[i] == nil && (len(s.sig) != 64 || !idRE.MatchString(s.o.id)) {
				t.Fatalf("accepted element %d: %+v", i, s)
			}
		}
	})
}

func FuzzParseEventID(f *testing.F) {
	for _, s := range []string{"", "0", "1", "18446744073709551615", "18446744073709551616", "-1", "+1", " 1", "0x10", "01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseEventID(s)
		if err != nil || s == "" {
			return
		}
		if w, perr := strconv.ParseUint(s, 10, 64); perr != nil || w != v {
			t.Fatalf("parseEventID(%q) = %d, want what ParseUint says (%d, %v)", s, v, w, perr)
		}
	})
}
