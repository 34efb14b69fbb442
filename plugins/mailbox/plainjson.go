package main

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strconv"
	"time"
)

// The plain JSON of the busy routes, read and written without
// reflection. A batch of ten 1 KiB sends went through encoding/json's
// scanner four times per payload byte (the batch, then each entry, each
// scanned once to validate and once to decode); splitEntries, parseSend,
// parseSettle and parseRecv read the plain form clients write in one pass
// each. They accept only a subset of JSON whose decoding nobody can
// dispute: objects whose keys are spelled exactly (the parse functions:
// each once), strings of printable ASCII without escapes, non-negative
// integers of at most 18 digits. Anything else (escapes, other spellings
// of a key, duplicates, null, floats, arrays, non-ASCII) goes to
// decodeJSON, which decides what it means or why it is refused.
// FuzzPlainJSON checks that whatever they accept, decodeJSON decodes to
// the same value. appendRecvAnswer writes a receive's answer, which
// FuzzRecvAnswer checks against encoding/json byte for byte.

// lexer reads JSON tokens from b at i.
type lexer struct {
	b []byte
	i int
}

// ws skips JSON whitespace.
func (l *lexer) ws() {
	for l.i < len(l.b) {
		switch l.b[l.i] {
		case ' ', '\t', '\n', '\r':
			l.i++
		default:
			return
		}
	}
}

// next skips whitespace and takes c if it comes next.
func (l *lexer) next(c byte) bool {
	l.ws()
	if l.i < len(l.b) && l.b[l.i] == c {
		l.i++
		return true
	}
	return false
}

