package ingress

import (
	"net/http"
	"net/url"
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
		{name: "encoded invalid byte in query", target: "/hello/?q=%FF"}, // forwarded raw: the plugin decodes it
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
