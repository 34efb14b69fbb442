package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The decoders of untrusted input: request bodies, receipts and msg_ids
// from clients, and the stored envelope and meta read back from disk.
// Their seeds run in the normal go test.

var fuzzSettings = settings{visibilityMin: 250 * time.Millisecond, defaultVisibility: 5 * time.Second}

func FuzzDecodeSend(f *testing.F) {
	f.Add([]byte(`{"topic":"t","payload":"YQ==","attrs":{"k":"v"},"delay_ms":5}`))
	f.Add([]byte(`{"topic":"t","payload":"YQ==","payload_hash":"` + hexHash(HashOf([]byte("a"))) + `"}`))
	f.Add([]byte(`{"topic":"","payload":null}`))
	f.Add([]byte(`{"topic":"t","payload":"YWJjZGVmZ2g="}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		o, err := decodeSend(body, 4)
		if err != nil {
			return
		}
		if !validTopic(o.topic) || len(o.env.Payload) > 4 || HashOf(o.env.Payload) != o.env.Hash || o.delay < 0 || o.delay > maxDelay {
			t.Errorf("decodeSend(%q) = %+v, which breaks its checks", body, o)
		}
	})
}

func FuzzDecodeRecv(f *testing.F) {
	f.Add([]byte(`{"topic":"t","max_messages":10,"visibility_ms":250,"wait_ms":20000}`))
	f.Add([]byte(`{"topic":"t"}`))
	f.Add([]byte(`{"topic":"t","max_messages":-1}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		o, wait, err := decodeRecv(body, fuzzSettings)
		if err != nil {
			return
		}
		if !validTopic(o.topic) || o.max < 1 || o.max > maxRecvBatch || o.visibility < fuzzSettings.visibilityMin || wait < 0 || wait > maxWait {
			t.Errorf("decodeRecv(%q) = %+v, %v, which breaks its checks", body, o, wait)
		}
	})
}

func FuzzDecodeSettle(f *testing.F) {
	r := Receipt(1, 2)
	f.Add([]byte(`{"msg_id":"0000000000000001","receipt":"`+r+`"}`), uint8(opAck))
	f.Add([]byte(`{"msg_id":"0000000000000001","receipt":"`+r+`","delay_ms":10}`), uint8(opNack))
	f.Add([]byte(`{"msg_id":"0000000000000001","receipt":"`+r+`","visibility_ms":1000}`), uint8(opExtend))
	f.Add([]byte(`{"msg_id":"0000000000000001","receipt":"`+r+`"}`), uint8(opTerminate))
	f.Fuzz(func(t *testing.T, body []byte, k uint8) {
		kind := []opKind{opAck, opNack, opExtend, opTerminate}[int(k)%4]
		o, err := decodeSettle(body, kind, fuzzSettings)
		if err != nil {
			return
		}
		if o.id == 0 || o.nonce == 0 || (kind == opExtend && o.dur < fuzzSettings.visibilityMin) || (kind == opNack && o.dur < -1) {
			t.Errorf("decodeSettle(%q, %s) = %+v, which breaks its checks", body, kind, o)
		}
	})
}

