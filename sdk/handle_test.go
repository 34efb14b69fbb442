package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/sdk/internal/wiretest"
	"github.com/plughost/plughost/sdk/wire"
)

func TestHandleRequest(t *testing.T) {
	tests := []struct {
		name string
		req  *dataplane.Request
		want echo
	}{
		{
			name: "post with body, query and headers",
			req: &dataplane.Request{
				Method:   "POST",
				Path:     "/items/42",
				RawQuery: "a=1&b=two%20words&a=3",
				// Names as the host may send them: the plugin
				// canonicalises them.
				Header: http.Header{
					"content-type": {"application/json"},
					"X-Multi":      {"1", "2"},
				},
				Body:       [][]byte{[]byte(`{"x":1}`)},
				RemoteAddr: "203.0.113.7:5555",
				Host:       "example.com",
				Pattern:    "POST /items/{id}",
				RequestID:  "req-1",
			},
			want: echo{
				Method:        "POST",
				Path:          "/items/42",
				RawQuery:      "a=1&b=two%20words&a=3",
				RequestURI:    "/items/42?a=1&b=two%20words&a=3",
				Query:         map[string][]string{"a": {"1", "3"}, "b": {"two words"}},
				Header:        http.Header{"Content-Type": {"application/json"}, "X-Multi": {"1", "2"}},
				Body:          `{"x":1}`,
				ContentLength: 7,
				RemoteAddr:    "203.0.113.7:5555",
				Host:          "example.com",
			},
		},
		{
			name: "get without body",
			req:  &dataplane.Request{Method: "GET", Path: "/", RemoteAddr: "[::1]:1"},
			want: echo{
				Method:     "GET",
				Path:       "/",
				RequestURI: "/",
				Query:      map[string][]string{},
				Header:     http.Header{},
				NoBody:     true,
				RemoteAddr: "[::1]:1",
			},
		},
		{
			name: "path needing escapes",
			req:  &dataplane.Request{Method: "DELETE", Path: "/files/a b/ü"},
			want: echo{
				Method:     "DELETE",
				Path:       "/files/a b/ü",
				RequestURI: "/files/a%20b/%C3%BC",
				Query:      map[string][]string{},
				Header:     http.Header{},
				NoBody:     true,
			},
		},
		{
			// Over a piece: the body comes in pieces, and without a
			// Content-Length header its length is unknown.
			name: "body in pieces",
			req:  &dataplane.Request{Method: "PUT", Path: "/blob", Body: [][]byte{bytes.Repeat([]byte("x"), wire.PieceBytes+1)}},
			want: echo{
				Method:        "PUT",
				Path:          "/blob",
				RequestURI:    "/blob",
				Query:         map[string][]string{},
				Header:        http.Header{},
				Body:          strings.Repeat("x", wire.PieceBytes+1),
				ContentLength: -1,
			},
		},
	}
	tp := startPlugin(t, pluginWith(echoHandler()))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := tp.handle(t.Context(), tt.req)
			if err != nil {
				t.Fatalf("handle(%s %s) = %v", tt.req.Method, tt.req.Path, err)
			}
			if resp.status != http.StatusCreated {
				t.Errorf("handle(%s %s).status = %d, want %d; body %q", tt.req.Method, tt.req.Path, resp.status, http.StatusCreated, resp.body)
			}
			wantHeader := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}}
			if diff := cmp.Diff(wantHeader, resp.header); diff != "" {
				t.Errorf("handle(%s %s) headers mismatch (-want +got):\n%s", tt.req.Method, tt.req.Path, diff)
			}
			var got echo
			if err := json.Unmarshal(resp.body, &got); err != nil {
				t.Fatalf("handle(%s %s).body = %q, not JSON: %v", tt.req.Method, tt.req.Path, resp.body, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("request seen by the handler mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHandleBadRequest(t *testing.T) {
	tp := startPlugin(t, pluginWith(echoHandler()))
	resp, err := tp.handle(t.Context(), &dataplane.Request{Method: "BAD METHOD", Path: "/"})
	if err != nil {
		t.Fatalf("handle(BAD METHOD) = %v", err)
	}
	if resp.status != http.StatusBadRequest {
		t.Errorf("handle(BAD METHOD).status = %d, want %d", resp.status, http.StatusBadRequest)
	}
	if got := decodeError(t, resp.body).Error.Code; got != "bad_request" {
		t.Errorf("handle(BAD METHOD) error code = %q, want %q", got, "bad_request")
	}
}

func TestHandleResponse(t *testing.T) {
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		wantStatus int
		wantHeader http.Header
		wantBody   string
	}{
		{
			name:       "nothing written",
			handler:    func(http.ResponseWriter, *http.Request) {},
			wantStatus: 200,
			wantHeader: http.Header{},
		},
		{
			name:       "status only",
			handler:    func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) },
			wantStatus: 204,
			wantHeader: http.Header{},
		},
		{
			name:       "body without WriteHeader",
			handler:    func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello") },
			wantStatus: 200,
			wantHeader: http.Header{},
			wantBody:   "hello",
		},
		{
			name: "second WriteHeader ignored",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusAccepted)
				w.WriteHeader(http.StatusTeapot)
				io.WriteString(w, "a")
				io.WriteString(w, "b")
			},
			wantStatus: 202,
			wantHeader: http.Header{},
			wantBody:   "ab",
		},
		{
			name: "headers",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Location", "/items/7")
				w.Header().Add("Vary", "Accept")
				w.Header().Add("Vary", "Origin")
				w.WriteHeader(http.StatusSeeOther)
			},
			wantStatus: 303,
			wantHeader: http.Header{"Location": {"/items/7"}, "Vary": {"Accept", "Origin"}},
		},
		{
			name:       "http.Error",
			handler:    func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "nope", http.StatusForbidden) },
			wantStatus: 403,
			wantHeader: http.Header{"Content-Type": {"text/plain; charset=utf-8"}, "X-Content-Type-Options": {"nosniff"}},
			wantBody:   "nope\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := startPlugin(t, pluginWith(tt.handler))
			resp, err := tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
			if err != nil {
				t.Fatalf("handle() = %v", err)
			}
			if resp.status != tt.wantStatus {
				t.Errorf("handle().status = %d, want %d", resp.status, tt.wantStatus)
			}
			if diff := cmp.Diff(tt.wantHeader, resp.header); diff != "" {
				t.Errorf("handle() headers mismatch (-want +got):\n%s", diff)
			}
			if string(resp.body) != tt.wantBody {
				t.Errorf("handle().body = %q, want %q", resp.body, tt.wantBody)
			}
		})
	}
}

