package ingress_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/ingress"
)

// The body limits of the faulty plugin's POST /echo/small and POST
// /echo/large (sdk.MaxBody), and the host-wide one of these tests, between
// them.
const (
	smallRoute = 1 << 10
	largeRoute = 256 << 10
	hostBody   = 64 << 10
)

func TestBodyLimitRule(t *testing.T) {
	tests := []struct {
		route, plugin, host int64
		want                int64
	}{
		{0, 0, hostBody, hostBody},                     // nothing set: the host's
		{largeRoute, 0, hostBody, largeRoute},          // the route's, above the host's
		{smallRoute, 0, hostBody, smallRoute},          // the route's, below it
		{0, 128 << 10, hostBody, 128 << 10},            // the plugin block's
		{largeRoute, 128 << 10, hostBody, 128 << 10},   // the route's, capped by the block
		{smallRoute, 128 << 10, hostBody, smallRoute},  // the route's, within the block
		{largeRoute, 32 << 20, hostBody, largeRoute},   // the block at the ceiling caps nothing
		{largeRoute, largeRoute, hostBody, largeRoute}, // equal
	}
	for _, tt := range tests {
		if got := ingress.BodyLimit(tt.route, tt.plugin, tt.host); got != tt.want {
			t.Errorf("BodyLimit(%d, %d, %d) = %d, want %d", tt.route, tt.plugin, tt.host, got, tt.want)
		}
	}
}

// TestRouteBodyLimit: a route's own limit (sdk.MaxBody) applies instead
// of the host's, above or below it, to bodies with a Content-Length and
// to chunked ones; a max_body_bytes in the plugin block caps it, and is
// the limit of the plugin's other routes.
func TestRouteBodyLimit(t *testing.T) {
	limits := ingress.Limits{MaxBodyBytes: hostBody, RequestTimeout: 30 * time.Second, BodyTimeout: 30 * time.Second}
	capped := faulty()
	capped.maxBody = 128 << 10
	tests := []struct {
		name    string
		plugin  pluginSpec
		path    string
		size    int
		chunked bool
		want    int    // the status
		message string // in a 413's message
	}{
		{"small route at its limit", faulty(), "/faulty/echo/small", smallRoute, false, 200, ""},
		{"small route over its limit", faulty(), "/faulty/echo/small", smallRoute + 1, false, 413, "request body is 1025 bytes; the limit is 1024"},
		{"small route, chunked, over its limit", faulty(), "/faulty/echo/small", smallRoute + 1, true, 413, "exceeds the limit of 1024 bytes"},
		{"large route over the host's limit", faulty(), "/faulty/echo/large", 200 << 10, false, 200, ""},
		{"large route, chunked, over the host's limit", faulty(), "/faulty/echo/large", 200 << 10, true, 200, ""},
		{"large route at its limit", faulty(), "/faulty/echo/large", largeRoute, false, 200, ""},
		{"large route over its limit", faulty(), "/faulty/echo/large", largeRoute + 1, false, 413, fmt.Sprintf("the limit is %d", largeRoute)},
		{"large route, chunked, over its limit", faulty(), "/faulty/echo/large", largeRoute + 1, true, 413, fmt.Sprintf("exceeds the limit of %d bytes", largeRoute)},
		{"other route keeps the host's limit", faulty(), "/faulty/echo", hostBody + 1, false, 413, fmt.Sprintf("the limit is %d", hostBody)},
		{"block caps the large route", capped, "/faulty/echo/large", 128<<10 + 1, false, 413, fmt.Sprintf("the limit is %d", 128<<10)},
		{"block caps the large route, chunked", capped, "/faulty/echo/large", 128<<10 + 1, true, 413, fmt.Sprintf("exceeds the limit of %d bytes", 128<<10)},
		{"block's limit on the large route", capped, "/faulty/echo/large", 128 << 10, false, 200, ""},
		{"block's limit on the other routes", capped, "/faulty/echo", 100 << 10, false, 200, ""},
		{"small route within the block", capped, "/faulty/echo/small", smallRoute + 1, false, 413, "the limit is 1024"},
	}
	// One fixture for each plugin block, alive for every subtest.
	fixtures := map[int64]*fixture{}
	for _, tt := range tests {
		if fixtures[tt.plugin.maxBody] == nil {
			fixtures[tt.plugin.maxBody] = newFixture(t, limits, tt.plugin)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fixtures[tt.plugin.maxBody]
			body := bytes.Repeat([]byte("b"), tt.size)
			var r io.Reader = bytes.NewReader(body)
			if tt.chunked {
				r = chunked{r}
			}
			got := f.request(t, http.MethodPost, tt.path, r)
			switch {
			case got.code != tt.want:
				t.Errorf("POST %s with %d bytes (chunked %t) = %d %.100s, want %d", tt.path, tt.size, tt.chunked, got.code, got.body, tt.want)
			case tt.want == 200 && got.body != string(body):
				t.Errorf("POST %s with %d bytes (chunked %t) = 200 with %d bytes, want them echoed", tt.path, tt.size, tt.chunked, len(got.body))
			case tt.want == 413 && (got.errorCode() != "body_too_large" || !strings.Contains(got.body, tt.message)):
				t.Errorf("POST %s with %d bytes (chunked %t) = 413 %s, want body_too_large saying %q", tt.path, tt.size, tt.chunked, got.body, tt.message)
			}
		})
	}
}

