package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// rawBackend serves on loopback, for each request on a connection, the
// bytes answers holds for its path, as they are: answers a well-behaved
// server would never send (200 "ok" for any other path). It closes the
// connection after an answer whose path is in closeAfter. It returns the
// backend's URL.
func rawBackend(t *testing.T, answers map[string]string, closeAfter map[string]bool) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		for {
			_, _ = io.Copy(io.Discard, r.Body)
			answer, ok := answers[r.URL.Path]
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
		"/cut": "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nhello",
	}, map[string]bool{"/cut": true})
	h := startHost(t, baseConfig("5s")+gatewayBlock(backend, ""))
	readyPlugin(t, h, "gateway")

	t.Run("body cut short", func(t *testing.T) {
		code, body := do(t, "POST", h.ingress+"/gw/cut", strings.NewReader("{}"), nil)
		if code != http.StatusBadGateway || !strings.Contains(body, `"code":"upstream_error"`) {
			t.Errorf("POST /gw/cut, whose answer says 10 bytes and has 5 = %d %q, want 502 upstream_error", code, body)
		}
	})
}