// str reads a string of printable ASCII without escapes and returns its
// contents (a slice of b).
func (l *lexer) str() ([]byte, bool) {
	if !l.next('"') {
		return nil, false
	}
	start := l.i
	for ; l.i < len(l.b); l.i++ {
		switch c := l.b[l.i]; {
		case c == '"':
			l.i++
			return l.b[start : l.i-1], true
		case c < ' ' || c >= 0x7f || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// uint reads a non-negative integer of at most 18 digits, as JSON spells
// it (no leading zeros, fraction or exponent).
func (l *lexer) uint() (int64, bool) {
	l.ws()
	start := l.i
	var n int64
	for l.i < len(l.b) && l.b[l.i] >= '0' && l.b[l.i] <= '9' && l.i-start < 18 {
		n = n*10 + int64(l.b[l.i]-'0')
		l.i++
	}
	d := l.i - start
	if d == 0 || d > 1 && l.b[start] == '0' {
		return 0, false
	}
	if l.i < len(l.b) {
		switch l.b[l.i] {
		case '.', 'e', 'E', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			return 0, false
		}
	}
	return n, true
}

// end reports whether only whitespace is left.
func (l *lexer) end() bool {
	l.ws()
	return l.i == len(l.b)
}

// parseSend reads a send's body (sendReq) at l.i. ok is false if it is
// not in the subset parseSend reads; l is then spent.
func parseSend(l *lexer) (r sendReq, ok bool) {
	if !l.next('{') {
		return r, false
	}
	if l.next('}') {
		return r, true
	}
	var seen uint8
	for {
		key, ok := l.str()
		if !ok || !l.next(':') {
			return r, false
		}
		var bit uint8
		switch string(key) {
		case "topic":
			bit = 1
			var s []byte
			s, ok = l.str()
			r.Topic = string(s)
		case "payload":
			bit = 2
			var s []byte
			if s, ok = l.str(); ok {
				p := make([]byte, base64.StdEncoding.DecodedLen(len(s)))
				n, err := base64.StdEncoding.Decode(p, s)
				p, ok = p[:n], err == nil
				r.Payload = &p
			}
		case "attrs":
			bit = 4
			r.Attrs, ok = parseAttrs(l)
		case "delay_ms":
			bit = 8
			r.DelayMs, ok = l.uint()
		case "payload_hash":
			bit = 16
			var s []byte
			s, ok = l.str()
			r.PayloadHash = string(s)
		default:
			return r, false
		}
		if !ok || seen&bit != 0 {
			return r, false
		}
		seen |= bit
		if l.next('}') {
			return r, true
		}
		if !l.next(',') {
			return r, false
		}
	}
}

// parseAttrs reads an object of strings.
func parseAttrs(l *lexer) (map[string]string, bool) {
	if !l.next('{') {
		return nil, false
	}
	m := make(map[string]string)
	if l.next('}') {
		return m, true
	}
	for {
		k, ok := l.str()
		if !ok || !l.next(':') {
			return nil, false
		}
		v, ok := l.str()
		if !ok {
			return nil, false
		}
		m[string(k)] = string(v) // the last of a key wins, as in encoding/json
		if l.next('}') {
			return m, true
		}
		if !l.next(',') {
			return nil, false
		}
	}
}

// parseSettle reads the body of an ack, nack, extend or terminate
// (settleReq) at l.i, as parseSend does a send's.
func parseSettle(l *lexer) (r settleReq, ok bool) {
	if !l.next('{') {
		return r, false
	}
	if l.next('}') {
		return r, true
	}
	var seen uint8
	for {
		key, ok := l.str()
		if !ok || !l.next(':') {
			return r, false
		}
		var bit uint8
		switch string(key) {
		case "msg_id":
			bit = 1
			var s []byte
			s, ok = l.str()
			r.MsgID = string(s)
		case "receipt":
			bit = 2
			var s []byte
			s, ok = l.str()
			r.Receipt = string(s)
		case "delay_ms":
			bit = 4
			var n int64
			n, ok = l.uint()
			r.DelayMs = &n
		case "visibility_ms":
			bit = 8
			var n int64
			n, ok = l.uint()
			r.VisibilityMs = &n
		default:
			return r, false
		}
		if !ok || seen&bit != 0 {
			return r, false
		}
		seen |= bit
		if l.next('}') {
			return r, true
		}
		if !l.next(',') {
			return r, false
		}
	}
}

// parseRecv reads a receive's body (recvReq) at l.i, as parseSend does a
// send's.
func parseRecv(l *lexer) (r recvReq, ok bool) {
	if !l.next('{') {
		return r, false
	}
	if l.next('}') {
		return r, true
	}
	var seen uint8
	for {
		key, ok := l.str()
		if !ok || !l.next(':') {
			return r, false
		}
		var bit uint8
		switch string(key) {
		case "topic":
			bit = 1
			var s []byte
			s, ok = l.str()
			r.Topic = string(s)
		case "max_messages":
			bit = 2
			var n int64
			n, ok = l.uint()
			m := int(n)
			r.MaxMessages = &m
		case "visibility_ms":
			bit = 4
			var n int64
			n, ok = l.uint()
			r.VisibilityMs = &n
		case "wait_ms":
			bit = 8
			r.WaitMs, ok = l.uint()
		default:
			return r, false
		}
		if !ok || seen&bit != 0 {
			return r, false
		}
		seen |= bit
		if l.next('}') {
			return r, true
		}
		if !l.next(',') {
			return r, false
		}
	}
}

// skip steps over a value of the subset: a string, an integer, or (above
// depth 0) an object of such values.
func (l *lexer) skip(depth int) bool {
	l.ws()
	if l.i >= len(l.b) {
		return false
	}
	switch l.b[l.i] {
	case '"':
		_, ok := l.str()
		return ok
	case '{':
		if depth == 0 {
			return false
		}
		l.i++
		if l.next('}') {
			return true
		}
		for {
			if _, ok := l.str(); !ok || !l.next(':') || !l.skip(depth-1) {
				return false
			}
			if l.next('}') {
				return true
			}
			if !l.next(',') {
				return false
			}
		}
	default:
		_, ok := l.uint()
		return ok
	}
}

// splitEntries reads a batch body, {"entries":[...]}, whose entries are
// objects of the subset (a send's, with its attrs, or an ack's), and
// returns each entry's bytes, slices of body, for its own decoder.
func splitEntries(body []byte) ([]json.RawMessage, bool) {
	l := &lexer{b: body}
	if !l.next('{') {
		return nil, false
	}
	if key, ok := l.str(); !ok || string(key) != "entries" || !l.next(':') || !l.next('[') {
		return nil, false
	}
	out := []json.RawMessage{}
	if !l.next(']') {
		for {
			l.ws()
			start := l.i
			if l.i >= len(l.b) || l.b[l.i] != '{' || !l.skip(2) {
				return nil, false
			}
			out = append(out, body[start:l.i:l.i])
			if l.next(']') {
				break
			}
			if !l.next(',') {
				return nil, false
			}
		}
	}
	if !l.next('}') || !l.end() {
		return nil, false
	}
	return out, true
}

// appendRecvAnswer appends a receive's answer, {"messages":[...]} and a
// newline, byte for byte as writeJSON writes it, without reflection: a
// message's fields are hex, base64 and a time, and only its attrs need
// encoding/json's escaping. ok is false, and b unusable, if a message has
// a time or payload only encoding/json knows how to write (a year past
// 9999, a nil payload).
func appendRecvAnswer(b []byte, ds []delivery) (_ []byte, ok bool) {
	n := 16
	for _, d := range ds {
		n += 200 + base64.StdEncoding.EncodedLen(len(d.Env.Payload)) + 64*len(d.Env.Attrs)
	}
	b = slices.Grow(b, n)
	b = append(b, `{"messages":[`...)
	for i, d := range ds {
		if i > 0 {
			b = append(b, ',')
		}
		at := time.UnixMilli(d.Env.EnqueuedAt).UTC()
		if y := at.Year(); y < 0 || y > 9999 || d.Env.Payload == nil {
			return b, false
		}
		b = append(b, `{"msg_id":"`...)
		b = appendHex16(b, d.ID)
		b = append(b, `","receipt":"`...)
		b = append(appendHex16(b, d.ID), '.')
		b = appendHex16(b, d.Receipt)
		b = append(b, `","payload":"`...)
		b = base64.StdEncoding.AppendEncode(b, d.Env.Payload)
		b = append(b, '"')
		if len(d.Env.Attrs) > 0 {
			ab, _ := json.Marshal(d.Env.Attrs)
			b = append(append(b, `,"attrs":`...), ab...)
		}
		b = append(b, `,"attempts":`...)
		b = strconv.AppendUint(b, uint64(d.Attempts), 10)
		b = append(b, `,"payload_hash":"`...)
		b = hex.AppendEncode(b, d.Env.Hash[:])
		b = append(b, `","enqueued_at":"`...)
		b = at.AppendFormat(b, time.RFC3339Nano)
		b = append(b, `"}`...)
	}
	return append(b, "]}\n"...), true
}
