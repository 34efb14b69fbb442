package ingress

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// Bounds of the discard after an early answer, as nginx's lingering
// close: a client that sends its whole body before it reads (and most do,
// net/http's client among them when the body is large) sees a
// connection reset instead of the answer when the host closes with its
// body still arriving, because the reset throws away what the client's
// kernel had received. The bounds keep an attacker from holding the
// connection open with an endless body.
const (
	lingerTime  = 5 * time.Second
	lingerBytes = 64 << 20
)

// firstBodyBuffer is the buffer a body starts in when it may be larger.
// The buffer grows bodyGrowth times as bytes arrive, so memory follows
// what the client has sent (within a factor of bodyGrowth), not the
// length it claims; the factor is large so that the buffers a body
// leaves behind, garbage for the collector, come to a fraction of it.
const (
	firstBodyBuffer = 4 << 10
	bodyGrowth      = 8
)

// errBodyBudget is the error of a body that would take a plugin's
// request bodies past their share of memory (bodyBudget).
var errBodyBudget = errors.New("request bodies to this plugin hold their memory limit")

// bodyBudget counts the bytes of buffer that one plugin's request bodies
// hold in the host, from their first byte until their request ends, so
// that bodies still arriving, which hold no in-flight slot, are bounded
// too. Its zero value is empty.
type bodyBudget struct{ used atomic.Int64 }

// take reserves n bytes under bound (none when bound <= 0) and reports
// whether they fit.
func (b *bodyBudget) take(n, bound int64) bool {
	if used := b.used.Add(n); bound > 0 && used > bound {
		b.used.Add(-n)
		return false
	}
	return true
}

// give returns n bytes taken with take.
func (b *bodyBudget) give(n int64) { b.used.Add(-n) }

// receiveBody reads r's body, at most limit bytes, in a buffer whose
// capacity it takes from budget (up to bound), and returns the body
// and the bytes taken, which the caller gives back when the request
// ends. The read fails with an *http.MaxBytesError past limit, with
// errBodyBudget when budget has no room, and with an error that
// matches os.ErrDeadlineExceeded when the body has not arrived by the
// connection's read deadline.
func receiveBody(w http.ResponseWriter, r *http.Request, limit int64, budget *bodyBudget, bound int64) (body []byte, taken int64, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		// Most requests have no body.
		return nil, 0, nil
	}
	want := r.ContentLength // net/http stops the body there
	if want < 0 || want > limit {
		want = limit
	}
	src := http.MaxBytesReader(w, r.Body, limit)
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			if int64(cap(buf)) >= want {
				// Full: only the end, or a chunked body past the limit,
				// can follow.
				var one [1]byte
				n, err := src.Read(one[:])
				switch {
				case err == io.EOF:
					return buf, taken, nil
				case err != nil:
					return nil, taken, err
				case n > 0:
					return nil, taken, &http.MaxBytesError{Limit: limit}
				}
				continue
			}
			size := min(max(firstBodyBuffer, bodyGrowth*int64(cap(buf))), want)
			// The old buffer is garbage once copied: count the growth.
			if !budget.take(size-int64(cap(buf)), bound) {
				return nil, taken, errBodyBudget
			}
			taken += size - int64(cap(buf))
			next := make([]byte, len(buf), size)
			copy(next, buf)
			buf = next
		}
		n, err := src.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, taken, nil
		}
		if err != nil {
			return nil, taken, err
		}
	}
}

// trackedBody is a request body that records how its reads ended, so that
// the ingress knows whether body bytes may still be arriving after it
// answered.
type trackedBody struct {
	io.ReadCloser
	done bool // the body ended, or broke: nothing left worth reading
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done = true
	}
	return n, err
}

// earlyAnswer is the ResponseWriter of a request with a body. An error
// answer written before the body was read to its end closes the
// connection (Connection: close): net/http then sends it at once, where
// it would otherwise first read up to 256 KiB of the body, which a slow
// client may take its whole read deadline to send; linger then reads what
// is left, bounded.
type earlyAnswer struct {
	http.ResponseWriter
	body  *trackedBody
	wrote bool
}

func (w *earlyAnswer) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		if code >= 400 && !w.body.done {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *earlyAnswer) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap is for http.ResponseController.
func (w *earlyAnswer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// linger sends the answer written so far and then reads and discards
// what is left of body, for at most lingerTime and lingerBytes, so that a
// client still sending receives the answer rather than a reset. net/http
// closes the connection afterwards unless the body ended.
func linger(w http.ResponseWriter, body io.Reader) {
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	_ = rc.SetReadDeadline(time.Now().Add(lingerTime))
	_, _ = io.CopyN(io.Discard, body, lingerBytes)
}
