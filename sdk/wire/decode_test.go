package wire

import (
	"bytes"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// transferFrames are the frames of one exchange of a small JSON POST.
func transferFrames() (req, resp *pluginv1.Frame) {
	req = &pluginv1.Frame{Id: 42, Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{
		Request: &pluginv1.HTTPRequest{
			Method: "POST", Path: "/v1/transfer", RawQuery: "a=1&b=ü", Pattern: "POST /v1/transfer",
			RemoteAddr: "127.0.0.1:53412", Host: "127.0.0.1:8080", RequestId: "3k9x",
			Headers: []*pluginv1.Header{
				{Name: "Content-Type", Values: []string{"application/json"}},
				{Name: "Idempotency-Key", Values: []string{"c2f6a9a4-1d3e-4b8f-9a57-0e6c1b2d3f40"}},
				{Name: "Accept", Values: []string{"text/html", "application/json", ""}},
				{Name: "X-Empty"},
			},
			Body: []byte(`{"from":"src-17","to":"dst-17","amount":1,"nonce":12345}`),
		},
		DeadlineUnixNano: 1_700_000_000_000_000_000,
	}}}
	resp = &pluginv1.Frame{Id: 42, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{
		Response: &pluginv1.HTTPResponse{
			Status:  200,
			Headers: []*pluginv1.Header{{Name: "Content-Type", Values: []string{"application/json"}}},
			Body:    []byte(`{"tx_id":"tx_00000000000003e9","kind":"transfer","amount":1,"seq":1001}`),
		},
	}}}
	return req, resp
}

// largeFrames are frames over shareMax, whose bodies Encode leaves in the
// caller's slice.
func largeFrames() []*pluginv1.Frame {
	req, resp := transferFrames()
	req.GetRequest().Request.Body = bytes.Repeat([]byte("b"), 14<<10)
	resp.GetResponse().Response.Body = bytes.Repeat([]byte("a"), 20<<10)
	return []*pluginv1.Frame{req, resp,
		{Id: 6, Kind: &pluginv1.Frame_Body{Body: &pluginv1.Body{Data: bytes.Repeat([]byte("p"), PieceBytes), End: true}}},
		{Id: 6, Kind: &pluginv1.Frame_Body{Body: &pluginv1.Body{Data: bytes.Repeat([]byte("q"), refBodyBytes)}}},
	}
}

// decodeSeeds are encoded frames: the canonical ones the peers send, and
// others that proto.Unmarshal reads differently or refuses.
func decodeSeeds(t testing.TB) (canonical, other [][]byte) {
	req, resp := transferFrames()
	for _, f := range []*pluginv1.Frame{
		req, resp, {Id: 7},
		{Id: 1<<64 - 1, Kind: &pluginv1.Frame_Cancel{Cancel: &pluginv1.Cancel{}}},
		{Id: 3, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{More: true, Size: 1 << 20}}},
		{Id: 4, Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{DeadlineUnixNano: -5, More: true, Streaming: true}}},
		{Id: 5, Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{Streaming: true, Window: 64 << 10}}},
		{Id: 6, Kind: &pluginv1.Frame_Body{Body: &pluginv1.Body{Data: []byte("piece"), End: true}}},
		{Id: 8, Kind: &pluginv1.Frame_Window{Window: &pluginv1.Window{Bytes: 65536}}},
		{Id: 9, Kind: &pluginv1.Frame_Abort{Abort: &pluginv1.Abort{}}},
		{Id: 5, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{Response: &pluginv1.HTTPResponse{Status: -1}}}},
	} {
		b, err := proto.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		canonical = append(canonical, b)
	}
	for _, f := range largeFrames() {
		b, err := proto.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		canonical = append(canonical, b)
	}
	reqB, respB := canonical[0], canonical[1]
	other = [][]byte{
		protowire.AppendVarint(protowire.AppendTag(bytes.Clone(reqB), 99, protowire.VarintType), 1), // unknown field
		append(bytes.Clone(respB), respB[2:]...),                                                    // the response message twice: proto merges them
		append(bytes.Clone(reqB), respB[2:]...),                                                     // request, then response: the last wins
		append([]byte{0x12, 0x06, 0x0a, 0x04, 0x0a, 0x02}, 0xc3, 0x28),                              // invalid UTF-8 in the method
		protowire.AppendTag(nil, 1, protowire.BytesType),                                            // the id with the wrong wire type
		reqB[:len(reqB)-3],       // truncated
		{0x08},                   // truncated varint
		{0x1a, 0x02, 0x08, 0x01}, // a cancel with a field
	}
	return canonical, other
}

