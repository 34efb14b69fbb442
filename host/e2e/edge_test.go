package e2e

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// rawExchange sends raw, a whole HTTP/1.1 request as bytes, on a new
// loopback connection to the host at base, writing all of it before it
// reads, and returns the answer with its body read. It is for requests
// net/http's client will not send, and for clients that do not read
// until they have sent everything.
func rawExchange(t *testing.T, base string, raw []byte) (*http.Response, []byte, error) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		return nil, nil, err
	}
	if _, err := conn.Write(raw); err != nil {
		return nil, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// aboveDebug matches a host log line at info level or above.
var aboveDebug = regexp.MustCompile(`(?m)^.*\[(INFO|WARN|ERROR)\].*$`)

// TestMalformedRequests checks that bytes a plugin must never see are the
// client's fault: 400 JSON from the host, nothing in its log above debug,
// and no effect on the plugin; and that a path with an encoded slash
// does not reach the route its decoded form names.
func TestMalformedRequests(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("hello", "hello", "")+pluginBlock("faulty", "faulty", ""))
	tests := []struct {
		name       string
		request    string // a raw request up to the blank line; Host and Connection added
		wantStatus int
		wantCode   string
	}{
		{"raw byte in path", "GET /hello/\xff HTTP/1.1\r\n", 400, "bad_request"},
		{"encoded invalid UTF-8 in path", "GET /hello/%C3%28 HTTP/1.1\r\n", 400, "bad_request"},
		{"encoded NUL in path", "GET /hello/sleep%00?ms=1 HTTP/1.1\r\n", 400, "bad_request"},
		{"raw byte in query", "GET /hello/sleep?ms=1&x=\xfe HTTP/1.1\r\n", 400, "bad_request"},
		{"header not UTF-8", "GET /hello/ HTTP/1.1\r\nX-Name: caf\xe9\r\n", 400, "bad_request"},
		{"header with a C1 control", "GET /hello/ HTTP/1.1\r\nX-Name: a\xc2\x85b\r\n", 400, "bad_request"},
		{"encoded slash after the mount", "GET /hello%2Fsleep?ms=1 HTTP/1.1\r\n", 404, "not_found"},
		{"encoded slash inside the plugin's path", "POST /faulty%2fecho HTTP/1.1\r\nContent-Length: 4\r\n", 404, "not_found"},
	}
	mark := len(h.log.String())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := tt.request + "Host: plughost\r\nConnection: close\r\n\r\n"
			if strings.HasPrefix(raw, "POST") {
				raw += "ping"
			}
			resp, body, err := rawExchange(t, h.ingress, []byte(raw))
			if err != nil {
				t.Fatalf("%q: %v", tt.request, err)
			}
			checkJSONError(t, tt.name, resp, body, tt.wantStatus, tt.wantCode)
		})
	}
	if lines := aboveDebug.FindAllString(h.log.String()[mark:], -1); len(lines) > 0 {
		t.Errorf("the host logged above debug for malformed requests:\n%s", strings.Join(lines, "\n"))
	}

	// The same requests without the bad bytes reach the plugins: the
	// cases above were refused for their bytes, not their routes.
	for _, good := range []string{
		"GET /hello/sleep?ms=1 HTTP/1.1\r\n",
		"GET /hello/%C3%A9t%C3%A9 HTTP/1.1\r\n", // UTF-8, no such route: the plugin's 404
		"POST /faulty/echo HTTP/1.1\r\nContent-Length: 4\r\n",
	} {
		raw := good + "Host: plughost\r\nConnection: close\r\n\r\n"
		if strings.HasPrefix(raw, "POST") {
			raw += "ping"
		}
		resp, body, err := rawExchange(t, h.ingress, []byte(raw))
		if err != nil {
			t.Fatalf("%q: %v", good, err)
		}
		want := http.StatusOK
		if strings.Contains(good, "%C3") {
			want = http.StatusNotFound
			if !bytes.Contains(body, []byte(`has no route`)) {
				t.Errorf("%q = %d %s, want the ingress's 404 for a route hello lacks", good, resp.StatusCode, body)
			}
		}
		if resp.StatusCode != want {
			t.Errorf("%q = %d %s, want %d", good, resp.StatusCode, body, want)
		}
	}
}