// TestRouteBodyLimitBeforeTheBody: a Content-Length over a route's own
// limit is answered 413 before the ingress reads any of the body: to a
// client that asked to send it after a 100 Continue, without one, and to
// a client that has sent a piece of it, while it still sends.
func TestRouteBodyLimitBeforeTheBody(t *testing.T) {
	f := newFixture(t, ingress.Limits{MaxBodyBytes: hostBody, RequestTimeout: 30 * time.Second, BodyTimeout: 30 * time.Second}, faulty())

	t.Run("expect 100-continue", func(t *testing.T) {
		conn := f.dialRaw(t)
		if _, err := fmt.Fprintf(conn, "POST /faulty/echo/small HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", smallRoute+1); err != nil {
			t.Fatal(err)
		}
		// The first answer is the final one: a 100 Continue would be read
		// as a response of its own.
		r := readResponse(t, conn)
		if r.code != http.StatusRequestEntityTooLarge || r.errorCode() != "body_too_large" || !strings.Contains(r.body, "the limit is 1024") {
			t.Errorf("POST /faulty/echo/small with Expect: 100-continue and %d bytes declared = %d %s, want 413 body_too_large and no 100 Continue first",
				smallRoute+1, r.code, r.body)
		}
	})
	t.Run("still sending", func(t *testing.T) {
		// The large route's limit is over the host's, so the 413 must
		// come from the small route's own.
		conn := f.dialRaw(t)
		if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintf(conn, "POST /faulty/echo/small HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", largeRoute, bytes.Repeat([]byte("s"), 512)); err != nil {
			t.Fatal(err)
		}
		// The rest of the body never comes: only an answer given before
		// the body was read arrives before the read deadline, well
		// within the body's timeout.
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("read the answer with the body still arriving: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), fmt.Sprintf("request body is %d bytes; the limit is 1024", largeRoute)) {
			t.Errorf("POST /faulty/echo/small declaring %d bytes, 512 sent = %d %s, want 413 naming the route's limit", largeRoute, resp.StatusCode, b)
		}
		if got := f.bodyBytes("faulty"); got != 0 {
			t.Errorf("plughost_request_body_bytes{plugin=\"faulty\"} = %d after a body refused by its length, want 0", got)
		}
	})
}

func TestBodyBoundRule(t *testing.T) {
	tests := []struct {
		inflight, plugin, limit int64
		want                    int64
	}{
		{512, hostBody, hostBody, 512 * hostBody},     // the plugin's figure
		{512, hostBody, largeRoute, 512 * hostBody},   // a large route adds nothing when it fits
		{1, hostBody, largeRoute, largeRoute},         // and one body at its limit when it does not
		{2, 128 << 10, 128 << 10, 256 << 10},          // the plugin block's limit
		{0, hostBody, largeRoute, 0},                  // no in-flight cap: no bound
		{4, hostBody, smallRoute, 4 * hostBody},       // a small route keeps the plugin's bound
		{1, 32 << 20, 32 << 20, 32 << 20},             // the ceiling
		{3, hostBody, 3*hostBody + 1, 3*hostBody + 1}, // one byte past the figure
	}
	for _, tt := range tests {
		if got := ingress.BodyBound(tt.inflight, tt.plugin, tt.limit); got != tt.want {
			t.Errorf("BodyBound(%d, %d, %d) = %d, want %d", tt.inflight, tt.plugin, tt.limit, got, tt.want)
		}
	}
}

// TestBodyBudgetEffectiveLimits: a plugin's body budget is max_inflight
// times the plugin's limit (its block's, or the host's), and at least one
// body at the limit of the route a body is sent to.
func TestBodyBudgetEffectiveLimits(t *testing.T) {
	limits := ingress.Limits{MaxBodyBytes: hostBody, RequestTimeout: 30 * time.Second, BodyTimeout: 30 * time.Second}

	t.Run("route over the host's limit", func(t *testing.T) {
		// Under the host's limit alone the budget is 1 × 64 KiB, and no
		// 200 KiB body would ever fit; a body to the large route gets
		// one body at its limit.
		fs := faulty()
		fs.maxInflight = 1
		f := newFixture(t, limits, fs)
		body := bytes.Repeat([]byte("l"), 200<<10)
		if r := f.postFrom(t, "127.0.0.1", "/faulty/echo/large", body); r.code != http.StatusOK || r.body != string(body) {
			t.Errorf("POST /faulty/echo/large with 200 KiB, max_inflight 1 = %d %.100s, want 200 and its body", r.code, r.body)
		}
	})
	t.Run("route capped by the plugin block", func(t *testing.T) {
		fs := faulty()
		fs.maxInflight = 1
		fs.maxBody = 128 << 10 // the budget: 1 × 128 KiB; the large route capped at it
		f := newFixture(t, limits, fs)
		// 40 KiB of a declared 128 KiB arrive: pieces of 4, 4, 8, 16
		// and 32 KiB hold 64 KiB.
		f.startSlowBody(t, "127.0.0.1", 128<<10, 40<<10)
		waitFor(t, 10*time.Second, "the slow body's pieces to be charged", func() bool { return f.bodyBytes("faulty") == 64<<10 })
		r := f.postFrom(t, "127.0.0.2", "/faulty/echo/large", bytes.Repeat([]byte("l"), 100<<10))
		if r.code != http.StatusTooManyRequests || r.errorCode() != "busy" || !strings.Contains(r.body, fmt.Sprintf("limit of %d bytes", 128<<10)) {
			t.Errorf("POST /faulty/echo/large with 100 KiB beside 64 KiB held = %d %s, want 429 busy naming %d bytes", r.code, r.body, 128<<10)
		}
	})
}
