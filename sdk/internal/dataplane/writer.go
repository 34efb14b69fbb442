package dataplane

import (
	"bytes"
	"errors"
	"net/http"
	"sync"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

// errBroken is what writes fail with once a frame could not be sent.
var errBroken = errors.New("data-plane connection is broken")

// writer is the handler's http.ResponseWriter. On an ordinary route it
// collects the whole response and sends it once the handler returns, so a
// panic can still replace it with a 500 and the host can set
// Content-Length. On a streaming route it sends the head and what is
// buffered on each Flush, and a piece whenever a piece's worth has
// accumulated. Either way the body goes out in pieces of at most
// wire.PieceBytes (or the request's window, if smaller), each within the
// request's credit (call.spend).
type writer struct {
	s *server
	c *call

	header      http.Header
	status      int
	wroteHeader bool
	buf         bytes.Buffer // the body not yet sent
	// small is buf's first storage: a small response takes no
	// allocation for its body. A larger one takes a buffer from
	// bodyPool, pooled, which release returns.
	small    [128]byte
	pooled   *[]byte
	sentHead bool
	err      error // the first send failure; later writes fail with it
	refused  bool  // Refuse was called: no handler ran
}

// headFrame is the messages of a response's head, with those of its
// headers if they are few: taken from headFrames to send a head, and
// given back cleared, since an encoded frame keeps none of them.
type headFrame struct {
	f  pluginv1.Frame
	k  pluginv1.Frame_Response
	r  pluginv1.ResponseHead
	h  pluginv1.HTTPResponse
	hm wire.HeaderMessages
}

var headFrames = sync.Pool{New: func() any { return new(headFrame) }}

// Refuser is implemented by the http.ResponseWriter Serve hands its
// Handler. Refuse, called instead of writing anything, answers the host
// with an Abort marked refused: no handler ran for the request, so the
// host may send it to another instance of the plugin. The sdk package
// refuses the requests that arrive once a drain has begun.
type Refuser interface {
	Refuse()
}

// Refuse implements Refuser.
func (w *writer) Refuse() { w.refused = true }

func (w *writer) Header() http.Header { return w.header }

// WriteHeader sets the answer's status once. An interim status (1xx but
// 101) is dropped, and the next call sets the final one, as net/http's
// writer sends it ahead of the final answer: the host relays whole
// answers and sends no interim ones. A 101 is kept, and the host answers
// it 502, since it switches no protocols.
func (w *writer) WriteHeader(code int) {
	if w.wroteHeader || code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		return
	}
	w.wroteHeader = true
	w.status = code
}

