package h1

import (
	"bufio"
	"bytes"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// writeBoth writes a request of newReq with writeRequest and another
// with Request.Write, and fails unless both give the same bytes, or both
// fail.
func writeBoth(t *testing.T, newReq func() *http.Request) {
	t.Helper()
	var mine, theirs bytes.Buffer
	bw := bufio.NewWriter(&mine)
	_, err := writeRequest(bw, newReq(), nil)
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	werr := newReq().Write(&theirs)
	if (err != nil) != (werr != nil) {
		t.Fatalf("writeRequest error %v, Request.Write error %v; want both or neither", err, werr)
	}
	if err == nil && mine.String() != theirs.String() {
		t.Fatalf("writeRequest wrote\n%q\nRequest.Write wrote\n%q", mine.String(), theirs.String())
	}
}

// TestWriteRequestAsNetHTTP: every request writes as Request.Write would
// write it, those writeRequest writes itself and those it hands over.
func TestWriteRequestAsNetHTTP(t *testing.T) {
	tests := []struct {
		name   string
		method string
		url    string
		host   string
		header http.Header
		body   string
		close  bool
	}{
		{name: "plain GET", method: "GET", url: "http://127.0.0.1:7000/hello/"},
		{name: "empty method", method: "", url: "http://127.0.0.1:7000/"},
		{name: "query and escapes", method: "GET", url: "http://up.example:80/a%20b/c?x=1&y=%2F"},
		{name: "empty path", method: "GET", url: "http://up.example"},
		{name: "headers sorted, several values", method: "GET", url: "http://up/", header: http.Header{
			"X-B": {"2", "3"}, "Accept": {"*/*"}, "X-A": {"1"}, "X-Gateway-Tenant": {"acme"}}},
		{name: "user agent set", method: "GET", url: "http://up/", header: http.Header{"User-Agent": {"curl/8"}}},
		{name: "user agent empty", method: "GET", url: "http://up/", header: http.Header{"User-Agent": {""}}},
		{name: "user agent no values", method: "GET", url: "http://up/", header: http.Header{"User-Agent": nil}},
		{name: "user agent several", method: "GET", url: "http://up/", header: http.Header{"User-Agent": {" a\r\nb ", "c"}}},
		{name: "user agent white space", method: "GET", url: "http://up/", header: http.Header{"User-Agent": {" "}}},
		{name: "values with line breaks and spaces", method: "GET", url: "http://up/", header: http.Header{
			"X-Evil": {"a\r\nInjected: yes", "  padded\t"}, "X-Empty": {""}}},
		{name: "invalid names dropped", method: "GET", url: "http://up/", header: http.Header{
			"Bad Name": {"x"}, "Bad:Name": {"y"}, "": {"z"}, "Good": {"ok"}}},
		{name: "excluded names", method: "GET", url: "http://up/", header: http.Header{
			"Host": {"other"}, "Content-Length": {"9"}, "Transfer-Encoding": {"chunked"}, "Trailer": {"X"}}},
		{name: "non-canonical name", method: "GET", url: "http://up/", header: http.Header{"x-lower": {"v"}}},
		{name: "POST without body", method: "POST", url: "http://up/"},
		{name: "PUT without body", method: "PUT", url: "http://up/"},
		{name: "PATCH without body", method: "PATCH", url: "http://up/"},
		{name: "DELETE without body", method: "DELETE", url: "http://up/"},
		{name: "HEAD", method: "HEAD", url: "http://up/"},
		{name: "Host field", method: "GET", url: "http://up/", host: "front.example:8080"},
		{name: "IPv6 host", method: "GET", url: "http://[::1]:7000/"},
		{name: "IPv6 zone", method: "GET", url: "http://[fe80::1%25eth0]:7000/"},
		{name: "unicode host", method: "GET", url: "http://bücher.example/"},
		{name: "invalid host", method: "GET", url: "http://up/", host: "a b"},
		{name: "control byte in path", method: "GET", url: "http://up/", host: ""},
		{name: "body", method: "POST", url: "http://up/", body: "{}"},
		{name: "close", method: "GET", url: "http://up/", close: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			writeBoth(t, func() *http.Request {
				req, err := http.NewRequest(tt.method, tt.url, nil)
				if tt.body != "" {
					req, err = http.NewRequest(tt.method, tt.url, strings.NewReader(tt.body))
				}
				if err != nil {
					t.Fatal(err)
				}
				if tt.header != nil {
					req.Header = tt.header
				}
				req.Host, req.Close = tt.host, tt.close
				if tt.name == "control byte in path" {
					req.URL.Path = "/a\x01b"
				}
				return req
			})
		})
	}
}

// FuzzWriteRequest: whatever the method, target, host and header,
// writeRequest writes what Request.Write writes.
func FuzzWriteRequest(f *testing.F) {
	f.Add("GET", "/hello/", "x=1", "127.0.0.1:7000", "X-Api-Key", "k", "User-Agent", "ua")
	f.Add("POST", "/a b", "", "up", "x-lower", " v\r\n", "Host", "h")
	f.Add("", "", "%zz", "[::1]:80", "Bad Name", "", "Content-Length", "0")
	f.Fuzz(func(t *testing.T, method, path, query, host, k1, v1, k2, v2 string) {
		writeBoth(t, func() *http.Request {
			return &http.Request{Method: method, URL: &url.URL{Scheme: "http", Host: host, Path: path, RawQuery: query},
				Header: http.Header{k1: {v1}, k2: {v2, v1}}, Host: host, Body: http.NoBody}
		})
	})
}