func FuzzDecodeRedrive(f *testing.F) {
	f.Add([]byte(`{"topic":"t","max":10}`))
	f.Add([]byte(`{"topic":"t","max":10,"rate_per_s":2.5}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		o, err := decodeRedrive(body)
		if err == nil && (!validTopic(o.topic+dlqSuffix) || o.max < 1 || o.max > maxRedriveBulk || !(o.rate >= 0)) {
			t.Errorf("decodeRedrive(%q) = %+v, which breaks its checks", body, o)
		}
	})
}

func FuzzParseReceipt(f *testing.F) {
	f.Add(Receipt(1, 2))
	f.Add("ffffffffffffffff.0000000000000001")
	f.Fuzz(func(t *testing.T, s string) {
		id, nonce, err := ParseReceipt(s)
		if err == nil && Receipt(id, nonce) != s {
			t.Errorf("ParseReceipt(%q) = %d, %d, which renders as %q", s, id, nonce, Receipt(id, nonce))
		}
	})
}

func FuzzDecodeEnvelope(f *testing.F) {
	f.Add(encodeEnvelope(envelope{Hash: HashOf([]byte("p")), EnqueuedAt: 7, Attrs: map[string]string{"a": "b", "c": ""}, Payload: []byte("p")}))
	f.Add(encodeEnvelope(envelope{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEnvelope(b)
		if err != nil {
			return
		}
		again, err := decodeEnvelope(encodeEnvelope(e))
		if err != nil || fmt.Sprint(again) != fmt.Sprint(e) {
			t.Errorf("decodeEnvelope(encodeEnvelope(%v)) = %v, %v", e, again, err)
		}
	})
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add(encodeMeta(meta{Topic: "t.dlq", VisibleAt: 5, Attempts: 2, Receipt: 9, Reason: "integrity"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		if again, err := decodeMeta(encodeMeta(m)); err != nil || again != m {
			t.Errorf("decodeMeta(encodeMeta(%v)) = %v, %v", m, again, err)
		}
	})
}

func FuzzDecodeSendEntry(f *testing.F) {
	f.Add([]byte(`{"topic":"t","payload":"YQ==","idempotency_key":"k"}`))
	f.Add([]byte(`{"topic":"t","payload":"YQ==","idempotency_key":null}`))
	f.Add([]byte(`{"entries":[{"topic":"t","payload":"YQ=="}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if es, err := batchEntries(body); err == nil && (len(es) < 1 || len(es) > maxBatchEntries) {
			t.Errorf("batchEntries(%q) = %d entries, want 1 to %d", body, len(es), maxBatchEntries)
		}
		o, err := decodeSendEntry(body, 4)
		if err == nil && (!validTopic(o.topic) || len(o.env.Payload) > 4 || len(o.key) > 255) {
			t.Errorf("decodeSendEntry(%q) = %+v, which breaks its checks", body, o)
		}
	})
}

func FuzzDecodeStream(f *testing.F) {
	f.Add("topic=t&visibility_ms=1000&max_inflight=5")
	f.Add("topic=t&topic=u")
	f.Fuzz(func(t *testing.T, query string) {
		q, err := url.ParseQuery(query)
		if err != nil {
			return
		}
		o, limit, err := decodeStream(q, fuzzSettings)
		if err == nil && (!validTopic(o.topic) || limit < 1 || limit > maxStreamInflight || o.visibility < fuzzSettings.visibilityMin) {
			t.Errorf("decodeStream(%q) = %+v, %d, which breaks its checks", query, o, limit)
		}
	})
}

func FuzzParseCapability(f *testing.F) {
	key := []byte("0123456789abcdef0123456789abcdef")
	tok, _ := mint(key, "t", []string{"send"}, time.Unix(2e9, 0))
	f.Add(tok)
	f.Add("AgEHbWFpbGJveA")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := parseCapability(tok, key)
		// No panic on any input; a token that verifies has its op list.
		if err == nil && c.ops == nil {
			t.Errorf("parseCapability(%q) = %+v", tok, c)
		}
	})
}

