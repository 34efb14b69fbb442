package wire

import (
	"net/http"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// shareMax is the largest frame whose strings share one copy of it. A
// larger frame carries a body, which that copy would include: its strings
// are copied one by one instead.
const shareMax = 8 << 10

// decodeFrame decodes a Frame. Every frame of the data plane is
// decoded here, on both sides, and proto.Unmarshal's reflection and one
// allocation per string and message showed in CPU profiles of a plugin
// under load (BenchmarkDecodeFrame measures the difference). So frames as
// this package's peers encode them (each known field once with its wire
// type, strings valid UTF-8, no unknown fields) are decoded by fastDecode,
// with a handful of allocations: one string that all string fields share
// (or one per string in a frame over shareMax; none for the common names
// and values in interned), one block for the nested messages and up to
// smallHeaders headers and values (and beyond, one for the headers and
// one for their values), and the body's copy unless it is a response's of
// up to smallBody bytes, which that block holds too. Anything else (unknown or repeated message fields, which proto
// merges, or a malformed frame) goes to proto.Unmarshal, so the result,
// and every error, is what proto.Unmarshal gives; FuzzDecodeFrame checks
// that.
func decodeFrame(b []byte) (*pluginv1.Frame, error) {
	if f, ok := fastDecode(b); ok {
		return f, nil
	}
	f := new(pluginv1.Frame)
	if err := proto.Unmarshal(b, f); err != nil {
		return nil, err
	}
	return f, nil
}

// requestFrame and responseFrame are the messages of a frame, allocated
// together with the headers of most requests and responses.
type requestFrame struct {
	f pluginv1.Frame
	k pluginv1.Frame_Request
	r pluginv1.RequestHead
	h pluginv1.HTTPRequest
	s smallHeaderBlock
}

type responseFrame struct {
	f pluginv1.Frame
	k pluginv1.Frame_Response
	r pluginv1.ResponseHead
	h pluginv1.HTTPResponse
	s smallHeaderBlock
	// body holds a body of up to smallBody bytes: most responses carry
	// one, and a JSON answer is often that small.
	body [smallBody]byte
}

// smallBody is the largest response body that a response head's decoding
// copies into the frame's own block rather than an allocation of its own:
// a small JSON answer's.
const smallBody = 64

// smallHeaderBlock holds up to smallHeaders headers and values of a
// decoded frame.
type smallHeaderBlock struct {
	hs   [smallHeaders]pluginv1.Header
	out  [smallHeaders]*pluginv1.Header
	vals [smallHeaders]string
}

// bodyFrame is the messages of a Body frame, allocated together.
type bodyFrame struct {
	f pluginv1.Frame
	k pluginv1.Frame_Body
	b pluginv1.Body
}

// interned are strings that most frames carry: methods, the common
// header names in canonical form, and common header values. The decoder
// returns these rather than a copy, so that a frame whose strings are all
// among them (a JSON response's head) needs no string of its own, and a
// frame over shareMax, whose strings are copied one by one, copies fewer.
var interned = func() map[string]string {
	m := map[string]string{}
	for _, s := range []string{
		http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace,
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control",
		"Content-Encoding", "Content-Length", "Content-Type", "Cookie", "Date", "Etag",
		"Idempotency-Key", "If-Modified-Since", "If-None-Match", "Last-Modified", "Location",
		"Origin", "Pragma", "Referer", "Retry-After", "Server", "Set-Cookie", "Traceparent",
		"User-Agent", "Vary", "X-Content-Type-Options", "X-Forwarded-For", "X-Forwarded-Host",
		"X-Forwarded-Proto", "X-Real-Ip", "X-Request-Id",
		"*/*", "application/json", "application/json; charset=utf-8", "application/octet-stream",
		"text/plain; charset=utf-8", "text/html; charset=utf-8", "text/event-stream",
		"gzip", "gzip, deflate", "gzip, deflate, br", "identity", "no-cache", "no-store", "nosniff",
	} {
		m[s] = s
	}
	return m
}()

// maxInterned is the length of the longest string in interned: a longer
// field is not looked up.
const maxInterned = len("application/json; charset=utf-8")

// frameDecoder holds the frame's bytes and, up to shareMax, the one
// string copy of them that string fields are cut from.
type frameDecoder struct {
	b []byte
	s string
}

// str returns the field value at d.b[off:off+n] as a string, a part of
// d.s in a frame up to shareMax, if it is valid UTF-8.
func (d *frameDecoder) str(off, n int) (string, bool) {
	if n == 0 {
		return "", true
	}
	if n <= maxInterned {
		if s, ok := interned[string(d.b[off:off+n])]; ok {
			return s, true
		}
	}
	if !utf8.Valid(d.b[off : off+n]) {
		return "", false
	}
	if len(d.b) > shareMax {
		return string(d.b[off : off+n]), true
	}
	if d.s == "" {
		d.s = string(d.b)
	}
	return d.s[off : off+n], true
}

// field is one field of a message: its number and wire type, and its
// value: v for a varint; for bytes, b and its offset in the frame.
type field struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	b   []byte
	off int
}

