package wire

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// encodeSeeds are frames for the head encoder: the heads it encodes, and
// frames it leaves to proto.
func encodeSeeds() []*pluginv1.Frame {
	req, resp := transferFrames()
	return []*pluginv1.Frame{
		req, resp, {Id: 7},
		{Id: 1<<64 - 1, Kind: &pluginv1.Frame_Cancel{Cancel: &pluginv1.Cancel{}}},
		{Id: 3, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{More: true, Size: 1 << 20}}},
		{Id: 3, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{Size: -1}}},
		{Id: 4, Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{DeadlineUnixNano: -5, More: true, Streaming: true}}},
		{Id: 5, Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{Streaming: true, Window: 64 << 10}}},
		{Id: 5, Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{Request: &pluginv1.HTTPRequest{}}}},
		{Id: 5, Kind: &pluginv1.Frame_Request{}},
		{Id: 5, Kind: &pluginv1.Frame_Response{}},
		{Id: 6, Kind: &pluginv1.Frame_Body{Body: &pluginv1.Body{Data: []byte("piece"), End: true}}},
		{Id: 8, Kind: &pluginv1.Frame_Window{Window: &pluginv1.Window{Bytes: 65536}}},
		{Id: 9, Kind: &pluginv1.Frame_Abort{Abort: &pluginv1.Abort{Refused: true}}},
		{Id: 5, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{Response: &pluginv1.HTTPResponse{Status: -1}}}},
		{Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{Response: &pluginv1.HTTPResponse{
			Status: 200, Headers: []*pluginv1.Header{{Name: "X-Bad", Values: []string{"\xff"}}}}}}},
		{Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{Request: &pluginv1.HTTPRequest{
			Method: "GET", Path: "/\xc3\x28"}}}},
		{Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{Request: &pluginv1.HTTPRequest{
			Headers: []*pluginv1.Header{{Name: "A"}, nil}}}}},
		{Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{Request: &pluginv1.HTTPRequest{
			Headers: []*pluginv1.Header{{Name: "\xff", Values: []string{"v"}}}}}}},
	}
}

// TestEncode checks that Conn.Encode gives what proto.Marshal does for
// every frame, through the head encoder or not: the same bytes after the
// length prefix, or an error where proto.Marshal fails.
func TestEncode(t *testing.T) {
	for i, f := range encodeSeeds() {
		checkEncode(t, i, f)
	}
}

func checkEncode(t *testing.T, i int, f *pluginv1.Frame) {
	t.Helper()
	want, werr := proto.MarshalOptions{Deterministic: true}.Marshal(f)
	c := NewConn(&bufConn{})
	fr, err := c.Encode(f)
	if (err != nil) != (werr != nil) {
		t.Fatalf("frame %d: Encode() error %v, proto.Marshal error %v", i, err, werr)
	}
	if err != nil {
		return
	}
	defer fr.release()
	if got := fr.b[frameHeaderBytes:]; !bytes.Equal(got, want) {
		t.Errorf("frame %d (%v): Encode() = %x, want proto.Marshal's %x", i, f, got, want)
	}
	if n, ok := headSize(f, &headSizes{}); ok && n != len(want) {
		t.Errorf("frame %d: headSize() = %d, want %d", i, n, len(want))
	}
}

// TestEncodeLargeBody checks that a frame whose body Encode leaves in the
// caller's slice is sent as proto.Marshal encodes it, and that a body
// below refBodyBytes is copied.
func TestEncodeLargeBody(t *testing.T) {
	for i, f := range largeFrames() {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		out := &bufConn{}
		c := NewConn(out)
		fr, err := c.Encode(f)
		if err != nil {
			t.Fatalf("frame %d: Encode() error %v", i, err)
		}
		if fr.body == nil || len(fr.b) >= len(want) {
			t.Errorf("frame %d: Encode() copied its %d-byte body into the frame", i, len(frameBody(f)))
		}
		if err := c.Send(fr, true); err != nil {
			t.Fatal(err)
		}
		if got := out.Bytes()[frameHeaderBytes:]; !bytes.Equal(got, want) {
			t.Errorf("frame %d: sent %d bytes that differ from proto.Marshal's %d", i, len(got), len(want))
		}
	}
	small := &pluginv1.Frame{Id: 6, Kind: &pluginv1.Frame_Body{Body: &pluginv1.Body{Data: bytes.Repeat([]byte("s"), refBodyBytes-1)}}}
	fr, err := NewConn(&bufConn{}).Encode(small)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.release()
	if fr.body != nil {
		t.Errorf("a body of %d bytes was left in the caller's slice", refBodyBytes-1)
	}
	checkEncode(t, -1, small)
}

// FuzzEncodeHead checks the head encoder against proto.Marshal for heads
// made of fuzzed values.
func FuzzEncodeHead(f *testing.F) {
	f.Add(uint64(42), "GET", "/v1/x", "a=1", "Accept", "*/*", "", []byte("body"), int32(200), int64(5), true)
	f.Add(uint64(0), "", "", "", "", "", "v2", []byte(nil), int32(-1), int64(-5), false)
	f.Add(uint64(1<<64-1), "P\xffST", "/ü", "", "X-A", "\xc3\x28", "", []byte{}, int32(1<<31-1), int64(1<<62), true)
	f.Fuzz(func(t *testing.T, id uint64, method, path, query, name, v1, v2 string, body []byte, status int32, n int64, flag bool) {
		var hs []*pluginv1.Header
		if name != "" || v1 != "" || v2 != "" {
			hs = []*pluginv1.Header{{Name: name, Values: []string{v1, v2}}, {Name: v2}}
		}
		checkEncode(t, 0, &pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Request{Request: &pluginv1.RequestHead{
			Request: &pluginv1.HTTPRequest{Method: method, Path: path, RawQuery: query, Headers: hs, Body: body,
				RemoteAddr: v1, Host: v2, Pattern: name, RequestId: query},
			DeadlineUnixNano: n, More: flag, Streaming: !flag, Window: uint32(status),
		}}})
		checkEncode(t, 1, &pluginv1.Frame{Id: id, Kind: &pluginv1.Frame_Response{Response: &pluginv1.ResponseHead{
			Response: &pluginv1.HTTPResponse{Status: status, Headers: hs, Body: body},
			More:     flag, Size: n,
		}}})
	})
}