// TestFastDecodeCanonical checks that the frames the peers send take the
// fast path, and come out as proto.Unmarshal reads them.
func TestFastDecodeCanonical(t *testing.T) {
	canonical, _ := decodeSeeds(t)
	for i, b := range canonical {
		want := new(pluginv1.Frame)
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatal(err)
		}
		got, ok := fastDecode(b)
		if !ok || !proto.Equal(got, want) {
			t.Errorf("frame %d: fastDecode = %v, %v; want %v", i, got, ok, want)
		}
	}
}

// TestDecodeFrameAllocs checks what decoding the frames of most exchanges
// allocates: the frame's messages with its headers in one block, the one
// string its strings share, and the body's copy. A JSON answer's head
// carries only interned strings, and so needs no string of its own, and
// a small body goes in the frame's block.
func TestDecodeFrameAllocs(t *testing.T) {
	req, resp := transferFrames()
	req.GetRequest().Request.Headers = req.GetRequest().Request.Headers[:smallHeaders]
	resp.GetResponse().Response.Body = []byte(`{"greeting":"hello"}` + "\n")
	_, largeResp := transferFrames()
	largeResp.GetResponse().Response.Body = bytes.Repeat([]byte("a"), smallBody+1)
	for _, tt := range []struct {
		name string
		f    *pluginv1.Frame
		want float64
	}{
		{"request head", req, 3},
		{"JSON response head", resp, 1},
		{"JSON response head with a larger body", largeResp, 2},
		{"body", &pluginv1.Frame{Id: 6, Kind: &pluginv1.Frame_Body{Body: &pluginv1.Body{Data: []byte("piece")}}}, 2},
	} {
		b, err := proto.Marshal(tt.f)
		if err != nil {
			t.Fatal(err)
		}
		got := testing.AllocsPerRun(100, func() {
			if _, err := decodeFrame(b); err != nil {
				t.Fatal(err)
			}
		})
		if got != tt.want {
			t.Errorf("decodeFrame(%s) allocates %v times, want %v", tt.name, got, tt.want)
		}
	}
}

// FuzzDecodeFrame checks decodeFrame against proto.Unmarshal: the same
// frame or an error where it fails, for any input, and the fast path only
// ever with proto.Unmarshal's result.
func FuzzDecodeFrame(f *testing.F) {
	canonical, other := decodeSeeds(f)
	for _, b := range append(canonical, other...) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want := new(pluginv1.Frame)
		werr := proto.Unmarshal(b, want)
		if fast, ok := fastDecode(b); ok && (werr != nil || !proto.Equal(fast, want)) {
			t.Fatalf("fastDecode = %v; proto.Unmarshal = %v, %v", fast, want, werr)
		}
		got, err := decodeFrame(b)
		if (err == nil) != (werr == nil) || err == nil && !proto.Equal(got, want) {
			t.Fatalf("decodeFrame = %v, %v; proto.Unmarshal = %v, %v", got, err, want, werr)
		}
		if err == nil {
			// Nothing decoded may share the input: Recv's buffer is
			// reused for the next frame.
			for i := range b {
				b[i] ^= 0xff
			}
			if !proto.Equal(got, want) {
				t.Fatalf("decoded frame changed with its input: %v", got)
			}
		}
	})
}

// BenchmarkFrames encodes, sends and decodes the two frames of one
// data-plane exchange of a small JSON POST, as the host and a plugin do
// for each request: ns/op is per request and response.
func BenchmarkFrames(b *testing.B) {
	req, resp := transferFrames()
	c := NewConn(&bufConn{})
	b.ReportAllocs()
	for b.Loop() {
		for _, f := range []*pluginv1.Frame{req, resp} {
			fr, err := c.Encode(f)
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Send(fr, true); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Recv(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// bufConn is a net.Conn that reads back what was written to it.
type bufConn struct{ bytes.Buffer }

var _ net.Conn = (*bufConn)(nil)

func (c *bufConn) Close() error                     { return nil }
func (c *bufConn) LocalAddr() net.Addr              { return nil }
func (c *bufConn) RemoteAddr() net.Addr             { return nil }
func (c *bufConn) SetDeadline(time.Time) error      { return nil }
func (c *bufConn) SetReadDeadline(time.Time) error  { return nil }
func (c *bufConn) SetWriteDeadline(time.Time) error { return nil }

// BenchmarkDecodeFrame decodes the request and the response frame of one
// exchange with decodeFrame and, as the baseline, with proto.Unmarshal.
func BenchmarkDecodeFrame(b *testing.B) {
	canonical, _ := decodeSeeds(b)
	for _, bc := range []struct {
		name   string
		decode func([]byte) error
	}{
		{"proto.Unmarshal", func(in []byte) error { return proto.Unmarshal(in, new(pluginv1.Frame)) }},
		{"decodeFrame", func(in []byte) error { _, err := decodeFrame(in); return err }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, in := range canonical[:2] {
					if err := bc.decode(in); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