func TestHandleDeadline(t *testing.T) {
	const noDeadline = "none"
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		if !ok {
			io.WriteString(w, noDeadline)
			return
		}
		io.WriteString(w, dl.Format(time.RFC3339Nano))
	})
	tp := startPlugin(t, pluginWith(h))

	t.Run("caller deadline", func(t *testing.T) {
		want := time.Now().Add(30 * time.Second)
		ctx, cancel := context.WithDeadline(t.Context(), want)
		defer cancel()
		resp, err := tp.handle(ctx, &dataplane.Request{Method: "GET", Path: "/"})
		if err != nil {
			t.Fatalf("handle() = %v", err)
		}
		got, err := time.Parse(time.RFC3339Nano, string(resp.body))
		if err != nil {
			t.Fatalf("handler saw deadline %q, want %v", resp.body, want)
		}
		// The deadline travels as a time, to the nanosecond: host and
		// plugin share a clock.
		if !got.Equal(want) {
			t.Errorf("r.Context().Deadline() = %v, want %v", got, want)
		}
	})
	t.Run("no deadline", func(t *testing.T) {
		resp, err := tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
		if err != nil {
			t.Fatalf("handle() = %v", err)
		}
		if got := string(resp.body); got != noDeadline {
			t.Errorf("r.Context().Deadline() = %s, want no deadline", got)
		}
	})
}

