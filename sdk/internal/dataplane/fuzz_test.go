package dataplane

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// FuzzNewRequest checks that no request from the host, however malformed,
// panics newRequest, and that a request it accepts keeps the path, query and
// body it was given. When split is set the body comes as it does in pieces:
// its first byte in the head, the rest through the call's pipe.
func FuzzNewRequest(f *testing.F) {
	f.Add("GET", "/", "", "Accept", "*/*", []byte(nil), false)
	f.Add("POST", "/items/42", "a=1&b=two%20words", "content-type", "application/json", []byte(`{"x":1}`), false)
	f.Add("", "", "", "", "", []byte(nil), false)
	f.Add("BAD METHOD", "/x", "", "X", "y", []byte("body"), false)
	f.Add("GET", "//evil.example/path", "q=%zz", "Host", "other", []byte(nil), false)
	f.Add("GET", "a:b/c", "#frag", "x\x00y", "v\r\nInjected: 1", []byte{0xff}, false)
	f.Add("PUT", "/files/a b/\u00fc/%2F", "\x7f\x00", "", "", []byte("payload"), false)
	f.Add("PUT", "/blob", "", "Content-Length", "7", []byte("payload"), true)
	f.Add("PUT", "/blob", "", "Content-Length", "-1", []byte("payload"), true)
	f.Add("PUT", "/blob", "", "Content-Length", "99999999999999999999", []byte("x"), true)
	f.Fuzz(func(t *testing.T, method, path, rawQuery, name, value string, body []byte, split bool) {
		req := &pluginv1.HTTPRequest{
			Method:   method,
			Path:     path,
			RawQuery: rawQuery,
			Headers:  []*pluginv1.Header{{Name: name, Values: []string{value}}},
			Body:     body,
		}
		c := &call{ctx: t.Context(), req: req}
		if split && len(body) > 0 {
			req.Body = body[:1]
			c.body = newPipe(t.Context(), req.Body)
			c.body.push(body[1:], true)
		}
		r, err := newRequest(c)
		if err != nil {
			return
		}
		if r.URL.Path != path || r.URL.RawQuery != rawQuery {
			t.Errorf("newRequest(path %q, query %q).URL = path %q, query %q, want them unchanged", path, rawQuery, r.URL.Path, r.URL.RawQuery)
		}
		if got := r.Header[http.CanonicalHeaderKey(name)]; len(got) == 0 || got[len(got)-1] != value {
			t.Errorf("newRequest(header %q: %q).Header = %v, want the value kept", name, value, r.Header)
		}
		if c.body == nil && r.ContentLength != int64(len(body)) {
			t.Errorf("newRequest(body of %d bytes).ContentLength = %d, want %d", len(body), r.ContentLength, len(body))
		}
		if c.body != nil && r.ContentLength < -1 {
			t.Errorf("newRequest(body in pieces, header %q: %q).ContentLength = %d, want -1 or more", name, value, r.ContentLength)
		}
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, body) {
			t.Errorf("newRequest(body %q).Body = %q, %v, want the body", body, got, err)
		}
	})
}
