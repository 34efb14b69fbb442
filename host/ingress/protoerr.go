package ingress

import (
	"bytes"
	"net/http"
	"strconv"

	"github.com/plughost/plughost/sdk"
)

// netHTTPErrorHeaders is what net/http's server writes between the status
// line and the body of its answer to a request it could not read.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// Write writes p to the connection, except net/http's answer to a request
// it could not read: a malformed head, one over MaxHeaderBytes, an
// unsupported Transfer-Encoding or protocol version. net/http writes that
// answer in plain text, straight to the connection in one Write, before it
// closes the connection, and has no hook to change it; every other answer
// the host gives is the platform's JSON error, so the connection writes
// that instead, with the same status line.
func (c *prefixConn) Write(p []byte) (int, error) {
	if b, ok := protocolError(p); ok {
		if _, err := c.Conn.Write(b); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// protocolError returns the answer to write instead of p when p is
// net/http's plain-text answer to a request it could not read, whole, and
// false for anything else. It looks only at the status line unless p
// starts as such an answer does, so an ordinary write costs a few
// comparisons.
func protocolError(p []byte) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(p, []byte("HTTP/1.1 "))
	if !ok {
		return nil, false
	}
	end := bytes.IndexByte(rest, '\r')
	if end < len("400 ") || end > 128 || !bytes.HasPrefix(rest[end:], []byte(netHTTPErrorHeaders)) {
		return nil, false
	}
	status, body := rest[:end], rest[end+len(netHTTPErrorHeaders):]
	code, err := strconv.Atoi(string(status[:3]))
	if err != nil || code < 400 || code > 599 || status[3] != ' ' {
		return nil, false
	}
	text := http.StatusText(code)
	detail, ok := bytes.CutPrefix(status[4:], []byte(text))
	if !ok || text == "" {
		return nil, false
	}
	// net/http repeats the status line as the body, but for an unsupported
	// Transfer-Encoding.
	if !bytes.Equal(body, status) && !(code == http.StatusNotImplemented && len(detail) == 0 && string(body) == "Unsupported transfer encoding") {
		return nil, false
	}
	var msg string
	if d, ok := bytes.CutPrefix(detail, []byte(": ")); ok && len(d) > 0 {
		msg = string(d)
	} else if len(detail) > 0 {
		return nil, false
	}
	errCode, def := protocolErrorCode(code)
	if msg == "" {
		msg = def
	}
	js := sdk.ErrorBody(errCode, msg, nil)
	b := make([]byte, 0, 128+len(js))
	b = append(b, "HTTP/1.1 "...)
	b = append(b, status...) // net/http's status line, its reason included
	b = append(b, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(js)), 10)
	b = append(b, "\r\nConnection: close\r\n\r\n"...)
	return append(b, js...), true
}

// protocolErrorCode returns the platform's error code for a status net/http
// answers a request it could not read with, and the message for when
// net/http gives no reason.
func protocolErrorCode(code int) (errCode, msg string) {
	switch code {
	case http.StatusRequestHeaderFieldsTooLarge:
		return "head_too_large", "the request's head is larger than the ingress accepts"
	case http.StatusNotImplemented:
		return "unsupported_transfer_encoding", "the request's Transfer-Encoding is not supported"
	case http.StatusHTTPVersionNotSupported:
		return "unsupported_version", "the request's HTTP version is not supported"
	default:
		return "bad_request", "the request's head is malformed"
	}
}
