package wire

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// Every request costs two head frames, a request head from the host and a
// response head from the plugin, and proto.Size and proto.Marshal of them
// showed in both processes' CPU profiles. headSize and appendHead encode
// those two kinds of frame, and Body frames, directly, to the bytes
// proto.Marshal gives (TestEncode and FuzzEncodeHead check both). Any
// other frame, and a head proto.Marshal would refuse (a string that is not
// UTF-8, a nil header), is left to proto, so its result and its error are
// proto's.
//
// A large body is not copied into the encoding: with headSizes.ref set,
// appendHead writes its field's tag and length and notes where its bytes
// belong (headSizes.split), and Conn.Send writes them from the caller's
// slice.

// headSizes are the sizes of a head's messages, which headSize works out
// once and appendHead writes as their length prefixes.
type headSizes struct {
	head, msg int // the RequestHead or ResponseHead, and its HTTP message
	// headers are the first of its headers' sizes; appendHead works out
	// the others again.
	headers [8]int
	// ref says appendHead leaves the body's bytes out; it sets split to
	// the offset in its output where they belong.
	ref   bool
	split int
}

// headSize returns the encoded size of f if it is a request or response
// head or a Body frame, which appendHead encodes, and false otherwise.
func headSize(f *pluginv1.Frame, s *headSizes) (int, bool) {
	ok := true
	switch k := f.GetKind().(type) {
	case *pluginv1.Frame_Body:
		if k.Body == nil {
			return 0, false
		}
		s.head = bytesSize(k.Body.GetData()) + boolSize(2, k.Body.GetEnd())
		return varintSize(1, f.GetId()) + protowire.SizeTag(5) + protowire.SizeBytes(s.head), true
	case *pluginv1.Frame_Request:
		if k.Request == nil {
			return 0, false
		}
		ok = requestHeadSize(k.Request, s)
	case *pluginv1.Frame_Response:
		if k.Response == nil {
			return 0, false
		}
		ok = responseHeadSize(k.Response, s)
	default:
		return 0, false
	}
	return varintSize(1, f.GetId()) + protowire.SizeTag(2) + protowire.SizeBytes(s.head), ok
}

// appendHead appends the encoding of f, for which headSize reported true
// and filled s.
func appendHead(b []byte, f *pluginv1.Frame, s *headSizes) []byte {
	b = appendVarint(b, 1, f.GetId())
	switch k := f.GetKind().(type) {
	case *pluginv1.Frame_Request:
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(s.head))
		return appendRequestHead(b, k.Request, s)
	case *pluginv1.Frame_Response:
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(s.head))
		return appendResponseHead(b, k.Response, s)
	case *pluginv1.Frame_Body:
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(s.head))
		b = appendBody(b, 1, k.Body.GetData(), s)
		return appendBool(b, 2, k.Body.GetEnd())
	}
	panic("appendHead of a frame it does not encode")
}

// frameBody returns the body a frame that headSize sizes carries.
func frameBody(f *pluginv1.Frame) []byte {
	switch k := f.GetKind().(type) {
	case *pluginv1.Frame_Request:
		return k.Request.GetRequest().GetBody()
	case *pluginv1.Frame_Response:
		return k.Response.GetResponse().GetBody()
	case *pluginv1.Frame_Body:
		return k.Body.GetData()
	}
	return nil
}

func requestHeadSize(r *pluginv1.RequestHead, s *headSizes) bool {
	n, ok := 0, true
	if h := r.GetRequest(); h != nil {
		ok = httpRequestSize(h, s)
		n += protowire.SizeTag(1) + protowire.SizeBytes(s.msg)
	}
	s.head = n + varintSize(2, uint64(r.GetDeadlineUnixNano())) + boolSize(3, r.GetMore()) + boolSize(4, r.GetStreaming()) +
		varintSize(5, uint64(r.GetWindow()))
	return ok
}

func appendRequestHead(b []byte, r *pluginv1.RequestHead, s *headSizes) []byte {
	if h := r.GetRequest(); h != nil {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(s.msg))
		b = appendString(b, 1, h.GetMethod())
		b = appendString(b, 2, h.GetPath())
		b = appendString(b, 3, h.GetRawQuery())
		b = appendHeaders(b, 4, h.GetHeaders(), s)
		b = appendBody(b, 5, h.GetBody(), s)
		b = appendString(b, 6, h.GetRemoteAddr())
		b = appendString(b, 7, h.GetHost())
		b = appendString(b, 8, h.GetPattern())
		b = appendString(b, 9, h.GetRequestId())
	}
	b = appendVarint(b, 2, uint64(r.GetDeadlineUnixNano()))
	b = appendBool(b, 3, r.GetMore())
	b = appendBool(b, 4, r.GetStreaming())
	return appendVarint(b, 5, uint64(r.GetWindow()))
}

