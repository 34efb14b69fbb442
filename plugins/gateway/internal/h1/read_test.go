package h1

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// readBoth reads input as the answer to a request of method, with
// readResponse and with http.ReadResponse, each from its own reader, and
// fails unless both give the same response, body and what is left after
// the body, or both fail. It returns whether readPlain parsed it.
func readBoth(t *testing.T, method, input string) bool {
	t.Helper()
	req := &http.Request{Method: method}
	mineR, theirsR := bufio.NewReader(strings.NewReader(input)), bufio.NewReader(strings.NewReader(input))
	plain := readPlain(bufio.NewReader(strings.NewReader(input)), req) != nil
	mine, err := readResponse(mineR, req)
	theirs, terr := http.ReadResponse(theirsR, req)
	if (err != nil) != (terr != nil) {
		t.Fatalf("readResponse(%q) error %v, ReadResponse error %v; want both or neither", input, err, terr)
	}
	if err != nil {
		return plain
	}
	mineBody, mineErr := io.ReadAll(mine.Body)
	theirsBody, theirsErr := io.ReadAll(theirs.Body)
	if string(mineBody) != string(theirsBody) || !errors.Is(mineErr, theirsErr) && (mineErr == nil || theirsErr == nil || mineErr.Error() != theirsErr.Error()) {
		t.Fatalf("readResponse(%q) body %q, %v; ReadResponse body %q, %v", input, mineBody, mineErr, theirsBody, theirsErr)
	}
	mineRest, _ := io.ReadAll(mineR)
	theirsRest, _ := io.ReadAll(theirsR)
	if string(mineRest) != string(theirsRest) {
		t.Fatalf("readResponse(%q) left %q, ReadResponse left %q", input, mineRest, theirsRest)
	}
	mine.Body, theirs.Body = nil, nil
	if !reflect.DeepEqual(mine, theirs) {
		t.Fatalf("readResponse(%q) =\n%+v\nReadResponse =\n%+v", input, mine, theirs)
	}
	return plain
}

// TestReadResponseAsNetHTTP: every answer reads as http.ReadResponse
// reads it, those readPlain parses and those it hands over.
func TestReadResponseAsNetHTTP(t *testing.T) {
	tests := []struct {
		name   string
		method string
		input  string
		plain  bool // readPlain parses it
	}{
		{name: "plain", input: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDate: Fri, 27 Nov 2026 08:00:00 GMT\r\nContent-Length: 20\r\n\r\n{\"greeting\":\"hello\"}\nNEXT", plain: true},
		{name: "no reason", input: "HTTP/1.1 404\r\nContent-Length: 2\r\n\r\nno", plain: true},
		{name: "empty body", input: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nNEXT", plain: true},
		{name: "leading zeros", input: "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 002\r\n\r\nabc", plain: true},
		{name: "repeated and odd fields", input: "HTTP/1.1 200 OK\r\nx-lower: 1\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Tab:\t v \t\r\nX-Empty:\r\nX-Obs: caf\xc3\xa9\r\nContent-Length: 1\r\n\r\nx", plain: true},
		{name: "short body", input: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", plain: true},
		{name: "connection close", input: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"},
		{name: "chunked", input: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"},
		{name: "trailer", input: "HTTP/1.1 200 OK\r\nTrailer: X\r\nContent-Length: 2\r\n\r\nok"},
		{name: "pragma", input: "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 2\r\n\r\nok"},
		{name: "no length", input: "HTTP/1.1 200 OK\r\n\r\nuntil close"},
		{name: "two lengths", input: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"},
		{name: "length with sign", input: "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok"},
		{name: "HTTP/1.0", input: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		{name: "no content", input: "HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n"},
		{name: "not modified", input: "HTTP/1.1 304 Not Modified\r\n\r\n"},
		{name: "informational first", input: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		{name: "HEAD", method: "HEAD", input: "HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n"},
		{name: "folded line", input: "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\nok"},
		{name: "space before colon", input: "HTTP/1.1 200 OK\r\nX-A : 1\r\nContent-Length: 2\r\n\r\nok"},
		{name: "bare LF", input: "HTTP/1.1 200 OK\nContent-Length: 2\n\nok"},
		{name: "bare LF in a field", input: "HTTP/1.1 200 OK\r\nX-A: 1\nX-B: 2\r\nContent-Length: 2\r\n\r\nok"},
		{name: "control byte", input: "HTTP/1.1 200 OK\r\nX-A: \x01\r\nContent-Length: 2\r\n\r\nok"},
		{name: "no colon", input: "HTTP/1.1 200 OK\r\nX-A\r\nContent-Length: 2\r\n\r\nok"},
		{name: "bad status", input: "HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok"},
		{name: "status too long", input: "HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok"},
		{name: "head cut short", input: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"},
		{name: "empty", input: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := tt.method
			if method == "" {
				method = http.MethodGet
			}
			if plain := readBoth(t, method, tt.input); plain != tt.plain {
				t.Errorf("readPlain parsed it: %v, want %v", plain, tt.plain)
			}
		})
	}
}

// TestLengthBodyReadAfterClose: a body closed before its end reads no
// more of its connection's buffer, as net/http's does not.
func TestLengthBodyReadAfterClose(t *testing.T) {
	br := bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcdNEXT"))
	resp, err := readResponse(br, &http.Request{Method: http.MethodGet})
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 2)
	if n, err := resp.Body.Read(p); n != 2 || err != nil {
		t.Fatalf("Read = %d, %v, want 2, nil", n, err)
	}
	resp.Body.Close()
	if n, err := resp.Body.Read(p); n != 0 || !errors.Is(err, http.ErrBodyReadAfterClose) {
		t.Errorf("Read after Close = %d, %v, want 0, %v", n, err, http.ErrBodyReadAfterClose)
	}
}

// FuzzReadResponse: whatever the upstream answers, readResponse reads
// what http.ReadResponse reads.
func FuzzReadResponse(f *testing.F) {
	f.Add(false, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
	f.Add(false, "HTTP/1.1 404\r\nx-a: 1\r\nX-A:  2 \r\nContent-Length: 0\r\n\r\n")
	f.Add(true, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
	f.Add(false, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 9\r\n\r\nshort")
	f.Fuzz(func(t *testing.T, head bool, input string) {
		method := http.MethodGet
		if head {
			method = http.MethodHead
		}
		readBoth(t, method, input)
	})
}
