package ingress

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strconv"

	"github.com/plughost/plughost/sdk"
)

// netHTTPErrorHeaders is what net/http's server writes between the status
// line and the body of its answer to a request it could not read.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// Write writes p to the connection, but for net/http's own answers
// (writeOwn) while no handler answers on it.
func (c *prefixConn) Write(p []byte) (int, error) {
	if !c.answering.Load() {
		return writeOwn(c.Conn, p)
	}
	return c.Conn.Write(p)
}

func (c *prefixConn) setAnswering(on bool) { c.answering.Store(on) }

// answerer is a connection that tells net/http's own answers from a
// handler's by whether a handler answers on it (HookServer).
type answerer interface{ setAnswering(bool) }

// writeOwn writes p, something net/http's server writes on conn with no
// handler answering on it, to conn; but for its plain-text answer to a
// request it could not read (a malformed head, one over MaxHeaderBytes,
// an unsupported Transfer-Encoding or protocol version), which it writes
// straight to the connection in one Write before it closes it, and its
// 417 to an Expect other than 100-continue, it writes the platform's
// JSON error, with the same status line, as every other error of the
// host's is. net/http has no hook to change either answer.
func writeOwn(conn net.Conn, p []byte) (int, error) {
	b, ok := ownAnswer(p)
	if !ok {
		return conn.Write(p)
	}
	if _, err := conn.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// HookServer sets what srv needs for its connections to tell net/http's
// own answers from a handler's, when they are connections a Front hands
// over (Front.Listener) or those of a listener with OwnAnswers: srv's
// handler marks a request's connection as answering, and the connection
// is no longer answering once srv makes it idle again. It records each
// request's connection in its context, which streams use too (connKey),
// and keeps srv's own Handler, ConnContext and ConnState. It also closes
// the connection after every request whose framing a proxy in front of
// the host may have read otherwise (closeAfter). Call it before srv
// serves.
func HookServer(srv *http.Server) {
	h, connContext, connState := srv.Handler, srv.ConnContext, srv.ConnState
	if h == nil {
		h = http.DefaultServeMux // as the server would
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(connKey{}).(answerer); ok {
			c.setAnswering(true)
		}
		if closeAfter(r) {
			w.Header().Set("Connection", "close")
		}
		if r.Method == "PRI" && r.ProtoMajor == 2 {
			// HTTP/2's connection preface, which net/http passes on for
			// servers that take h2c; neither listener does.
			w.Header().Set("Connection", "close")
			sdk.WriteError(w, http.StatusHTTPVersionNotSupported, "unsupported_version",
				"HTTP/2 without TLS (h2c) is not served; use HTTP/1.1")
			return
		}
		h.ServeHTTP(w, r)
	})
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if connContext != nil {
			ctx = connContext(ctx, c)
		}
		return context.WithValue(ctx, connKey{}, c)
	}
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if a, ok := c.(answerer); ok && s == http.StateIdle {
			a.setAnswering(false)
		}
		if connState != nil {
			connState(c, s)
		}
	}
}

// closeAfter reports whether the connection must close after r's answer,
// because bytes after r's body may be read as a request here and as part
// of r by another parser (request smuggling, RFC 9112 section 11.2), which
// net/http does not guard against on its own:
//   - r is HTTP/1.0: net/http ignores a Transfer-Encoding of an HTTP/1.0
//     request and reads its body as empty, so a chunked body would be
//     served as the next request; RFC 9112 section 6.1 says such framing
//     is faulty and the connection closes after the answer. net/http
//     removes the header before a handler runs, so every HTTP/1.0
//     request closes its connection, as Envoy refuses HTTP/1.0 by
//     default;
//   - r's body is chunked: net/http reads it by Transfer-Encoding and
//     drops a Content-Length beside it, which a proxy before the host may
//     have framed it by; RFC 9112 section 6.3 says the connection closes
//     after such a request, and the handler cannot tell whether one was
//     there.
func closeAfter(r *http.Request) bool {
	return !r.ProtoAtLeast(1, 1) || len(r.TransferEncoding) > 0
}

// expectationFailed is how net/http's 417 to an Expect other than
// 100-continue starts after its protocol, the request's (HTTP/1.1 or
// HTTP/1.0); it is written with no handler answering.
const expectationFailed = " 417 Expectation Failed\r\n"

// ownAnswer returns the answer to write instead of p, an answer net/http
// writes of its own, when p is its plain-text answer to a request it
// could not read (protocolError) or its 417, and false for anything else.
func ownAnswer(p []byte) ([]byte, bool) {
	for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
		if rest, ok := bytes.CutPrefix(p, []byte(proto)); ok && bytes.HasPrefix(rest, []byte(expectationFailed)) {
			return jsonAnswer(proto, []byte("417 Expectation Failed"), "expectation_failed",
				"the request's Expect is not supported: only 100-continue is"), true
		}
	}
	return protocolError(p)
}

// protocolError returns the answer to write instead of p when p is
// net/http's plain-text answer to a request it could not read, whole, and
// false for anything else. It looks only at the status line unless p
// starts as such an answer does.
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
	return jsonAnswer("HTTP/1.1", status, errCode, msg), true
}

// jsonAnswer is a whole answer that closes the connection: the status line
// of proto and status, and the platform's JSON error of errCode and msg.
func jsonAnswer(proto string, status []byte, errCode, msg string) []byte {
	js := sdk.ErrorBody(errCode, msg, nil)
	b := make([]byte, 0, 128+len(js))
	b = append(b, proto...)
	b = append(b, ' ')
	b = append(b, status...)
	b = append(b, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(js)), 10)
	b = append(b, "\r\nConnection: close\r\n\r\n"...)
	return append(b, js...)
}

// protocolErrorCode returns the platform's error code for a status net/http
// answers a request it could not read with, and the message for when
// net/http gives no reason.
func protocolErrorCode(code int) (errCode, msg string) {
	switch code {
	case http.StatusRequestHeaderFieldsTooLarge:
		return "head_too_large", "the request's head is larger than the server accepts"
	case http.StatusNotImplemented:
		return "unsupported_transfer_encoding", "the request's Transfer-Encoding is not supported"
	case http.StatusHTTPVersionNotSupported:
		return "unsupported_version", "the request's HTTP version is not supported"
	default:
		return "bad_request", "the request's head is malformed"
	}
}