func (w *writer) Write(b []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	w.WriteHeader(http.StatusOK)
	w.room(len(b))
	if !w.c.streaming {
		return w.buf.Write(b)
	}
	n := 0
	for len(b) > 0 {
		k := min(len(b), w.c.piece-w.buf.Len())
		w.buf.Write(b[:k])
		b, n = b[k:], n+k
		if w.buf.Len() >= w.c.piece {
			if err := w.flush(false); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// bodyPool holds the buffers of response bodies larger than a writer's
// small: up to a window's worth each, so that the buffer of every
// response that fits the window is reused rather than left to the
// collector.
var bodyPool = sync.Pool{New: func() any {
	b := make([]byte, 0, 16<<10)
	return &b
}}

// room moves the body to a buffer from bodyPool the first time it would
// outgrow small by n bytes.
func (w *writer) room(n int) {
	if w.pooled != nil || w.buf.Available() >= n {
		return
	}
	w.pooled = bodyPool.Get().(*[]byte)
	w.buf = *bytes.NewBuffer(append((*w.pooled)[:0], w.buf.Bytes()...))
}

// release returns the body's buffer to bodyPool once the response has
// been sent or given up: frames hold no part of it after Send.
func (w *writer) release() {
	if w.pooled == nil {
		return
	}
	w.buf.Reset()
	if b := w.buf.Bytes(); cap(b) <= wire.ResponseWindow {
		*w.pooled = b
		bodyPool.Put(w.pooled)
	}
	w.pooled = nil
	w.buf = bytes.Buffer{}
}

// Flush sends the head and what is buffered on a streaming route; on an
// ordinary route the response goes whole when the handler returns.
func (w *writer) Flush() {
	w.WriteHeader(http.StatusOK)
	if w.c.streaming {
		_ = w.flush(false)
	}
}

// reset drops the response written so far and reports whether it could:
// once the head has been sent, it cannot.
func (w *writer) reset() bool {
	if w.sentHead {
		return false
	}
	w.header = http.Header{}
	w.status = http.StatusOK
	w.wroteHeader = false
	w.buf.Reset()
	return true
}

// finish sends the rest of the response once the handler has returned. A
// request whose context has ended is left unanswered when nothing of it
// was sent: its caller has given up.
func (w *writer) finish() {
	if !w.sentHead && w.c.ctx.Err() != nil {
		return
	}
	w.WriteHeader(http.StatusOK)
	if w.err == nil {
		_ = w.flush(true)
	}
}

// abort ends the response unfinished: the host answers 503 if it had no
// head yet, or cuts the response off.
func (w *writer) abort() {
	if !w.sentHead && w.c.ctx.Err() != nil {
		return
	}
	w.s.send(&pluginv1.Frame{Id: w.c.id, Kind: &pluginv1.Frame_Abort{Abort: &pluginv1.Abort{}}})
}

// refuse answers a refused request (Refuse), unless its caller has given
// up.
func (w *writer) refuse() {
	if w.c.ctx.Err() != nil {
		return
	}
	w.s.send(&pluginv1.Frame{Id: w.c.id, Kind: &pluginv1.Frame_Abort{Abort: &pluginv1.Abort{Refused: true}}})
}

// flush sends the head if it has not gone yet and the buffered body, in
// pieces; end marks the last of the response.
func (w *writer) flush(end bool) error {
	if w.err != nil {
		return w.err
	}
	body := w.buf.Bytes()
	if w.sentHead && len(body) == 0 && !end {
		return nil
	}
	if !w.sentHead {
		piece := body[:min(len(body), w.c.piece)]
		more := !end || len(piece) < len(body)
		hf := headFrames.Get().(*headFrame)
		hf.h.Status, hf.h.Headers, hf.h.Body = int32(w.status), hf.hm.Convert(w.header), piece
		hf.r.Response, hf.r.More = &hf.h, more
		if end && more {
			hf.r.Size = int64(len(body))
		}
		hf.k.Response = &hf.r
		hf.f.Id, hf.f.Kind = w.c.id, &hf.k
		err := w.sendPiece(&hf.f, len(piece))
		*hf = headFrame{}
		headFrames.Put(hf)
		if err != nil {
			return err
		}
		w.sentHead = true
		body = body[len(piece):]
		if !more {
			w.buf.Reset()
			return nil
		}
	}
	for len(body) > 0 || end {
		piece := body[:min(len(body), w.c.piece)]
		body = body[len(piece):]
		last := end && len(body) == 0
		// sendPiece returns once the frame is in the connection's
		// write buffer or on the socket, so the buffer may be reused.
		f := &pluginv1.Frame{Id: w.c.id, Kind: &pluginv1.Frame_Body{Body: &pluginv1.Body{Data: piece, End: last}}}
		if err := w.sendPiece(f, len(piece)); err != nil {
			return err
		}
		if last {
			break
		}
	}
	w.buf.Reset()
	return nil
}

// sendPiece spends n bytes of credit and sends f, which carries them.
func (w *writer) sendPiece(f *pluginv1.Frame, n int) error {
	if err := w.c.ctx.Err(); err != nil {
		// The host gave up on the request: stop producing for it.
		w.err = err
		return err
	}
	if err := w.c.spend(int64(n)); err != nil {
		w.err = err
		return err
	}
	if !w.s.sendFrom(f, w.c.onReader) {
		w.err = errBroken
		return w.err
	}
	return nil
}