func TestHandleCancel(t *testing.T) {
	started := make(chan struct{})
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		ended <- r.Context().Err()
	})
	tp := startPlugin(t, pluginWith(h))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c := tp.goHandle(ctx, &dataplane.Request{Method: "GET", Path: "/"})
	waitFor(t, started, "the handler to start")
	cancel()
	if _, err := c.wait(t); !errors.Is(err, context.Canceled) {
		t.Errorf("handle() after cancel = %v, want %v", err, context.Canceled)
	}
	if err := waitFor(t, ended, "the handler to see the cancellation"); !errors.Is(err, context.Canceled) {
		t.Errorf("r.Context().Err() = %v, want %v", err, context.Canceled)
	}
}

func TestHandlePanic(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
	}{
		{
			name:    "before writing",
			handler: func(http.ResponseWriter, *http.Request) { panic("boom") },
		},
		{
			name: "after setting headers",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Encoding", "gzip")
				w.Header().Set("X-Partial", "yes")
				panic("boom")
			},
		},
		{
			// Nothing has left the plugin yet, so the handler's head and
			// half a body are replaced, not sent as if complete.
			name: "after writing the head and some body",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Partial", "yes")
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, "partial")
				panic(fmt.Errorf("boom"))
			},
		},
		{
			// An ordinary route's response goes whole when the handler
			// returns: Flush sends nothing, so it can still be replaced.
			name: "after flushing",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Partial", "yes")
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic("boom")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.Handle("/panic", tt.handler)
			mux.Handle("/ok", okHandler())
			tp := startPlugin(t, pluginWith(mux))

			resp, err := tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/panic", RequestID: "req-9"})
			if err != nil {
				t.Fatalf("handle(/panic) = %v, want a 500 response", err)
			}
			if resp.status != http.StatusInternalServerError {
				t.Errorf("handle(/panic).status = %d, want %d", resp.status, http.StatusInternalServerError)
			}
			wantHeader := http.Header{"Content-Type": {"application/json"}}
			if diff := cmp.Diff(wantHeader, resp.header); diff != "" {
				t.Errorf("handle(/panic) headers mismatch (-want +got):\n%s", diff)
			}
			if got := decodeError(t, resp.body).Error.Code; got != "internal" {
				t.Errorf("handle(/panic) error code = %q, want %q; body %q", got, "internal", resp.body)
			}

			recs := tp.logs.records(t, "handler panicked")
			if len(recs) != 1 {
				t.Fatalf("log has %d %q records, want 1; log:\n%s", len(recs), "handler panicked", tp.logs)
			}
			rec := recs[0]
			if rec["@level"] != "error" || rec["panic"] != "boom" || rec["path"] != "/panic" || rec["request_id"] != "req-9" {
				t.Errorf("panic log record = %v, want level error, panic boom, path /panic, request_id req-9", rec)
			}
			if stack, _ := rec["stack"].(string); !strings.Contains(stack, "handle_test.go") {
				t.Errorf("panic log stack = %q, want the handler's stack", stack)
			}

			resp, err = tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/ok"})
			if err != nil || resp.status != http.StatusOK || string(resp.body) != "ok" {
				t.Errorf("handle(/ok) after a panic = %v, %v, want 200 ok", resp, err)
			}
		})
	}
}

func TestHandleAbort(t *testing.T) {
	tp := startPlugin(t, pluginWith(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "half")
		panic(http.ErrAbortHandler)
	})))
	if _, err := tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/"}); !errors.Is(err, dataplane.ErrAborted) {
		t.Errorf("handle() of a handler that panics with http.ErrAbortHandler = %v, want %v", err, dataplane.ErrAborted)
	}
	if recs := tp.logs.records(t, "handler panicked"); len(recs) != 0 {
		t.Errorf("log has %d %q records for http.ErrAbortHandler, want 0", len(recs), "handler panicked")
	}
}

