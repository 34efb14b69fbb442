package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// dataPlaneMaxBody is max_body_bytes for TestDataPlaneThroughHost: large
// enough that a body crosses the data plane in many pieces.
const dataPlaneMaxBody = 8 << 20

// TestDataPlaneThroughHost sends what the data plane carries in pieces
// through the real host and plugin processes: request bodies up to
// max_body_bytes, large responses, a stream the client abandons, and a
// plugin that dies in the middle of a request body or of a stream.
func TestDataPlaneThroughHost(t *testing.T) {
	cfg := strings.Replace(baseConfig("2s"), "max_body_bytes  = 4096", fmt.Sprintf("max_body_bytes  = %d", dataPlaneMaxBody), 1)
	h := startHost(t, cfg+pluginBlock("bodies", "bodies", ""))
	readyPlugin(t, h, "bodies")

	t.Run("request bodies up to the cap", func(t *testing.T) {
		for _, n := range []int{0, 1, 64<<10 - 1, 64 << 10, 64<<10 + 1, 1 << 20, dataPlaneMaxBody} {
			body := make([]byte, n)
			_, _ = rand.Read(body)
			sum := sha256.Sum256(body)
			code, got := do(t, http.MethodPost, h.ingress+"/bodies/sum", bytes.NewReader(body), nil)
			var r struct {
				Bytes  int    `json:"bytes"`
				SHA256 string `json:"sha256"`
			}
			if err := json.Unmarshal([]byte(got), &r); code != http.StatusOK || err != nil {
				t.Fatalf("POST /bodies/sum with %d bytes = %d %s, want 200 and the sum", n, code, got)
			}
			if r.Bytes != n || r.SHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("POST /bodies/sum with %d bytes: the plugin read %d bytes with sha256 %s, want %d with %x", n, r.Bytes, r.SHA256, n, sum)
			}
		}
		code, got := do(t, http.MethodPost, h.ingress+"/bodies/sum", bytes.NewReader(make([]byte, dataPlaneMaxBody+1)), nil)
		if code != http.StatusRequestEntityTooLarge {
			t.Errorf("POST /bodies/sum with max_body_bytes+1 = %d %s, want 413", code, got)
		}
	})

	t.Run("large responses", func(t *testing.T) {
		for _, n := range []int{64 << 10, 256<<10 + 7, 16 << 20} {
			resp, err := client.Get(h.ingress + "/bodies/blob?n=" + strconv.Itoa(n))
			if err != nil {
				t.Fatalf("GET /bodies/blob?n=%d: %v", n, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /bodies/blob?n=%d = %d, %d bytes, %v; want 200", n, resp.StatusCode, len(b), err)
			}
			if resp.ContentLength != int64(n) {
				t.Errorf("GET /bodies/blob?n=%d: Content-Length %d, want %d (the plugin's whole answer)", n, resp.ContentLength, n)
			}
			if len(b) != n {
				t.Fatalf("GET /bodies/blob?n=%d: %d bytes, want %d", n, len(b), n)
			}
			for i, c := range b {
				if c != "0123456789abcdef"[i%16] {
					t.Fatalf("GET /bodies/blob?n=%d: byte %d is %q, want %q", n, i, c, "0123456789abcdef"[i%16])
				}
			}
		}
	})

	t.Run("client leaves mid-stream", func(t *testing.T) {
		canceled := func() int {
			t.Helper()
			code, body := h.get(h.ingress + "/bodies/canceled")
			n, err := strconv.Atoi(strings.TrimSpace(body))
			if code != http.StatusOK || err != nil {
				t.Fatalf("GET /bodies/canceled = %d %s", code, body)
			}
			return n
		}
		before := canceled()
		req, err := http.NewRequestWithContext(ctxTimeout(t, 10*time.Second), http.MethodGet, h.ingress+"/bodies/ticks", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET /bodies/ticks: %v", err)
		}
		r := bufio.NewReader(resp.Body)
		for i := range 3 {
			if ev, err := readEvent(r); err != nil || ev != fmt.Sprintf("data: %d\n\n", i) {
				t.Fatalf("event %d = %q, %v", i, ev, err)
			}
		}
		resp.Body.Close() // the client goes away
		waitFor(t, 10*time.Second, "the plugin's handler to see its stream cancelled", func() bool { return canceled() == before+1 })
	})

	t.Run("plugin dies mid-stream", func(t *testing.T) {
		pid := readyPlugin(t, h, "bodies").Pid
		resp, err := client.Get(h.ingress + "/bodies/die-mid-stream")
		if err != nil {
			t.Fatalf("GET /bodies/die-mid-stream: %v", err)
		}
		r := bufio.NewReader(resp.Body)
		if ev, err := readEvent(r); err != nil || ev != "data: first\n\n" {
			t.Fatalf("first event = %q, %v; want it before the plugin dies", ev, err)
		}
		rest, err := io.ReadAll(r)
		resp.Body.Close()
		if err == nil {
			t.Errorf("the stream of a plugin that died mid-stream ended cleanly after %q; want it cut off", rest)
		}
		waitFor(t, 30*time.Second, "bodies to be restarted", func() bool {
			st := h.plugins()["bodies"]
			return st.State == "ready" && st.Pid != pid
		})
	})

	t.Run("plugin dies mid-body", func(t *testing.T) {
		pid := readyPlugin(t, h, "bodies").Pid
		code, body := do(t, http.MethodPost, h.ingress+"/bodies/die-mid-body", bytes.NewReader(make([]byte, 4<<20)), nil)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, `"plugin_unavailable"`) {
			t.Errorf("POST /bodies/die-mid-body = %d %s, want 503 plugin_unavailable", code, body)
		}
		waitFor(t, 30*time.Second, "bodies to be restarted", func() bool {
			st := h.plugins()["bodies"]
			return st.State == "ready" && st.Pid != pid
		})
		if code, body := h.get(h.ingress + "/bodies/blob?n=10"); code != http.StatusOK || body != "0123456789" {
			t.Errorf("GET /bodies/blob after the restart = %d %q, want 200", code, body)
		}
	})
}