// fields calls fn for each field of the message m, which starts at
// offset base of the frame. It reports false for a wire type other than
// varint and bytes, a malformed field, or fn's false.
func fields(m []byte, base int, fn func(f field) bool) bool {
	size := len(m)
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return false
		}
		m = m[n:]
		f := field{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			f.v, n = protowire.ConsumeVarint(m)
		case protowire.BytesType:
			var l uint64
			l, n = protowire.ConsumeVarint(m)
			if n < 0 || l > uint64(len(m)-n) {
				return false
			}
			f.b, f.off = m[n:n+int(l)], base+size-len(m)+n
			n += int(l)
		default:
			return false
		}
		if n < 0 || !fn(f) {
			return false
		}
		m = m[n:]
	}
	return true
}

func fastDecode(b []byte) (*pluginv1.Frame, bool) {
	d := &frameDecoder{b: b}
	var id uint64
	var kind field
	ok := fields(b, 0, func(f field) bool {
		switch {
		case f.num == 1 && f.typ == protowire.VarintType:
			id = f.v
		case f.num >= 2 && f.num <= 7 && f.typ == protowire.BytesType && kind.num == 0:
			kind = f
		default:
			return false
		}
		return true
	})
	if !ok {
		return nil, false
	}
	switch kind.num {
	case 0:
		return &pluginv1.Frame{Id: id}, true
	case 2:
		rf := &requestFrame{}
		if !d.request(kind, &rf.r, &rf.h, &rf.s) {
			return nil, false
		}
		rf.f.Id, rf.k.Request, rf.f.Kind = id, &rf.r, &rf.k
		return &rf.f, true
	case 3:
		if len(kind.b) != 0 {
			return nil, false
		}
		return &pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Cancel{Cancel: &pluginv1.Cancel{}}}, true
	case 5:
		return body(id, kind)
	case 6:
		return window(id, kind)
	case 7:
		if len(kind.b) != 0 {
			return nil, false
		}
		return &pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Abort{Abort: &pluginv1.Abort{}}}, true
	default:
		rf := &responseFrame{}
		if !d.response(kind, &rf.r, &rf.h, &rf.s, rf.body[:]) {
			return nil, false
		}
		rf.f.Id, rf.k.Response, rf.f.Kind = id, &rf.r, &rf.k
		return &rf.f, true
	}
}

// body decodes a Body frame: its data, copied out of the read buffer, and
// its end flag.
func body(id uint64, m field) (*pluginv1.Frame, bool) {
	bf := &bodyFrame{}
	b := &bf.b
	ok := fields(m.b, m.off, func(f field) bool {
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			b.Data = append([]byte{}, f.b...)
		case f.num == 2 && f.typ == protowire.VarintType:
			b.End = f.v != 0
		default:
			return false
		}
		return true
	})
	bf.k.Body = b
	bf.f.Id, bf.f.Kind = id, &bf.k
	return &bf.f, ok
}

// window decodes a Window frame.
func window(id uint64, m field) (*pluginv1.Frame, bool) {
	w := &pluginv1.Window{}
	ok := fields(m.b, m.off, func(f field) bool {
		if f.num != 1 || f.typ != protowire.VarintType {
			return false
		}
		w.Bytes = uint32(f.v)
		return true
	})
	return &pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Window{Window: w}}, ok
}

// request decodes the RequestHead m into r, and its HTTPRequest, if any,
// into h, its headers into small if they fit.
func (d *frameDecoder) request(m field, r *pluginv1.RequestHead, h *pluginv1.HTTPRequest, small *smallHeaderBlock) bool {
	req, ok := inner(m, func(num protowire.Number, v uint64) bool {
		switch num {
		case 2:
			r.DeadlineUnixNano = int64(v)
		case 3:
			r.More = v != 0
		case 4:
			r.Streaming = v != 0
		case 5:
			r.Window = uint32(v)
		default:
			return false
		}
		return true
	})
	if !ok || req.num == 0 {
		return ok
	}
	r.Request = h
	var buf [8]field
	headers := buf[:0]
	ok = fields(req.b, req.off, func(f field) bool {
		if f.typ != protowire.BytesType {
			return false
		}
		var dst *string
		switch f.num {
		case 1:
			dst = &h.Method
		case 2:
			dst = &h.Path
		case 3:
			dst = &h.RawQuery
		case 4:
			headers = append(headers, f)
			return true
		case 5:
			h.Body = f.b
			return true
		case 6:
			dst = &h.RemoteAddr
		case 7:
			dst = &h.Host
		case 8:
			dst = &h.Pattern
		case 9:
			dst = &h.RequestId
		default:
			return false
		}
		var ok bool
		*dst, ok = d.str(f.off, len(f.b))
		return ok
	})
	if ok {
		h.Body, h.Headers, ok = d.finish(h.Body, headers, small, nil)
	}
	return ok
}

