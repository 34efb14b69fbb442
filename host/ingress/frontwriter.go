package ingress

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// frontBodyBuffer is how much of an answer of unknown length the front
// holds to give it a Content-Length; beyond it the answer is sent chunked,
// as net/http sends one of more than its 2 KiB.
const frontBodyBuffer = 2 << 10

// sniffLen is how much of a body http.DetectContentType looks at.
const sniffLen = 512

// frontFlushAt is how much of an answer the front holds before it writes:
// a small answer goes out in one write, head and body together.
const frontFlushAt = 32 << 10

// frontWriter is the http.ResponseWriter of a request the front serves.
// It writes what net/http's would for the same calls: the same status
// line, headers (sorted, values with CR and LF made spaces, invalid names
// left out, those a status must not carry dropped), Date, Content-Length
// or chunked framing, sniffed Content-Type, and the body, which a HEAD
// request's answer leaves out. It keeps no slice a handler passes it.
type frontWriter struct {
	c      *frontConn
	head   bool // a HEAD request: the body is counted, not sent
	header http.Header

	code    int   // 0 until WriteHeader
	cl      int64 // the Content-Length the handler set, -1 if none
	written int64 // body bytes the handler wrote
	fields  []byte
	body    []byte // held until the head goes out
	sent    bool   // the head went out
	chunked bool
	// What the headers said at WriteHeader, as net/http snapshots them.
	hasDate, hasType, encoded bool
	closeAfter                bool
	// handlerClose: the handler's own header says Connection: close.
	handlerClose bool
	err          error
}

func (w *frontWriter) Header() http.Header { return w.header }

// dropSet is a set of the headers the front may leave out of the
// handler's.
type dropSet uint8

const (
	dropLength dropSet = 1 << iota // Content-Length
	dropTE                         // Transfer-Encoding: the front frames the answer
	dropType                       // Content-Type
	dropConn                       // Connection
)

func (d dropSet) has(key string) bool {
	switch key {
	case "Content-Length":
		return d&dropLength != 0
	case "Transfer-Encoding":
		return d&dropTE != 0
	case "Content-Type":
		return d&dropType != 0
	case "Connection":
		return d&dropConn != 0
	}
	return false
}

// WriteHeader snapshots the headers as net/http does: later changes to
// the map are not sent.
func (w *frontWriter) WriteHeader(code int) {
	if w.code != 0 {
		return
	}
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// An informational answer goes out at once, before the final one.
		if w.sent || w.err != nil {
			return
		}
		out := appendStatus(w.c.out[:0], code)
		out = appendFields(out, w.header, dropTE|dropLength)
		w.writeOut(append(out, "\r\n"...))
		return
	}
	w.code = code
	_, w.hasDate = w.header["Date"]
	_, w.hasType = w.header["Content-Type"]
	w.encoded = w.header.Get("Content-Encoding") != ""
	// As net/http: no Content-Length or Transfer-Encoding on an answer
	// that has no body (RFC 9110 section 8.6), nor Content-Type on a 304
	// (section 15.4.5).
	drop := dropTE
	switch {
	case code == http.StatusNotModified:
		drop |= dropLength | dropType
	case !bodyAllowed(code):
		drop |= dropLength
	default:
		if v := w.header.Get("Content-Length"); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				w.cl = n
			} else {
				w.c.f.opts.Logger.Warn("invalid Content-Length in an answer; leaving it out", "value", v)
				drop |= dropLength
			}
		}
	}
	// As net/http: a handler's Connection: close is sent as it is; the
	// front's own reasons to close replace the handler's Connection.
	if w.handlerClose = hasToken(w.header["Connection"], "close"); w.handlerClose {
		w.closeAfter = true
	} else if w.closeAfter || w.c.f.draining.Load() {
		w.closeAfter = true
		drop |= dropConn
	}
	w.fields = appendFields(w.fields[:0], w.header, drop)
}

