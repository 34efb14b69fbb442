package ingress_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
)

// BenchmarkPath sends GET / through the whole in-process request path:
// the ingress (route match, limits, metrics), the host's data plane, a
// socket pair, the SDK's data plane and mux, and a handler that answers
// as plugins/hello's greet does, then back. Client HTTP is left out, so
// allocs/op and B/op are the path's own, host and plugin side together;
// the benchmark's -memprofile splits them by function.
func BenchmarkPath(b *testing.B) {
	mux := sdk.NewMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"greeting": "hello"})
	})
	h := plugintest.New(b, sdk.Plugin{Name: "hello", Version: "0.1.0", Routes: mux}, plugintest.Options{})
	// What a client such as wrk or curl sends, as net/http's server
	// parses it.
	req, err := http.NewRequestWithContext(b.Context(), http.MethodGet, "/", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Host = "127.0.0.1:8080"
	req.RemoteAddr = "127.0.0.1:40000"
	req.RequestURI = "/"
	req.Header.Set("User-Agent", "curl/8.5.0")
	req.Header.Set("Accept", "*/*")
	w := &discardWriter{header: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.header)
		w.code, w.n = 0, 0
		h.ServeHTTP(w, req)
		if w.code != http.StatusOK || w.n != len(`{"greeting":"hello"}`+"\n") {
			b.Fatalf("GET / = %d with %d bytes, want 200 with %d", w.code, w.n, len(`{"greeting":"hello"}`+"\n"))
		}
	}
}

// discardWriter is a ResponseWriter that keeps the status and counts the
// body, allocating nothing per request.
type discardWriter struct {
	header http.Header
	code   int
	n      int
}

func (w *discardWriter) Header() http.Header { return w.header }
func (w *discardWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *discardWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.n += len(p)
	return len(p), nil
}

// BenchmarkPathBody is BenchmarkPath for a POST whose body and answer are
// 14 KiB each, the size of a mailbox batch of ten 1 KiB messages.
func BenchmarkPathBody(b *testing.B) {
	const size = 14 << 10
	answer := bytes.Repeat([]byte("a"), size)
	mux := sdk.NewMux()
	mux.HandleFunc("POST /{$}", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		if n != size {
			http.Error(w, "short body", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	})
	h := plugintest.New(b, sdk.Plugin{Name: "hello", Version: "0.1.0", Routes: mux}, plugintest.Options{})
	body := bytes.Repeat([]byte("b"), size)
	w := &discardWriter{header: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		req, err := http.NewRequestWithContext(b.Context(), http.MethodPost, "/", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Host, req.RemoteAddr, req.RequestURI = "127.0.0.1:8080", "127.0.0.1:40000", "/"
		clear(w.header)
		w.code, w.n = 0, 0
		h.ServeHTTP(w, req)
		if w.code != http.StatusOK || w.n != size {
			b.Fatalf("POST / = %d with %d bytes, want 200 with %d", w.code, w.n, size)
		}
	}
}
