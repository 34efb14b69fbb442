package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// rawBackend serves on loopback, for each request on a connection, the
// bytes answers holds for its path, as they are: answers a well-behaved
// server would never send (for /headers, the request's headers as text;
// 200 "ok" for any other path). It closes the
// connection after an answer whose path is in closeAfter. It returns the
// backend's URL.
func rawBackend(t *testing.T, answers map[string]string, closeAfter map[string]bool) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A body is read before the hijack, which would leave the first
		// request's unread in rw.
		_, _ = io.Copy(io.Discard, r.Body)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		for {
			answer, ok := answers[r.URL.Path]
			if r.URL.Path == "/headers" {
				var b strings.Builder
				_ = r.Header.Write(&b)
				answer, ok = fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", b.Len(), b.String()), true
			}
			if !ok {
				answer = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
			}
			_, err = rw.WriteString(answer)
			if err != nil || rw.Flush() != nil || closeAfter[r.URL.Path] {
				return
			}
			if r, err = http.ReadRequest(rw.Reader); err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, r.Body)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestGatewayUpstreamAnswers sends requests through the host and the
// gateway to a backend that answers what a broken or hostile server
// would, and checks what the client gets.
func TestGatewayUpstreamAnswers(t *testing.T) {
	backend := rawBackend(t, map[string]string{
		"/cut":       "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nhello",
		"/upgrade":   "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
		"/sized":     "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 42\r\n\r\n", // to HEAD
		"/nocontent": "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
		"/events":    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n", // and no end
		"/untyped":   "HTTP/1.1 200 OK\r\nContent-Length: 28\r\n\r\n<html><body>hi</body></html>",
	}, map[string]bool{"/cut": true})
	h := startHost(t, baseConfig("5s")+gatewayBlock(backend, ""))
	readyPlugin(t, h, "gateway")

	t.Run("body cut short", func(t *testing.T) {
		code, _, body := ask(t, "POST", h.ingress+"/gw/cut", nil)
		if code != http.StatusBadGateway || !strings.Contains(body, `"code":"upstream_error"`) {
			t.Errorf("POST /gw/cut, whose answer says 10 bytes and has 5 = %d %q, want 502 upstream_error", code, body)
		}
	})
	t.Run("lookalike headers", func(t *testing.T) {
		hdr := http.Header{"X_api_key": {"acme-key"}, "X_gateway_tenant": {"root"}, "X_forwarded_for": {"10.0.0.1"}, "X_custom": {"kept"}}
		code, _, body := ask(t, "GET", h.ingress+"/gw/headers", hdr)
		if code != http.StatusOK || !strings.Contains(body, "X_custom: kept") || !strings.Contains(body, "X-Gateway-Tenant: default") {
			t.Fatalf("GET /gw/headers = %d %q, want 200 with the backend's view of the headers", code, body)
		}
		for _, name := range []string{"X_api_key", "X_gateway_tenant", "X_forwarded_for"} {
			if strings.Contains(body, name+":") {
				t.Errorf("the backend got %s, which CGI reads as the gateway's own header:\n%s", name, body)
			}
		}
	})
	t.Run("dot segments with parameters", func(t *testing.T) {
		for _, path := range []string{"/gw/echo/..;/..;/secret", "/gw/echo/%2e%2e;/secret", "/gw/echo/..%5csecret"} {
			code, _, body := ask(t, "GET", h.ingress+path, nil)
			if code != http.StatusBadRequest || !strings.Contains(body, `"code":"bad_path"`) {
				t.Errorf("GET %s = %d %q, want 400 bad_path", path, code, body)
			}
		}
	})
	t.Run("HEAD keeps the length", func(t *testing.T) {
		code, hdr, _ := ask(t, "HEAD", h.ingress+"/gw/sized", nil)
		if code != http.StatusOK || hdr.Get("Content-Length") != "42" {
			t.Errorf("HEAD /gw/sized = %d with Content-Length %q, want 200 with the backend's 42", code, hdr.Get("Content-Length"))
		}
	})
	t.Run("no Content-Type invented", func(t *testing.T) {
		code, hdr, body := ask(t, "GET", h.ingress+"/gw/untyped", nil)
		if got, ok := hdr["Content-Type"]; code != http.StatusOK || ok {
			t.Errorf("GET /gw/untyped = %d %q with Content-Type %q, want 200 without one, as the backend sent it", code, body, got)
		}
	})
	t.Run("bytes after a 204", func(t *testing.T) {
		if code, _, body := ask(t, "POST", h.ingress+"/gw/nocontent", nil); code != http.StatusNoContent {
			t.Fatalf("POST /gw/nocontent = %d %q, want the backend's 204", code, body)
		}
		if code, _, body := ask(t, "POST", h.ingress+"/gw/x", nil); code != http.StatusOK || body != "ok" {
			t.Errorf("POST /gw/x after a 204 with a body = %d %q, want 200 ok", code, body)
		}
	})
	t.Run("event stream", func(t *testing.T) {
		code, _, body := ask(t, "GET", h.ingress+"/gw/events", nil)
		if code != http.StatusBadGateway || !strings.Contains(body, `"code":"upstream_stream"`) {
			t.Errorf("GET /gw/events, an endless event stream = %d %q, want 502 upstream_stream at once", code, body)
		}
	})
	t.Run("CONNECT and TRACE", func(t *testing.T) {
		code, hdr, body := ask(t, "TRACE", h.ingress+"/gw/x", nil)
		if code != http.StatusMethodNotAllowed || !strings.Contains(body, `"code":"method_not_allowed"`) || !strings.Contains(hdr.Get("Allow"), "GET") {
			t.Errorf("TRACE /gw/x = %d %q, Allow %q; want 405 method_not_allowed with Allow", code, body, hdr.Get("Allow"))
		}
		resp, b, err := rawExchange(t, h.ingress, []byte("CONNECT /gw/x HTTP/1.1\r\nHost: backend:80\r\n\r\n"))
		if err != nil {
			t.Fatalf("CONNECT /gw/x: %v", err)
		}
		if resp.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(string(b), `"code":"method_not_allowed"`) {
			t.Errorf("CONNECT /gw/x = %d %q, want 405 method_not_allowed", resp.StatusCode, b)
		}
	})
	t.Run("101 nobody asked for", func(t *testing.T) {
		code, _, body := ask(t, "GET", h.ingress+"/gw/upgrade", http.Header{"Connection": {"Upgrade"}, "Upgrade": {"h2c"}})
		if code != http.StatusBadGateway || !strings.Contains(body, `"code":"upstream_error"`) {
			t.Errorf("GET /gw/upgrade, answered 101 by the backend = %d %q, want 502 upstream_error", code, body)
		}
	})
}

// ask sends one request with hdr and returns the answer, failing the test
// if none comes within 10 seconds: a hang is an answer too late.
func ask(t *testing.T, method, url string, hdr http.Header) (int, http.Header, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = hdr.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	return send(t, req)
}
