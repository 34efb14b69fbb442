package ingress

import (
	"bufio"
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// heads are request heads of every kind the front must tell apart: the
// first ones it serves itself, the rest it leaves to net/http.
var heads = []struct {
	head   string
	direct bool
}{
	{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", true},
	{"GET /hello/?x=1&y=%20 HTTP/1.1\r\nHost: a:80\r\nUser-Agent: u\r\nAccept: */*\r\n\r\n", true},
	{"HEAD /x HTTP/1.1\r\nhost: a\r\nx-two: 1\r\nX-Two: 2\r\n\r\n", true},
	{"GET /a%2Fb HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", true},
	{"GET / HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive\r\nPragma: no-cache\r\n\r\n", true},
	{"GET / HTTP/1.1\r\nHost:\r\nX-Empty:\r\nX-Pad:   v  \t\r\n\r\n", true},
	{"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /next HTTP/1.1\r\n", true},
	{"GET / HTTP/1.1\r\nHost: a\r\nX-Obs: \x80\xff\r\n\r\n", true},

	{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx", false},
	{"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\r\nConnection: close, x-hop\r\n\r\n", false},
	{"GET / HTTP/1.0\r\nHost: a\r\n\r\n", false},
	{"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", false},
	{"GET * HTTP/1.1\r\nHost: a\r\n\r\n", false},
	{"GET / HTTP/1.1\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", false},
	{"GET / HTTP/1.1\nHost: a\n\n", false},
	{"GET / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\rX: y\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n z\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\r\nX : y\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", false},
	{"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", false},
	{"GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n", false},
	{"get / HTTP/1.1\r\nHost: a\r\n\r\n", false},
	{"DELETE / HTTP/1.1\r\nHost: a\r\n\r\n", false},
	{"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", false},
	{"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", false},
	{"GET / HTTP/1.1\r\nHost: a\r\n", false},
}

// TestParseHead checks which heads the front serves, and that it reads
// each of those exactly as net/http's server does.
func TestParseHead(t *testing.T) {
	for _, tc := range heads {
		r, n, ok := parseHead([]byte(tc.head))
		if ok != tc.direct {
			t.Errorf("parseHead(%q) ok = %v, want %v", tc.head, ok, tc.direct)
			continue
		}
		if ok {
			if want := strings.Index(tc.head, "\r\n\r\n") + 4; n != want {
				t.Errorf("parseHead(%q) n = %d, want %d", tc.head, n, want)
			}
			sameAsNetHTTP(t, []byte(tc.head), r)
		}
	}
}

// sameAsNetHTTP fails t unless net/http reads head as r.
func sameAsNetHTTP(t *testing.T, head []byte, r directRequest) {
	t.Helper()
	want, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		t.Fatalf("parseHead accepted %q, which net/http refuses: %v", head, err)
	}
	// The server side of net/http promotes Host to Request.Host and
	// leaves it out of the header, as the front does.
	delete(want.Header, "Host")
	got := struct {
		Method, URL, RequestURI, Host string
		Header                        http.Header
		Close                         bool
	}{r.method, r.url.String(), r.target, r.host, r.header, r.close}
	exp := struct {
		Method, URL, RequestURI, Host string
		Header                        http.Header
		Close                         bool
	}{want.Method, want.URL.String(), want.RequestURI, want.Host, want.Header, want.Close}
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("parseHead(%q) = %+v; net/http reads %+v", head, got, exp)
	}
	if r.url.Path != want.URL.Path || r.url.RawPath != want.URL.RawPath || r.url.RawQuery != want.URL.RawQuery {
		t.Fatalf("parseHead(%q) URL = %#v; net/http reads %#v", head, r.url, want.URL)
	}
}

// FuzzParseHead checks, for any bytes, that a head the front serves is
// one net/http reads the same way, and that plainStart never turns away
// the start of a head parseHead would serve.
func FuzzParseHead(f *testing.F) {
	for _, tc := range heads {
		f.Add([]byte(tc.head))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, n, ok := parseHead(b)
		if !ok {
			return
		}
		if n > len(b) || !bytes.HasSuffix(b[:n], crlf2) {
			t.Fatalf("parseHead(%q) n = %d", b, n)
		}
		sameAsNetHTTP(t, b[:n], r)
		for i := range n - 3 {
			if !plainStart(b[:i]) {
				t.Fatalf("plainStart(%q) = false, but %q is a head the front serves", b[:i], b[:n])
			}
		}
	})
}
