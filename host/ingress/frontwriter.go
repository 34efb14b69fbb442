package ingress

import (
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
// left out), Date, Content-Length or chunked framing, sniffed
// Content-Type, and the body, which a HEAD request's answer leaves out.
type frontWriter struct {
	c      *frontConn
	head   bool // a HEAD request: the body is counted, not sent
	header http.Header

	code       int   // 0 until WriteHeader
	cl         int64 // the Content-Length the handler set, -1 if none
	written    int64 // body bytes the handler wrote
	fields     []byte
	body       []byte // held until the head goes out
	sent       bool   // the head went out
	chunked    bool
	closeAfter bool
	// handlerClose: the handler's own header says Connection: close.
	handlerClose bool
	deadline     bool // the handler set the write deadline
	err          error
}

func (w *frontWriter) Header() http.Header { return w.header }

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
		out = appendFields(out, w.header, nil)
		out = append(out, "\r\n"...)
		w.write(out)
		return
	}
	w.code = code
	if v := w.header.Get("Content-Length"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			w.cl = n
		} else {
			w.c.f.opts.Logger.Warn("invalid Content-Length in an answer; leaving it out", "value", v)
			w.header.Del("Content-Length")
		}
	}
	if !bodyAllowed(code) {
		w.header.Del("Transfer-Encoding")
		w.header.Del("Content-Length")
		w.cl = -1
	}
	// As net/http: a handler's Connection: close is sent as it is; the
	// front's own reasons to close replace the handler's Connection.
	exclude := frontOwnHeaders
	if w.handlerClose = hasToken(w.header["Connection"], "close"); w.handlerClose {
		w.closeAfter = true
		exclude = frontTE
	} else if w.closeAfter || w.c.f.draining.Load() {
		w.closeAfter = true
	} else {
		exclude = frontTE
	}
	w.fields = appendFields(w.fields[:0], w.header, exclude)
}

// frontOwnHeaders are the handler's headers the front writes itself, and
// frontTE the one it always does.
var (
	frontOwnHeaders = map[string]bool{"Connection": true, "Transfer-Encoding": true}
	frontTE         = map[string]bool{"Transfer-Encoding": true}
)

func (w *frontWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
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
	case !w.sent:
		w.body = append(w.body, p...)
		if w.cl < 0 && len(w.body) > frontBodyBuffer || len(w.body) >= frontFlushAt {
			w.sendHead(false)
		}
	case w.chunked:
		if len(p) > 0 {
			out := strconv.AppendInt(w.c.out[:0], int64(len(p)), 16)
			out = append(out, "\r\n"...)
			out = append(out, p...)
			out = append(out, "\r\n"...)
			w.write(out)
		}
	default:
		w.write(p)
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
		w.sendHead(false)
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
		w.sendHead(true)
	} else if w.chunked && w.err == nil {
		w.write(append(w.c.out[:0], "0\r\n\r\n"...))
	}
	if w.cl >= 0 && w.written != w.cl && !w.head {
		// The answer is shorter than it said: the client cannot tell
		// where the next one would begin.
		return false
	}
	return w.err == nil
}

// sendHead writes the head with what body is held: done says the handler
// has returned, so that a body of unknown length is all there is.
func (w *frontWriter) sendHead(done bool) {
	w.sent = true
	out := appendStatus(w.c.out[:0], w.code)
	out = append(out, w.fields...)
	if _, ok := w.header["Date"]; !ok {
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
	if _, ok := w.header["Content-Type"]; !ok && allowed && len(w.body) > 0 && w.header.Get("Content-Encoding") == "" {
		out = append(out, "Content-Type: "...)
		out = append(out, http.DetectContentType(w.body)...)
		out = append(out, "\r\n"...)
	}
	if w.closeAfter && !w.handlerClose {
		out = append(out, "Connection: close\r\n"...)
	}
	if w.chunked {
		out = append(out, "Transfer-Encoding: chunked\r\n"...)
	}
	out = append(out, "\r\n"...)
	switch {
	case len(w.body) == 0 || w.head:
	case w.chunked:
		out = strconv.AppendInt(out, int64(len(w.body)), 16)
		out = append(out, "\r\n"...)
		out = append(out, w.body...)
		out = append(out, "\r\n"...)
		if done {
			out = append(out, "0\r\n\r\n"...)
			w.chunked = false
		}
	default:
		out = append(out, w.body...)
	}
	w.body = w.body[:0]
	w.write(out)
}

// write writes b to the connection, and keeps the buffer for the next
// answer.
func (w *frontWriter) write(b []byte) {
	if w.err != nil {
		return
	}
	_, w.err = w.c.rwc.Write(b)
	if cap(b) <= frontFlushAt*2 {
		w.c.out = b[:0]
	}
}

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

// appendFields appends the header lines of h but those in exclude, as
// net/http's Header.Write does: keys sorted, invalid names left out,
// values with CR and LF made spaces and trimmed.
func appendFields(b []byte, h http.Header, exclude map[string]bool) []byte {
	keys := make([]string, 0, len(h))
	for k := range h {
		if !exclude[k] && httpguts.ValidHeaderFieldName(k) {
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