// response decodes the ResponseHead m into r, and its HTTPResponse, if
// any, into h, its headers into small and its body into room if they fit.
func (d *frameDecoder) response(m field, r *pluginv1.ResponseHead, h *pluginv1.HTTPResponse, small *smallHeaderBlock, room []byte) bool {
	resp, ok := inner(m, func(num protowire.Number, v uint64) bool {
		switch num {
		case 3:
			r.More = v != 0
		case 4:
			r.Size = int64(v)
		default:
			return false
		}
		return true
	})
	if !ok || resp.num == 0 {
		return ok
	}
	r.Response = h
	var buf [8]field
	headers := buf[:0]
	ok = fields(resp.b, resp.off, func(f field) bool {
		switch {
		case f.num == 1 && f.typ == protowire.VarintType:
			h.Status = int32(f.v)
		case f.num == 2 && f.typ == protowire.BytesType:
			headers = append(headers, f)
		case f.num == 3 && f.typ == protowire.BytesType:
			h.Body = f.b
		default:
			return false
		}
		return true
	})
	if ok {
		h.Body, h.Headers, ok = d.finish(h.Body, headers, small, room)
	}
	return ok
}

// finish copies an HTTP message's body out of the read buffer (nil for
// none, as proto.Unmarshal leaves an absent field), into room if it fits,
// and decodes its headers, into small if they fit.
func (d *frameDecoder) finish(body []byte, headers []field, small *smallHeaderBlock, room []byte) ([]byte, []*pluginv1.Header, bool) {
	hs, ok := d.headers(headers, small)
	switch {
	case body == nil:
	case len(body) <= len(room):
		body = append(room[:0:len(body)], body...)
	default:
		body = append([]byte{}, body...)
	}
	return body, hs, ok
}

// inner reads a RequestHead or ResponseHead m: it returns field 1, the
// HTTP message (num 0 if absent), and passes every varint field to set,
// which reports whether it knows the field.
func inner(m field, set func(protowire.Number, uint64) bool) (field, bool) {
	var in field
	ok := fields(m.b, m.off, func(f field) bool {
		switch {
		case f.num == 1 && f.typ == protowire.BytesType && in.num == 0:
			in = f
		case f.num != 1 && f.typ == protowire.VarintType:
			return set(f.num, f.v)
		default:
			return false
		}
		return true
	})
	return in, ok
}

// headers decodes Header messages, in two passes: one to count their
// values, one to fill one block of headers and one of values, or small
// for up to smallHeaders of each.
func (d *frameDecoder) headers(ms []field, small *smallHeaderBlock) ([]*pluginv1.Header, bool) {
	if len(ms) == 0 {
		return nil, true
	}
	n := 0
	for _, m := range ms {
		if !fields(m.b, m.off, func(f field) bool {
			if f.num == 2 {
				n++
			}
			return (f.num == 1 || f.num == 2) && f.typ == protowire.BytesType
		}) {
			return nil, false
		}
	}
	var (
		hs   []pluginv1.Header
		out  []*pluginv1.Header
		vals []string
	)
	if len(ms) <= smallHeaders && n <= smallHeaders {
		hs, out, vals = small.hs[:len(ms)], small.out[:len(ms)], small.vals[:0:n]
	} else {
		hs, out, vals = make([]pluginv1.Header, len(ms)), make([]*pluginv1.Header, len(ms)), make([]string, 0, n)
	}
	for i, m := range ms {
		h := &hs[i]
		start := len(vals)
		if !fields(m.b, m.off, func(f field) bool {
			s, ok := d.str(f.off, len(f.b))
			if f.num == 1 {
				h.Name = s
			} else {
				vals = append(vals, s)
			}
			return ok
		}) {
			return nil, false
		}
		if len(vals) > start {
			h.Values = vals[start:len(vals):len(vals)]
		}
		out[i] = h
	}
	return out, true
}