// FuzzPlainJSON checks the mailbox's own JSON reader against
// encoding/json: whatever parseSend, parseSettle, parseRecv or splitEntries accepts,
// decodeJSON decodes to the same value.
func FuzzPlainJSON(f *testing.F) {
	for _, s := range []string{
		`{"topic":"t","payload":"YQ=="}`,
		` { "topic" : "t" , "payload" : "YWJj" , "attrs" : { "k" : "v" , "k" : "w" } , "delay_ms" : 0 , "payload_hash" : "00" } `,
		`{"topic":"t","payload":"YQ==","delay_ms":900000,"attrs":{}}`,
		`{"topic":"t","payload":"YQ"}`,
		`{"topic":"t","topic":"u","payload":""}`,
		`{"Topic":"t","payload":"YQ=="}`,
		`{"topic":"t\u0041","payload":"YQ=="}`,
		`{"topic":"t","payload":"YQ==","delay_ms":01}`,
		`{"topic":"t","payload":"YQ==","attrs":{"k":"\u00e9"}}`,
		"{\"topic\":\"t\",\"payload\":\"YQ==\",\"attrs\":{\"k\":\"\xe9\"}}",
		`{"topic":"t","payload":"YQ==","delay_ms":1.5}`,
		`{"topic":"t","payload":"YQ==","delay_ms":1234567890123456789}`,
		`{"topic":"t","payload":null,"attrs":null}`,
		`{"topic":"t","payload":"YQ=="} {}`,
		`{}`,
		`{"entries":[{"topic":"t","payload":"YQ=="},{"msg_id":"0000000000000001","receipt":"r","attrs":{"a":"b"}}]}`,
		`{"entries":[]}`,
		`{"entries":[1,"a"]}`,
		`{"entries":[{"a":{"b":{"c":1}}}]}`,
		`{"entries":[{"topic":"t"}],"entries":[]}`,
		`{"msg_id":"0000000000000001","receipt":"0000000000000001.0000000000000002"}`,
		`{"msg_id":"0000000000000001","receipt":"0000000000000001.0000000000000002","delay_ms":0,"visibility_ms":60000}`,
		`{"msg_id":"a","msg_id":"b"}`,
		`{"MSG_ID":"a","receipt":"b"}`,
		`{"msg_id":"a","delay_ms":null}`,
		`{"msg_id":"a","visibility_ms":-1}`,
		`{"topic":"t","max_messages":10,"visibility_ms":30000,"wait_ms":100}`,
		`{"topic":"t","max_messages":999999999999999999}`,
		`{"topic":"t","wait_ms":20000,"max_messages":0}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		l := &lexer{b: body}
		if got, ok := parseSend(l); ok && l.end() {
			var want sendReq
			if err := decodeJSON(body, &want); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("parseSend(%q) = %+v; decodeJSON = %+v, %v", body, got, want, err)
			}
		}
		l = &lexer{b: body}
		if got, ok := parseSettle(l); ok && l.end() {
			var want settleReq
			if err := decodeJSON(body, &want); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("parseSettle(%q) = %+v; decodeJSON = %+v, %v", body, got, want, err)
			}
		}
		l = &lexer{b: body}
		if got, ok := parseRecv(l); ok && l.end() {
			var want recvReq
			if err := decodeJSON(body, &want); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("parseRecv(%q) = %+v; decodeJSON = %+v, %v", body, got, want, err)
			}
		}
		if got, ok := splitEntries(body); ok {
			var want struct {
				Entries []json.RawMessage `json:"entries"`
			}
			if err := decodeJSON(body, &want); err != nil || !reflect.DeepEqual(got, want.Entries) {
				t.Errorf("splitEntries(%q) = %q; decodeJSON = %q, %v", body, got, want.Entries, err)
			}
		}
	})
}

// FuzzRecvAnswer checks appendRecvAnswer against encoding/json: a
// receive's answer is the same bytes either way, and MsgID and Receipt
// render as fmt's %016x.
func FuzzRecvAnswer(f *testing.F) {
	f.Add(uint64(1), uint64(2), []byte("hello"), "", "", uint32(1), int64(1764193200123), 2)
	f.Add(uint64(1<<63), uint64(1<<64-1), []byte{}, "k<&>", "v\xff\"\u2028", uint32(5), int64(-62135596800001), 1)
	f.Add(uint64(17), uint64(18), []byte(nil), "a", "b", uint32(0), int64(253402300800000), 3)
	f.Fuzz(func(t *testing.T, id, nonce uint64, payload []byte, k, v string, attempts uint32, at int64, n int) {
		if got, want := Receipt(id, nonce), fmt.Sprintf("%016x.%016x", id, nonce); got != want || MsgID(id) != want[:16] {
			t.Fatalf("Receipt(%d, %d) = %q, MsgID %q; want %q", id, nonce, got, MsgID(id), want)
		}
		d := delivery{ID: id, Receipt: nonce, Attempts: attempts, Env: envelope{Hash: HashOf(payload), EnqueuedAt: at, Payload: payload}}
		if k != "" {
			d.Env.Attrs = map[string]string{k: v, "z": k}
		}
		ds := make([]delivery, max(0, n%4))
		for i := range ds {
			ds[i] = d
		}
		out := struct {
			Messages []message `json:"messages"`
		}{Messages: []message{}}
		for _, d := range ds {
			out.Messages = append(out.Messages, toMessage(d))
		}
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(out); err != nil {
			return // writeJSON writes nothing then either; not a client's input
		}
		got, ok := appendRecvAnswer(nil, ds)
		if !ok && len(ds) > 0 && payload != nil {
			t.Fatalf("appendRecvAnswer refused a message encoding/json writes: %s", want.Bytes())
		}
		if ok && !bytes.Equal(got, want.Bytes()) {
			t.Errorf("appendRecvAnswer = %s\nencoding/json  = %s", got, want.Bytes())
		}
	})
}

// TestPlain8 checks str's word-at-a-time test against the byte-at-a-time
// rule: every byte value at every place of a word, and words of bytes
// next to the rule's edges, where a borrow or carry between bytes could
// hide one.
func TestPlain8(t *testing.T) {
	plain := func(c byte) bool { return c >= ' ' && c < 0x7f && c != '"' && c != '\\' }
	check := func(w [8]byte) {
		want := true
		for _, c := range w {
			want = want && plain(c)
		}
		if got := plain8(binary.LittleEndian.Uint64(w[:])); got != want {
			t.Errorf("plain8(%q) = %v, want %v", w[:], got, want)
		}
	}
	for c := range 256 {
		for i := range 8 {
			w := [8]byte{'A', 'A', 'A', 'A', 'A', 'A', 'A', 'A'}
			w[i] = byte(c)
			check(w)
		}
	}
	edges := []byte{0x00, 0x01, 0x1f, ' ', '!', '"', '#', '[', '\\', ']', '~', 0x7f, 0x80, 0xfe, 0xff, 'A'}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		var w [8]byte
		for i := range w {
			w[i] = edges[r.IntN(len(edges))]
		}
		check(w)
	}
	// Through str: a long string with one byte out of the subset at each
	// place is refused, and a long plain one read whole.
	for i := range 40 {
		b := []byte(`"` + strings.Repeat("A", 40) + `"`)
		b[1+i] = '\\'
		if _, ok := (&lexer{b: b}).str(); ok {
			t.Errorf("str(%q) = ok, want refused", b)
		}
	}
	b := `"` + strings.Repeat("YWJj", 10) + `" `
	if s, ok := (&lexer{b: []byte(b)}).str(); !ok || string(s) != b[1:len(b)-2] {
		t.Errorf("str(%q) = %q, %v, want %q", b, s, ok, b[1:len(b)-2])
	}
}

// FuzzBatchResults checks appendResults against encoding/json writing the
// batch routes' answers as structs, byte for byte: entries that succeed,
// fail, and (in an ack batch) fail naming their message.
func FuzzBatchResults(f *testing.F) {
	f.Add(uint64(1), true, "", 0, 3)
	f.Add(uint64(1<<64-1), false, "topic \"a<b>&c\"\n\u2028 \xff", 409, 7)
	f.Add(uint64(0), false, "bad", 400, 1)
	f.Fuzz(func(t *testing.T, id uint64, dup bool, msg string, status, n int) {
		type sendAnswer struct {
			MsgID     string `json:"msg_id"`
			Duplicate bool   `json:"duplicate"`
		}
		type sendEntry struct {
			*sendAnswer
			Error *entryError `json:"error,omitempty"`
		}
		type ackEntry struct {
			MsgID string      `json:"msg_id,omitempty"`
			Error *entryError `json:"error,omitempty"`
		}
		var rs []entryResult
		var sends []sendEntry
		var acks []ackEntry
		for i := range 1 + (n%8+8)%8 { // 1 to 8 entries: a batch has at least one
			e := &entryError{Status: status, Code: "code", Message: msg}
			switch i % 3 {
			case 0: // succeeded
				rs = append(rs, entryResult{id: id, duplicate: dup})
				if id != 0 {
					sends = append(sends, sendEntry{sendAnswer: &sendAnswer{MsgID: MsgID(id), Duplicate: dup}})
					acks = append(acks, ackEntry{MsgID: MsgID(id)})
				} else { // an ack entry that named no message has an error
					sends = append(sends, sendEntry{sendAnswer: &sendAnswer{MsgID: MsgID(id), Duplicate: dup}})
					acks = append(acks, ackEntry{})
				}
			case 1: // refused before it named a message
				rs = append(rs, entryResult{err: e})
				sends = append(sends, sendEntry{Error: e})
				acks = append(acks, ackEntry{Error: e})
			default: // an ack refused after it named its message
				rs = append(rs, entryResult{id: id, err: e})
				sends = append(sends, sendEntry{Error: e})
				ack := ackEntry{Error: e}
				if id != 0 {
					ack.MsgID = MsgID(id)
				}
				acks = append(acks, ack)
			}
		}
		for _, c := range []struct {
			send bool
			v    any
		}{
			{true, struct {
				Results []sendEntry `json:"results"`
			}{sends}},
			{false, struct {
				Results []ackEntry `json:"results"`
			}{acks}},
		} {
			if c.send && id == 0 && len(rs) > 0 {
				continue // a send's id is never 0
			}
			var want bytes.Buffer
			if err := json.NewEncoder(&want).Encode(c.v); err != nil {
				t.Fatal(err)
			}
			if got := appendResults(nil, rs, c.send); !bytes.Equal(got, want.Bytes()) {
				t.Errorf("appendResults(send %v) = %s\nencoding/json = %s", c.send, got, want.Bytes())
			}
		}
	})
}
