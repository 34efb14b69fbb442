package bus

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
)

// ErrFraming is returned by Writer.Event for an event name or id holding
// a line break, which would end the field early and let the rest be read
// as fields of its own.
var ErrFraming = errors.New("bus: event name or id holds a line break")

// Writer writes one response as server-sent events. Create it with
// NewWriter; it is for the handler's goroutine only.
type Writer struct {
	w io.Writer
	f http.Flusher
}

// NewWriter sends the head of an event stream: status 200 with
// Content-Type: text/event-stream and Cache-Control: no-store, flushed,
// so that the client knows at once that it is subscribed. Declare the
// route sdk.Streaming(), or the flush sends nothing.
func NewWriter(w http.ResponseWriter) *Writer {
	f, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	sw := &Writer{w: w, f: f}
	sw.Flush()
	return sw
}

// Event writes one event: "event: name", "id: id" unless id is empty,
// one "data:" line per line of data (ended by CR, LF or CRLF), and the blank line that ends it. It
// does not flush, so that a caller sending several events flushes once.
// An error means the client is gone, or ErrFraming.
func (w *Writer) Event(name, id string, data []byte) error {
	if strings.ContainsAny(name, "\r\n") || strings.ContainsAny(id, "\r\n") {
		return ErrFraming
	}
	var b bytes.Buffer
	b.Grow(len(name) + len(id) + len(data) + 24)
	b.WriteString("event: ")
	b.WriteString(name)
	b.WriteByte('\n')
	if id != "" {
		b.WriteString("id: ")
		b.WriteString(id)
		b.WriteByte('\n')
	}
	for {
		// CR, LF and CRLF each end a line for the client.
		i := bytes.IndexAny(data, "\r\n")
		b.WriteString("data: ")
		if i < 0 {
			b.Write(data)
			b.WriteByte('\n')
			break
		}
		b.Write(data[:i])
		b.WriteByte('\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	b.WriteByte('\n')
	_, err := w.w.Write(b.Bytes())
	return err
}

// Flush sends what was written.
func (w *Writer) Flush() {
	if w.f != nil {
		w.f.Flush()
	}
}