func TestHandleStreamFlush(t *testing.T) {
	flushed := wiretest.NewGate(t)
	finished := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(finished)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		flushed.Wait(r) // the client must see "first" before we go on
		io.WriteString(w, "second\n")
		w.(http.Flusher).Flush()
		io.WriteString(w, "third\n")
	})
	p := pluginWith(h)
	p.Routes = muxWith(func(m *Mux) { m.Handle("/events", h, Streaming()) })
	tp := startPlugin(t, p)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := tp.data.RoundTrip(ctx, &dataplane.Request{Method: "GET", Path: "/events", Streaming: true})
	if err != nil {
		t.Fatalf("RoundTrip() = %v", err)
	}
	defer resp.Close()
	first, err := resp.Next()
	if err != nil {
		t.Fatalf("first Next() = %v, want the flushed piece", err)
	}
	select {
	case <-finished:
		t.Fatal("handler finished before the client got the first piece")
	default:
	}
	if resp.Status != http.StatusAccepted || string(first) != "first\n" {
		t.Errorf("first piece = status %d data %q, want status %d data %q", resp.Status, first, http.StatusAccepted, "first\n")
	}
	if diff := cmp.Diff(http.Header{"Content-Type": {"text/event-stream"}}, resp.Header); diff != "" {
		t.Errorf("headers mismatch (-want +got):\n%s", diff)
	}
	flushed.Open()

	rest, err := readPieces(resp)
	if err != nil {
		t.Fatalf("Next() = %v, want the rest of the stream", err)
	}
	var data []string
	for _, b := range rest {
		data = append(data, string(b))
	}
	if diff := cmp.Diff([]string{"second\n", "third\n"}, data); diff != "" {
		t.Errorf("pieces after the first mismatch (-want +got):\n%s", diff)
	}
	waitFor(t, finished, "the handler to finish")
}

func TestHandleStreamPieces(t *testing.T) {
	const piece = wire.PieceBytes
	tests := []struct {
		name      string
		streaming bool
		write     func(w io.Writer, data []byte)
		size      int
		// wantPieces is how many pieces Next returns; wantSize is
		// Response.Size, -1 when unknown.
		wantPieces int
		wantSize   int64
	}{
		{"empty", true, func(io.Writer, []byte) {}, 0, 0, 0},
		{"small", true, func(w io.Writer, b []byte) { w.Write(b) }, 100, 1, 100},
		// A full buffer is sent at once, so the end adds no piece.
		{"one write of exactly a piece", true, func(w io.Writer, b []byte) { w.Write(b) }, piece, 1, -1},
		{"one big write", true, func(w io.Writer, b []byte) { w.Write(b) }, 100 << 10, 2, -1},
		{"many small writes", true, func(w io.Writer, b []byte) {
			for len(b) > 0 {
				n := min(len(b), 1000)
				w.Write(b[:n])
				b = b[n:]
			}
		}, 100 << 10, 2, -1},
		// Beyond the response window: the handler waits for credit as
		// the client reads.
		{"one write beyond the window", true, func(w io.Writer, b []byte) { w.Write(b) }, 4<<20 + 1, 4<<20/piece + 1, -1},
		// An ordinary route sends the whole response when the handler
		// returns, in pieces, with its length.
		{"ordinary route, many small writes", false, func(w io.Writer, b []byte) {
			for len(b) > 0 {
				n := min(len(b), 1000)
				w.Write(b[:n])
				w.(http.Flusher).Flush()
				b = b[n:]
			}
		}, 100 << 10, 2, 100 << 10},
		{"ordinary route beyond the window", false, func(w io.Writer, b []byte) { w.Write(b) }, 4<<20 + 1, 4<<20/piece + 1, 4<<20 + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := bytes.Repeat([]byte("0123456789abcdef"), tt.size/16+1)[:tt.size]
			h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/octet-stream")
				tt.write(w, data)
			})
			p := pluginWith(h)
			opts := []RouteOption{}
			if tt.streaming {
				opts = append(opts, Streaming())
			}
			p.Routes = muxWith(func(m *Mux) { m.Handle("/", h, opts...) })
			tp := startPlugin(t, p)
			resp, pieces, err := tp.handleStream(t.Context(), &dataplane.Request{Method: "GET", Path: "/", Streaming: tt.streaming})
			if err != nil {
				t.Fatalf("handleStream() = %v after %d pieces", err, len(pieces))
			}
			if resp.Status != http.StatusOK || resp.Header.Get("Content-Type") != "application/octet-stream" {
				t.Errorf("head = status %d headers %v, want status 200 and the handler's header", resp.Status, resp.Header)
			}
			if resp.Size != tt.wantSize {
				t.Errorf("Response.Size = %d, want %d", resp.Size, tt.wantSize)
			}
			if len(pieces) != tt.wantPieces {
				t.Errorf("got %d pieces, want %d", len(pieces), tt.wantPieces)
			}
			for i, b := range pieces {
				if len(b) > piece {
					t.Errorf("piece %d has %d bytes, want at most %d", i, len(b), piece)
				}
			}
			if got := bytes.Join(pieces, nil); !bytes.Equal(got, data) {
				t.Errorf("body has %d bytes, want the %d written", len(got), len(data))
			}
		})
	}
}

