package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/textproto"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// readResponse reads the head of a response to req from br, as
// http.ReadResponse does. A plain response whose head is already buffered
// whole (HTTP/1.1, a status from 200 to 599 but 204 and 304, one
// Content-Length, no Connection, Transfer-Encoding, Trailer or Pragma
// field, no folded line, to a request other than HEAD) is parsed here,
// into one string for the whole head and one array for its values; any
// other goes to http.ReadResponse, which then reads it from the start.
// Either way the response is the same (TestReadResponseAsNetHTTP and
// FuzzReadResponse compare the two).
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	if resp := readPlain(br, req); resp != nil {
		return resp, nil
	}
	return http.ReadResponse(br, req)
}

// readPlain parses a plain response from br's buffer, consuming its head,
// or returns nil having consumed nothing.
func readPlain(br *bufio.Reader, req *http.Request) *http.Response {
	if req.Method == http.MethodHead {
		return nil
	}
	if _, err := br.Peek(1); err != nil {
		return nil // ReadResponse meets the same error
	}
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return nil
	}
	head := string(buf[:end+2]) // every line with its CRLF
	line, rest, _ := strings.Cut(head, "\r\n")
	// "HTTP/1.1 ", three digits, then the end or a space and the reason.
	if len(line) < 12 || line[:9] != "HTTP/1.1 " || (len(line) > 12 && line[12] != ' ') {
		return nil
	}
	code := 0
	for _, c := range []byte(line[9:12]) {
		if c < '0' || c > '9' {
			return nil
		}
		code = code*10 + int(c-'0')
	}
	if code < 200 || code > 599 || code == http.StatusNoContent || code == http.StatusNotModified {
		return nil
	}
	if strings.ContainsAny(line, "\r\n") {
		return nil // a bare CR or LF: ReadResponse reads other lines
	}
	status := line[9:]
	fields := strings.Count(rest, "\r\n")
	h := make(http.Header, fields)
	values := make([]string, fields)
	for rest != "" {
		line, rest, _ = strings.Cut(rest, "\r\n")
		k, v, ok := strings.Cut(line, ":")
		// As ReadMIMEHeader accepts a line without folding: a token for
		// the name, no control character but tab in the value.
		if !ok || !httpguts.ValidHeaderFieldName(k) || !httpguts.ValidHeaderFieldValue(v) {
			return nil
		}
		k = textproto.CanonicalMIMEHeaderKey(k) // k as it is when already canonical
		switch k {
		case "Connection", "Transfer-Encoding", "Trailer", "Pragma":
			return nil
		}
		v = strings.TrimRight(strings.TrimLeft(v, " \t"), " \t")
		if vs := h[k]; vs != nil {
			h[k] = append(vs, v)
			continue
		}
		values[0] = v
		h[k], values = values[:1:1], values[1:]
	}
	cl := h["Content-Length"]
	if len(cl) != 1 || len(cl[0]) == 0 || len(cl[0]) > 18 {
		return nil
	}
	var n int64
	for _, c := range []byte(cl[0]) {
		if c < '0' || c > '9' {
			return nil
		}
		n = n*10 + int64(c-'0')
	}
	resp := &http.Response{Status: status, StatusCode: code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, ContentLength: n, Request: req, Body: http.NoBody}
	if n > 0 {
		resp.Body = &lengthBody{br: br, n: n}
	}
	_, _ = br.Discard(end + 4)
	return resp
}

// lengthBody is the body of a response with a Content-Length, read from
// its connection's buffer as net/http reads it: the end of the stream
// comes with the last byte, one cut short is io.ErrUnexpectedEOF, and a
// read after Close is http.ErrBodyReadAfterClose.
type lengthBody struct {
	br     *bufio.Reader
	n      int64 // bytes left
	closed bool
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.br.Read(p)
	b.n -= int64(n)
	switch {
	case b.n == 0:
		return n, io.EOF
	case err == io.EOF:
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

// Close ends the body; h1's body closes the connection when the body
// was not read to its end.
func (b *lengthBody) Close() error {
	b.closed = true
	return nil
}
