package main

import (
	"encoding/base64"
	"encoding/binary"
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
	for len(l.b)-l.i >= 8 && plain8(binary.LittleEndian.Uint64(l.b[l.i:])) {
		l.i += 8
	}
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

// plain8 reports whether the eight bytes in x are all printable ASCII
// other than '"' and '\\', bytes str can step over a word at a time (a
// payload's base64 is all such bytes). Its tests are haszero, hasless
// and hasmore of the bit twiddling hacks
// (graphics.stanford.edu/~seander/bithacks.html): as booleans they are
// exact, so a word with any other byte is never stepped over.
func plain8(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(v uint64) uint64 { return (v - ones) &^ v }
	below := (x - 0x20*ones) &^ x // a byte < 0x20
	above := (x + ones) | x       // a byte > 0x7e
	return (below|above|zero(x^'"'*ones)|zero(x^'\\'*ones))&highs == 0
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

// object reads an object at l.i, calling field with each key and l at
// its value; field reads the value and reports whether it could. With
// once, a key that comes twice (or more than eight keys) is refused.
func (l *lexer) object(once bool, field func(key []byte) bool) bool {
	if !l.next('{') {
		return false
	}
	if l.next('}') {
		return true
	}
	var seen [8][]byte
	n := 0
	for {
		key, ok := l.str()
		if !ok || !l.next(':') {
			return false
		}
		if once {
			if n == len(seen) || slices.ContainsFunc(seen[:n], func(k []byte) bool { return string(k) == string(key) }) {
				return false
			}
			seen[n] = key
			n++
		}
		if !field(key) {
			return false
		}
		if l.next('}') {
			return true
		}
		if !l.next(',') {
			return false
		}
	}
}

// text reads a string into s.
func (l *lexer) text(s *string) bool {
	b, ok := l.str()
	*s = string(b)
	return ok
}

// number reads an integer into a new *int64 at p.
func (l *lexer) number(p **int64) bool {
	n, ok := l.uint()
	*p = &n
	return ok
}

// parseSend reads a send's body (sendReq) at l.i. ok is false if it is
// not in the subset; l is then spent.
func parseSend(l *lexer) (r sendReq, ok bool) {
	ok = l.object(true, func(key []byte) bool {
		switch string(key) {
		case "topic":
			return l.text(&r.Topic)
		case "payload":
			s, ok := l.str()
			if !ok {
				return false
			}
			p := make([]byte, base64.StdEncoding.DecodedLen(len(s)))
			n, err := base64.StdEncoding.Decode(p, s)
			p = p[:n]
			r.Payload = &p
			return err == nil
		case "attrs":
			r.Attrs = make(map[string]string)
			return l.object(false, func(k []byte) bool {
				v, ok := l.str()
				r.Attrs[string(k)] = string(v) // the last of a key wins, as in encoding/json
				return ok
			})
		case "delay_ms":
			var ok bool
			r.DelayMs, ok = l.uint()
			return ok
		case "payload_hash":
			return l.text(&r.PayloadHash)
		}
		return false
	})
	return r, ok
}

// parseSettle reads the body of an ack, nack, extend or terminate
// (settleReq) at l.i, as parseSend does a send's.
func parseSettle(l *lexer) (r settleReq, ok bool) {
	ok = l.object(true, func(key []byte) bool {
		switch string(key) {
		case "msg_id":
			return l.text(&r.MsgID)
		case "receipt":
			return l.text(&r.Receipt)
		case "delay_ms":
			return l.number(&r.DelayMs)
		case "visibility_ms":
			return l.number(&r.VisibilityMs)
		}
		return false
	})
	return r, ok
}

// parseRecv reads a receive's body (recvReq) at l.i, as parseSend does a
// send's.
func parseRecv(l *lexer) (r recvReq, ok bool) {
	ok = l.object(true, func(key []byte) bool {
		switch string(key) {
		case "topic":
			return l.text(&r.Topic)
		case "max_messages":
			n, ok := l.uint()
			m := int(n)
			r.MaxMessages = &m
			return ok
		case "visibility_ms":
			return l.number(&r.VisibilityMs)
		case "wait_ms":
			var ok bool
			r.WaitMs, ok = l.uint()
			return ok
		}
		return false
	})
	return r, ok
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
		return depth > 0 && l.object(false, func([]byte) bool { return l.skip(depth - 1) })
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
	out := make([]json.RawMessage, 0, maxBatchEntries)
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