func TestHandleStreamCallerGone(t *testing.T) {
	writeErr := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Stream until a write fails, as a handler that ignores
		// r.Context() would; the 10s bound only keeps a broken SDK from
		// hanging the test.
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
			if _, err := io.WriteString(w, "tick\n"); err != nil {
				writeErr <- err
				return
			}
			w.(http.Flusher).Flush()
		}
		writeErr <- nil
	})
	p := pluginWith(h)
	p.Routes = muxWith(func(m *Mux) { m.Handle("/", h, Streaming()) })
	tp := startPlugin(t, p)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp, err := tp.data.RoundTrip(ctx, &dataplane.Request{Method: "GET", Path: "/", Streaming: true})
	if err != nil {
		t.Fatalf("RoundTrip() = %v", err)
	}
	if _, err := resp.Next(); err != nil {
		t.Fatalf("first Next() = %v", err)
	}
	cancel()
	// The host gives up on the request as it reads on or closes it.
	resp.Close()
	if err := waitFor(t, writeErr, "the handler to stop writing"); err == nil {
		t.Errorf("Write() after the caller went away = nil for 10s, want an error")
	}
}

func TestHandleStreamPanic(t *testing.T) {
	tests := []struct {
		name string
		// handler panics with "boom" or http.ErrAbortHandler.
		handler http.HandlerFunc
		// wantHead is the status of the response.
		wantHead int
		// wantErr is the error that ends its body, nil for its end.
		wantErr error
		wantLog bool
	}{
		{
			name:     "before writing",
			handler:  func(http.ResponseWriter, *http.Request) { panic("boom") },
			wantHead: http.StatusInternalServerError,
			wantLog:  true,
		},
		{
			name: "after writing but before flushing",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, "partial")
				panic("boom")
			},
			wantHead: http.StatusInternalServerError,
			wantLog:  true,
		},
		{
			// The head is out: the only honest end is an aborted
			// response, so that the host cuts it short.
			name: "after flushing",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic("boom")
			},
			wantHead: http.StatusAccepted,
			wantErr:  dataplane.ErrAborted,
			wantLog:  true,
		},
		{
			name: "http.ErrAbortHandler after flushing",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			},
			wantHead: http.StatusOK,
			wantErr:  dataplane.ErrAborted,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pluginWith(tt.handler)
			p.Routes = muxWith(func(m *Mux) { m.Handle("/", tt.handler, Streaming()) })
			tp := startPlugin(t, p)
			resp, pieces, err := tp.handleStream(t.Context(), &dataplane.Request{Method: "GET", Path: "/", Streaming: true})
			if resp == nil {
				t.Fatalf("handleStream() = %v, want a response", err)
			}
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("handleStream() body ended with %v, want %v", err, tt.wantErr)
			}
			if resp.Status != tt.wantHead {
				t.Errorf("status = %d, want %d", resp.Status, tt.wantHead)
			}
			body := bytes.Join(pieces, nil)
			if tt.wantHead == http.StatusInternalServerError {
				if got := decodeError(t, body).Error.Code; got != "internal" {
					t.Errorf("handleStream() error code = %q, want %q", got, "internal")
				}
			} else if string(body) != "partial" {
				t.Errorf("body = %q, want the part flushed", body)
			}
			recs := tp.logs.records(t, "handler panicked")
			if got := len(recs) == 1; got != tt.wantLog {
				t.Errorf("log has %d %q records, want logged = %t", len(recs), "handler panicked", tt.wantLog)
			}
		})
	}
}