func (w *frontWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !bodyAllowed(w.code) {
		return 0, http.ErrBodyNotAllowed
	}
	w.written += int64(len(p))
	if w.cl >= 0 && w.written > w.cl {
		return 0, http.ErrContentLength
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.head {
		// Kept only to sniff its Content-Type from, as net/http does.
		if n := sniffLen - len(w.body); n > 0 {
			w.body = append(w.body, p[:min(n, len(p))]...)
		}
		return len(p), nil
	}
	switch {
	case !w.sent && len(w.body)+len(p) < frontFlushAt:
		w.body = append(w.body, p...)
		if w.cl < 0 && len(w.body) > frontBodyBuffer {
			w.sendHead(false, nil)
		}
	case !w.sent:
		w.sendHead(false, p)
	default:
		w.writeBody(nil, p)
	}
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// Flush sends what is held; the answer is then chunked unless its length
// is known.
func (w *frontWriter) Flush() {
	_ = w.FlushError()
}

// FlushError is Flush, for http.ResponseController.
func (w *frontWriter) FlushError() error {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sent {
		w.sendHead(false, nil)
	}
	return w.err
}

// SetWriteDeadline is for http.ResponseController.
func (w *frontWriter) SetWriteDeadline(t time.Time) error {
	return w.c.rwc.SetWriteDeadline(t)
}

// SetReadDeadline is for http.ResponseController.
func (w *frontWriter) SetReadDeadline(t time.Time) error {
	return w.c.rwc.SetReadDeadline(t)
}

// finish sends the rest of the answer once the handler has returned, and
// reports whether the connection is still usable.
func (w *frontWriter) finish() bool {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sent {
		w.sendHead(true, nil)
	} else if w.chunked && w.err == nil {
		w.writeOut(append(w.c.out[:0], "0\r\n\r\n"...))
	}
	if w.cl >= 0 && w.written != w.cl && !w.head {
		// The answer is shorter than it said: the client cannot tell
		// where the next one would begin.
		return false
	}
	return w.err == nil
}

// sendHead writes the head with the body held and then tail: done says
// the handler has returned, so that a body of unknown length is all
// there is.
func (w *frontWriter) sendHead(done bool, tail []byte) {
	w.sent = true
	out := appendStatus(w.c.out[:0], w.code)
	out = append(out, w.fields...)
	if !w.hasDate {
		out = append(out, w.c.f.dateHeader(time.Now())...)
	}
	allowed := bodyAllowed(w.code)
	switch {
	case w.cl >= 0 || !allowed:
	case done && (!w.head || w.written > 0 && w.written <= frontBodyBuffer):
		// As net/http: the whole body is known, so is its length.
		out = append(out, "Content-Length: "...)
		out = strconv.AppendInt(out, w.written, 10)
		out = append(out, "\r\n"...)
	case !done && !w.head:
		w.chunked = true
	}
	sniff := w.body
	if len(sniff) == 0 {
		sniff = tail
	}
	if !w.hasType && allowed && w.code != http.StatusNotModified && len(sniff) > 0 && !w.encoded {
		out = append(out, "Content-Type: "...)
		out = append(out, http.DetectContentType(sniff)...)
		out = append(out, "\r\n"...)
	}
	if w.closeAfter && !w.handlerClose {
		out = append(out, "Connection: close\r\n"...)
	}
	if w.chunked {
		out = append(out, "Transfer-Encoding: chunked\r\n"...)
	}
	out = append(out, "\r\n"...)
	if w.head {
		w.body = w.body[:0]
		w.writeOut(out)
		return
	}
	body := w.body
	w.body = w.body[:0]
	if len(body) > 0 {
		// The head's buffer takes the held body, framed as a chunk if the
		// answer is chunked.
		out = w.appendChunk(out, body)
		if done && w.chunked && tail == nil {
			out = append(out, "0\r\n\r\n"...)
			w.chunked = false
		}
	}
	w.writeBody(out, tail)
}

// appendChunk appends p to out, framed as a chunk if the answer is
// chunked.
func (w *frontWriter) appendChunk(out, p []byte) []byte {
	if !w.chunked {
		return append(out, p...)
	}
	out = strconv.AppendInt(out, int64(len(p)), 16)
	out = append(out, "\r\n"...)
	out = append(out, p...)
	return append(out, "\r\n"...)
}

// writeBody writes out (built in the connection's buffer, possibly empty)
// and then p, the handler's, framed as a chunk if the answer is chunked,
// without copying p.
func (w *frontWriter) writeBody(out, p []byte) {
	if len(p) == 0 {
		w.writeOut(out)
		return
	}
	if w.chunked {
		out = strconv.AppendInt(out, int64(len(p)), 16)
		out = append(out, "\r\n"...)
	}
	if w.err != nil {
		return
	}
	bufs := net.Buffers{out, p}
	if w.chunked {
		bufs = append(bufs, crlf2[:2])
	}
	_, w.err = bufs.WriteTo(w.c.rwc)
	w.keep(out)
}

// writeOut writes out, which was built in the connection's buffer, and
// keeps that buffer for the next answer.
func (w *frontWriter) writeOut(out []byte) {
	if w.err != nil || len(out) == 0 {
		return
	}
	_, w.err = w.c.rwc.Write(out)
	w.keep(out)
}

// keep keeps out, built in the connection's buffer, for the next answer,
// unless it has grown past what an idle connection should hold.
func (w *frontWriter) keep(out []byte) {
	if cap(out) <= frontKeep {
		w.c.out = out[:0]
	} else {
		w.c.out = nil
	}
}

// frontKeep is the most of each of its buffers a connection keeps between
// requests.
const frontKeep = 4 << 10

// frontKeepHeaders is the most header names of an answer whose map a
// connection keeps for the next.
const frontKeepHeaders = 8

// appendStatus appends the status line of code.
func appendStatus(b []byte, code int) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	if text := http.StatusText(code); text != "" {
		return append(append(b, text...), "\r\n"...)
	}
	b = append(b, "status code "...)
	b = strconv.AppendInt(b, int64(code), 10)
	return append(b, "\r\n"...)
}

// appendFields appends the header lines of h but those in drop, as
// net/http's Header.Write does: keys sorted, invalid names left out,
// values with CR and LF made spaces and trimmed.
func appendFields(b []byte, h http.Header, drop dropSet) []byte {
	keys := make([]string, 0, len(h))
	for k := range h {
		if !drop.has(k) && httpguts.ValidHeaderFieldName(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range h[k] {
			if strings.ContainsAny(v, "\r\n") {
				v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
			}
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, strings.Trim(v, " \t")...)
			b = append(b, "\r\n"...)
		}
	}
	return b
}

// bodyAllowed reports whether an answer of this status may have a body.
func bodyAllowed(code int) bool {
	return !(code >= 100 && code <= 199 || code == http.StatusNoContent || code == http.StatusNotModified)
}

// hasToken reports whether a comma-separated header holds token.
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for opt := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(opt), token) {
				return true
			}
		}
	}
	return false
}