func httpRequestSize(h *pluginv1.HTTPRequest, s *headSizes) bool {
	ok := true
	n := 0
	for _, v := range [...]string{h.GetMethod(), h.GetPath(), h.GetRawQuery(), h.GetRemoteAddr(), h.GetHost(), h.GetPattern(), h.GetRequestId()} {
		n += stringSize(v)
		ok = ok && utf8.ValidString(v)
	}
	hn, hok := headersSize(h.GetHeaders(), s)
	s.msg = n + hn + bytesSize(h.GetBody())
	return ok && hok
}

func responseHeadSize(r *pluginv1.ResponseHead, s *headSizes) bool {
	n, ok := 0, true
	if h := r.GetResponse(); h != nil {
		ok = httpResponseSize(h, s)
		n += protowire.SizeTag(1) + protowire.SizeBytes(s.msg)
	}
	s.head = n + boolSize(3, r.GetMore()) + varintSize(4, uint64(r.GetSize()))
	return ok
}

func appendResponseHead(b []byte, r *pluginv1.ResponseHead, s *headSizes) []byte {
	if h := r.GetResponse(); h != nil {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(s.msg))
		b = appendVarint(b, 1, uint64(int64(h.GetStatus())))
		b = appendHeaders(b, 2, h.GetHeaders(), s)
		b = appendBody(b, 3, h.GetBody(), s)
	}
	b = appendBool(b, 3, r.GetMore())
	return appendVarint(b, 4, uint64(r.GetSize()))
}

func httpResponseSize(h *pluginv1.HTTPResponse, s *headSizes) bool {
	n, ok := headersSize(h.GetHeaders(), s)
	s.msg = varintSize(1, uint64(int64(h.GetStatus()))) + n + bytesSize(h.GetBody())
	return ok
}

// headersSize returns the size of the repeated Header field hs, whose
// number has a one-byte tag, as every Header field's does, and notes the
// first headers' sizes in s.
func headersSize(hs []*pluginv1.Header, s *headSizes) (int, bool) {
	n, ok := 0, true
	for i, h := range hs {
		if h == nil {
			return 0, false
		}
		m, hok := headerSize(h)
		if i < len(s.headers) {
			s.headers[i] = m
		}
		n += 1 + protowire.SizeBytes(m)
		ok = ok && hok
	}
	return n, ok
}

func headerSize(h *pluginv1.Header) (int, bool) {
	n, ok := stringSize(h.GetName()), utf8.ValidString(h.GetName())
	for _, v := range h.GetValues() {
		n += 1 + protowire.SizeBytes(len(v)) // a repeated string keeps its empty values
		ok = ok && utf8.ValidString(v)
	}
	return n, ok
}

func appendHeaders(b []byte, num protowire.Number, hs []*pluginv1.Header, s *headSizes) []byte {
	for i, h := range hs {
		var m int
		if i < len(s.headers) {
			m = s.headers[i]
		} else {
			m, _ = headerSize(h)
		}
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(m))
		b = appendString(b, 1, h.GetName())
		for _, v := range h.GetValues() {
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendString(b, v)
		}
	}
	return b
}

// The sizes and encodings of proto3 scalar fields of a one-byte tag
// (numbers below 16): absent when zero.

func stringSize(s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}

func bytesSize(v []byte) int {
	if len(v) == 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(len(v))
}

func varintSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func boolSize(num protowire.Number, v bool) int {
	if !v {
		return 0
	}
	return protowire.SizeTag(num) + 1
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

// appendBody appends a body field, or with s.ref only its tag and length,
// noting in s.split where its bytes go.
func appendBody(b []byte, num protowire.Number, v []byte, s *headSizes) []byte {
	if !s.ref || len(v) == 0 {
		return appendBytes(b, num, v)
	}
	b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.BytesType), uint64(len(v)))
	s.split = len(b)
	return b
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), 1)
}
