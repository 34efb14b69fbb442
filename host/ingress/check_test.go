package ingress

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestCheckRequest(t *testing.T) {
	tests := []struct {
		name     string
		target   string // the request target, as sent
		header   http.Header
		host     string
		wantCode int // 0: routed
	}{
		{name: "plain", target: "/hello/sleep?ms=1"},
		{name: "UTF-8 path and query", target: "/hello/%C3%A9t%C3%A9?q=%E2%82%AC&r=\u00e9", header: http.Header{"X-Name": {"Jos\u00e9\tM"}}},
		{name: "encoded slash", target: "/wallet%2Fv1%2Fissue", wantCode: 404},
		{name: "encoded slash lower case", target: "/wallet/v1%2fissue", wantCode: 404},
		{name: "encoded percent before 2F", target: "/wallet/v1%252Fissue"},
		{name: "raw byte in path", target: "/hello/\xff", wantCode: 400},
		{name: "encoded invalid byte in path", target: "/hello/%FF", wantCode: 400},
		{name: "encoded NUL in path", target: "/hello/%00", wantCode: 400},
		{name: "encoded C1 control in path", target: "/hello/%C2%85", wantCode: 400},
		{name: "raw byte in query", target: "/hello/?q=\xff", wantCode: 400},
		{name: "encoded invalid byte in query", target: "/hello/?q=%FF", wantCode: 400},
		{name: "encoded NUL in query", target: "/hello/?a=1&q=%00", wantCode: 400},
		{name: "encoded C1 control in query", target: "/hello/?q=x%C2%85", wantCode: 400},
		{name: "encoded truncated rune in query name", target: "/hello/?%E2%82=1", wantCode: 400},
		{name: "malformed escape in query", target: "/hello/?q=%G0", wantCode: 400},
		{name: "lone percent in query", target: "/hello/?q=100%", wantCode: 400},
		{name: "encoded UTF-8, plus and semicolon in query", target: "/hello/?q=%E2%82%AC+1;x=%3B&&r"},
		{name: "encoded tab in query", target: "/hello/?q=a%09b", wantCode: 400},
		{name: "header not UTF-8", target: "/hello/", header: http.Header{"X-Bad": {"\xff"}}, wantCode: 400},
		{name: "header with DEL", target: "/hello/", header: http.Header{"X-Bad": {"a\x7fb"}}, wantCode: 400},
		{name: "header truncated rune", target: "/hello/", header: http.Header{"X-Bad": {"\xe2\x82"}}, wantCode: 400},
		{name: "host not UTF-8", target: "/hello/", host: "h\xff", wantCode: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := url.ParseRequestURI(tt.target)
			if err != nil {
				t.Fatalf("ParseRequestURI(%q): %v", tt.target, err)
			}
			r := &http.Request{Method: http.MethodGet, URL: u, Header: tt.header, Host: tt.host}
			if r.Header == nil {
				r.Header = http.Header{}
			}
			got := 0
			if bad := checkRequest(r); bad != nil {
				got = bad.status
			}
			if got != tt.wantCode {
				t.Errorf("checkRequest(%q) = %d, want %d", tt.target, got, tt.wantCode)
			}
		})
	}
}

func TestLogLimiter(t *testing.T) {
	var l logLimiter
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at             time.Duration
		wantOK         bool
		wantSuppressed int64
	}{
		{0, true, 0},
		{time.Millisecond, false, 0},
		{warnEvery / 2, false, 0},
		{warnEvery, true, 2},
		{warnEvery + 1, false, 0},
		{3 * warnEvery, true, 1},
	}
	for _, s := range steps {
		ok, n := l.allow(t0.Add(s.at))
		if ok != s.wantOK || n != s.wantSuppressed {
			t.Errorf("allow(t0+%v) = %v, %d, want %v, %d", s.at, ok, n, s.wantOK, s.wantSuppressed)
		}
	}
}

// FuzzCheckQuery checks that a query checkRequest lets through decodes,
// as a plugin's r.URL.Query() decodes it, without an error and to UTF-8
// text without control characters.
func FuzzCheckQuery(f *testing.F) {
	for _, q := range []string{"", "a=1&b=2", "q=%E2%82%AC+1", "q=%FF", "q=%00", "q=%G0", "x;y=%3B", "%E2%82=1", "a=%C2%85"} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q string) {
		r := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/p", RawQuery: q}, Header: http.Header{}}
		if checkRequest(r) != nil {
			return
		}
		for part := range strings.SplitSeq(q, "&") {
			name, value, _ := strings.Cut(part, "=")
			for _, s := range []string{name, value} {
				d, err := url.QueryUnescape(s)
				if err != nil {
					t.Fatalf("checkRequest let through query %q, whose %q does not decode: %v", q, s, err)
				}
				if !validText(d, false) {
					t.Fatalf("checkRequest let through query %q, whose %q decodes to %q", q, s, d)
				}
			}
		}
	})
}
