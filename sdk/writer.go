package sdk

import (
	"bytes"
	"net/http"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

// bufferedWriter collects a whole response for the unary Handle call.
type bufferedWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
	wrote  bool
}

func newBufferedWriter() *bufferedWriter {
	return &bufferedWriter{header: http.Header{}, status: http.StatusOK}
}

func (w *bufferedWriter) Header() http.Header { return w.header }

func (w *bufferedWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	w.status = code
}

func (w *bufferedWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// reset drops the response; nothing is sent before the handler returns.
func (w *bufferedWriter) reset() bool {
	w.header = http.Header{}
	w.status = http.StatusOK
	w.wrote = false
	w.body.Reset()
	return true
}

// streamChunkSize is the most a streaming response buffers between flushes
// before it sends a chunk anyway, and so the largest chunk it sends.
const streamChunkSize = 32 << 10

// streamWriter sends a response as HTTPResponseChunk messages: the head
// with the first chunk, then one chunk per Flush or per streamChunkSize.
type streamWriter struct {
	stream   pluginv1.Plugin_HandleStreamServer
	header   http.Header
	status   int
	wrote    bool
	sentHead bool
	buf      bytes.Buffer
	err      error // first send error; later writes fail with it
}

func newStreamWriter(s pluginv1.Plugin_HandleStreamServer) *streamWriter {
	return &streamWriter{stream: s, header: http.Header{}, status: http.StatusOK}
}

func (w *streamWriter) Header() http.Header { return w.header }

func (w *streamWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	w.wrote = true
	w.status = code
}

func (w *streamWriter) Write(b []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	w.WriteHeader(http.StatusOK)
	// Split big writes: a chunk must stay well under the host's gRPC
	// message size limit.
	n := 0
	for len(b) > 0 {
		k := min(len(b), streamChunkSize-w.buf.Len())
		w.buf.Write(b[:k])
		b = b[k:]
		n += k
		if w.buf.Len() >= streamChunkSize {
			w.send()
			if w.err != nil {
				return n, w.err
			}
		}
	}
	return n, nil
}

// Flush sends what is buffered, so the caller sees it now.
func (w *streamWriter) Flush() {
	w.WriteHeader(http.StatusOK)
	w.send()
}

// reset drops the response unless its head has been sent.
func (w *streamWriter) reset() bool {
	if w.sentHead {
		return false
	}
	w.header = http.Header{}
	w.status = http.StatusOK
	w.wrote = false
	w.buf.Reset()
	return true
}

func (w *streamWriter) send() {
	if w.err != nil || (w.sentHead && w.buf.Len() == 0) {
		return
	}
	// A copy: gRPC may hold a sent message (stats handlers, retries) after
	// Send returns, and the buffer is reused.
	c := &pluginv1.HTTPResponseChunk{Data: bytes.Clone(w.buf.Bytes())}
	if !w.sentHead {
		c.Status = int32(w.status)
		c.Headers = wire.HeadersToProto(w.header)
	}
	w.err = w.stream.Send(c)
	w.sentHead = true
	w.buf.Reset()
}

func (w *streamWriter) finish() error {
	w.WriteHeader(http.StatusOK)
	w.send()
	return w.err
}
