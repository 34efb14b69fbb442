package dataplane_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"

	host "github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/sdk/internal/dataplane"
	"github.com/plughost/plughost/sdk/wire"
)

// whereHandler reads the body, answers where it ran ("reader" or
// "worker") and the body's length in headers, and writes respLen bytes.
func whereHandler(respLen int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		where := "worker"
		if dataplane.RunsInline(w) {
			where = "reader"
		}
		w.Header().Set("X-Where", where)
		w.Header().Set("X-Body-Len", strconv.FormatInt(n, 10))
		_, _ = w.Write(pattern(respLen))
	})
}

// TestInline checks where a request runs: an inline route's on the
// connection's reader, unless more of its body is still to come or it
// streams; any other route's on a worker.
func TestInline(t *testing.T) {
	inline := func(pattern string) bool { return pattern == "POST /inline" }
	tests := []struct {
		name      string
		pattern   string
		body      int
		streaming bool
		want      string
	}{
		{"inline route", "POST /inline", 100, false, "reader"},
		{"inline route, a body of a whole piece", "POST /inline", wire.PieceBytes, false, "reader"},
		{"inline route, a body in two frames", "POST /inline", wire.PieceBytes + 1, false, "worker"},
		{"inline route, streaming", "POST /inline", 0, true, "worker"},
		{"another route", "POST /other", 100, false, "worker"},
	}
	p := servePlaneInline(t, whereHandler(10), inline)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A deadline, so that a handler run on the reader while its
			// body is still to come fails rather than hangs.
			ctx, cancel := context.WithTimeout(t.Context(), waitTime)
			defer cancel()
			r, err := p.do(ctx, &host.Request{Method: "POST", Path: "/", Pattern: tt.pattern, Streaming: tt.streaming,
				Body: [][]byte{pattern(tt.body)}})
			if err != nil || r.status != http.StatusOK {
				t.Fatalf("do = %v; want 200", err)
			}
			if got := r.header.Get("X-Where"); got != tt.want {
				t.Errorf("handler ran on the %s, want the %s", got, tt.want)
			}
			if got := r.header.Get("X-Body-Len"); got != strconv.Itoa(tt.body) {
				t.Errorf("handler read %s bytes of body, want %d", got, tt.body)
			}
			if !bytes.Equal(r.body(), pattern(10)) {
				t.Errorf("response body has %d bytes, want the 10 written", len(r.body()))
			}
		})
	}
}

// TestInlineOverWindow checks that an inline handler's response larger
// than the response window, whose credit comes in Window frames only the
// reader reads, is sent whole by a worker while the reader goes on
// reading, and that the connection serves on.
func TestInlineOverWindow(t *testing.T) {
	const big = wire.ResponseWindow + wire.PieceBytes + 5
	bigH, smallH := whereHandler(big), whereHandler(10)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			bigH.ServeHTTP(w, r)
			return
		}
		smallH.ServeHTTP(w, r)
	})
	p := servePlaneInline(t, h, func(string) bool { return true })
	ctx, cancel := context.WithTimeout(t.Context(), waitTime)
	defer cancel()
	r, err := p.do(ctx, &host.Request{Method: "GET", Path: "/big", Pattern: "GET /big"})
	if err != nil {
		t.Fatalf("a response of %d bytes from an inline route: %v, want it whole", big, err)
	}
	if r.status != http.StatusOK || r.header.Get("X-Where") != "reader" || !bytes.Equal(r.body(), pattern(big)) {
		t.Errorf("the large response = %d (handler on the %s) with %d bytes, want 200 from the reader with the %d written",
			r.status, r.header.Get("X-Where"), len(r.body()), big)
	}
	// The reader is free again.
	r, err = p.do(t.Context(), &host.Request{Method: "GET", Path: "/small", Pattern: "GET /small"})
	if err != nil {
		t.Fatalf("the next request: %v, want 200", err)
	}
	if r.status != http.StatusOK || r.header.Get("X-Where") != "reader" {
		t.Errorf("the next request = %d on the %q, want 200 on the reader", r.status, r.header.Get("X-Where"))
	}
}
