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
	{"GET /a? HTTP/1.1\r\nHost: a\r\n\r\n", true},
	{"GET /a?? HTTP/1.1\r\nHost: a\r\n\r\n", true},
	{"GET /a?b?c#d HTTP/1.1\r\nHost: a\r\n\r\n", true},
	{"GET //a/./b~_-.c HTTP/1.1\r\nHost: a\r\n\r\n", true},
	{"GET /a;b,c:d@e$f&g+h=i!j*k'l(m)n HTTP/1.1\r\nHost: a\r\n\r\n", true},
	{"GET /a{b}|c^d`e\"f<g>h\\i#j HTTP/1.1\r\nHost: a\r\n\r\n", true},

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
	// A connection's space, used by each head in turn as a connection's is.
	var sp headSpace
	for _, tc := range heads {
		parseTwice(t, []byte(tc.head), &sp)
		r, n, ok := parseHead([]byte(tc.head), &sp)
		if ok != tc.direct {
			sp.reset()
			t.Errorf("parseHead(%q) ok = %v, want %v", tc.head, ok, tc.direct)
			continue
		}
		if ok {
			if want := strings.Index(tc.head, "\r\n\r\n") + 4; n != want {
				t.Errorf("parseHead(%q) n = %d, want %d", tc.head, n, want)
			}
			sameAsNetHTTP(t, []byte(tc.head), r)
		}
		sp.reset()
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
	if *r.url != *want.URL {
		t.Fatalf("parseHead(%q) URL = %#v; net/http reads %#v", head, r.url, want.URL)
	}
}

// parseTwice fails t unless parseHead reads b the same with a
// connection's used space, sp, as with none.
func parseTwice(t *testing.T, b []byte, sp *headSpace) {
	t.Helper()
	r1, n1, ok1 := parseHead(b, nil)
	r2, n2, ok2 := parseHead(b, sp)
	defer sp.reset()
	if ok1 != ok2 || n1 != n2 {
		t.Fatalf("parseHead(%q) = n %d, ok %v without space; n %d, ok %v with it", b, n1, ok1, n2, ok2)
	}
	if !ok1 {
		return
	}
	if *r1.url != *r2.url || !reflect.DeepEqual(r1.header, r2.header) || r1.method != r2.method ||
		r1.target != r2.target || r1.host != r2.host || r1.close != r2.close {
		t.Fatalf("parseHead(%q) = %+v (URL %#v) without space; %+v (URL %#v) with it", b, r1, r1.url, r2, r2.url)
	}
}

// FuzzParseHead checks, for any bytes, that a head the front serves is
// one net/http reads the same way, and that plainStart never turns away
// the start of a head parseHead would serve.
func FuzzParseHead(f *testing.F) {
	for _, tc := range heads {
		f.Add([]byte(tc.head))
	}
	var sp headSpace
	f.Fuzz(func(t *testing.T, b []byte) {
		parseTwice(t, b, &sp)
		r, n, ok := parseHead(b, &sp)
		defer sp.reset()
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

// TestPlainStart: a partial head stays with the front only while it can
// still become one the front serves; a whole request line not of
// HTTP/1.1 goes to net/http at once.
func TestPlainStart(t *testing.T) {
	for _, tt := range []struct {
		b    string
		want bool
	}{
		{"GE", true},
		{"GET /x HTT", true},
		{"GET /x HTTP/1.1\r", true},
		{"GET /x HTTP/1.1\r\nHost: a\r\n", true},
		{"HEAD /x HTTP/1.1\r\n", true},
		{"GET /x\r\n", false},
		{"GET /x HTTP/1.0\r\n", false},
		{"GET /x HTTP/2.0\r\nHost: a", false},
		{"POST /x HTTP/1.1\r\n", false},
		{"GET /x HTTP/1.1\n", false},
	} {
		if got := plainStart([]byte(tt.b)); got != tt.want {
			t.Errorf("plainStart(%q) = %t, want %t", tt.b, got, tt.want)
		}
	}
}
