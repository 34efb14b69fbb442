package sdk

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// FuzzNewRequest checks that no request from the host, however malformed,
// panics newRequest, and that a request it accepts keeps the path, query and
// body it was given.
func FuzzNewRequest(f *testing.F) {
	f.Add("GET", "/", "", "Accept", "*/*", []byte(nil))
	f.Add("POST", "/items/42", "a=1&b=two%20words", "content-type", "application/json", []byte(`{"x":1}`))
	f.Add("", "", "", "", "", []byte(nil))
	f.Add("BAD METHOD", "/x", "", "X", "y", []byte("body"))
	f.Add("GET", "//evil.example/path", "q=%zz", "Host", "other", []byte(nil))
	f.Add("GET", "a:b/c", "#frag", "x\x00y", "v\r\nInjected: 1", []byte{0xff})
	f.Add("PUT", "/files/a b/\u00fc/%2F", "\x7f\x00", "", "", []byte("payload"))
	f.Fuzz(func(t *testing.T, method, path, rawQuery, name, value string, body []byte) {
		req := &pluginv1.HTTPRequest{
			Method:   method,
			Path:     path,
			RawQuery: rawQuery,
			Headers:  []*pluginv1.Header{{Name: name, Values: []string{value}}},
			Body:     body,
		}
		r, err := newRequest(t.Context(), req)
		if err != nil {
			return
		}
		if r.URL.Path != path || r.URL.RawQuery != rawQuery {
			t.Errorf("newRequest(path %q, query %q).URL = path %q, query %q, want them unchanged", path, rawQuery, r.URL.Path, r.URL.RawQuery)
		}
		if got := r.Header[http.CanonicalHeaderKey(name)]; len(got) == 0 || got[len(got)-1] != value {
			t.Errorf("newRequest(header %q: %q).Header = %v, want the value kept", name, value, r.Header)
		}
		if r.ContentLength != int64(len(body)) {
			t.Errorf("newRequest(body of %d bytes).ContentLength = %d, want %d", len(body), r.ContentLength, len(body))
		}
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, body) {
			t.Errorf("newRequest(body %q).Body = %q, %v, want the body", body, got, err)
		}
	})
}
