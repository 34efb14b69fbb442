package main

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func testTenancy(withDefault bool) *tenancy {
	s := settings{tenants: []tenantSettings{
		{name: "acme", rate: 2, burst: 2, quantum: 1, mq: 1},
		{name: "beta", rate: 1, burst: 1, quantum: 1, mq: 1},
	}}
	s.tenants[0].keySum = sha("acme-key")
	s.tenants[1].keySum = sha("beta-key")
	if withDefault {
		s.defaultTenant = &tenantSettings{name: defaultTenantName, rate: 1, burst: 1, quantum: 1, mq: 1}
	}
	return newTenancy(s)
}

func TestIdentify(t *testing.T) {
	tests := []struct {
		keys        []string
		withDefault bool
		want        string // "" for errUnauthorized
	}{
		{[]string{"acme-key"}, false, "acme"},
		{[]string{"beta-key"}, false, "beta"},
		{[]string{"acme-key"}, true, "acme"},
		{nil, true, defaultTenantName},
		{nil, false, ""},
		{[]string{""}, false, ""},
		{[]string{"acme-key "}, false, ""},
		{[]string{"ACME-KEY"}, true, defaultTenantName},
		{[]string{"acme-key", "beta-key"}, true, defaultTenantName},
		{[]string{"acme-key", "acme-key"}, false, ""},
		{[]string{strings.Repeat("x", maxKeyLen+1)}, false, ""},
	}
	for _, tt := range tests {
		tn, err := testTenancy(tt.withDefault).identify(tt.keys)
		got := ""
		if err == nil {
			got = tn.name
		} else if !errors.Is(err, errUnauthorized) {
			t.Errorf("identify(%q) = %v, want errUnauthorized or a tenant", tt.keys, err)
		}
		if got != tt.want {
			t.Errorf("identify(%q), default %v = %q, want %q", tt.keys, tt.withDefault, got, tt.want)
		}
	}
}

// TestAdmit drives acme's bucket (2 a second, burst 2) on a fixed clock:
// the third request in the same instant waits half a second for a token,
// and Retry-After and the RateLimit fields say so.
func TestAdmit(t *testing.T) {
	tn := testTenancy(false).tenants[0]
	t0 := time.Unix(1_800_000_000, 0)
	h := http.Header{}
	for i := range 2 {
		if err := tn.admit(h, t0); err != nil {
			t.Fatalf("admit %d at t0 = %v, want nil within the burst", i, err)
		}
	}
	if got := h.Get("RateLimit"); got != `"tenant";r=0;t=0` {
		t.Errorf("RateLimit after the burst = %q, want r=0;t=0", got)
	}
	if got := h.Get("RateLimit-Policy"); got != `"tenant";q=2;w=1` {
		t.Errorf("RateLimit-Policy = %q, want q=2;w=1", got)
	}
	h = http.Header{}
	err := tn.admit(h, t0)
	var limited *rateLimitedError
	if !errors.As(err, &limited) || limited.wait != 500*time.Millisecond {
		t.Fatalf("third admit at t0 = %v, want a 500ms wait", err)
	}
	if got := h.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1 (500ms rounded up)", got)
	}
	if got := h.Get("RateLimit"); got != `"tenant";r=0;t=1` {
		t.Errorf("RateLimit when limited = %q, want r=0;t=1", got)
	}
	// The refused request took no token: one is there after the wait.
	if err := tn.admit(http.Header{}, t0.Add(limited.wait)); err != nil {
		t.Errorf("admit after the announced wait = %v, want nil", err)
	}
	if err := tn.admit(http.Header{}, t0.Add(limited.wait)); err == nil {
		t.Errorf("a second admit after the wait succeeded; one token had refilled")
	}
}

// TestRetryAfterHonoured goes through the plugin: beta's bucket holds one
// token a second; the second request gets 429 with Retry-After, and the
// same request after that many seconds succeeds.
func TestRetryAfterHonoured(t *testing.T) {
	web := &echo{}
	srv := newUpstreamServer(t, web)
	h := start(t, optionsFor(twoTenants(srv, `tenant "beta" {
  api_key_sha256 = "`+sumHex("beta-key")+`"
  rate_per_s     = 1
  burst          = 1
}`)))
	beta := http.Header{"X-Api-Key": {"beta-key"}}
	if rec := send(t, h, "GET", "/x", beta, nil); rec.Code != http.StatusOK {
		t.Fatalf("first GET = %d %s, want 200", rec.Code, rec.Body)
	}
	rec := send(t, h, "GET", "/x", beta, nil)
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `"code":"rate_limited"`) {
		t.Fatalf("second GET = %d %s, want 429 rate_limited", rec.Code, rec.Body)
	}
	secs, err := strconv.Atoi(rec.Header().Get("Retry-After"))
	if err != nil || secs != 1 {
		t.Fatalf("Retry-After = %q, want 1 for a bucket of one token a second", rec.Header().Get("Retry-After"))
	}
	// acme is served meanwhile: the limit is beta's alone.
	if rec := send(t, h, "GET", "/x", http.Header{"X-Api-Key": {"acme-key"}}, nil); rec.Code != http.StatusOK {
		t.Errorf("acme's GET while beta is limited = %d, want 200", rec.Code)
	}
	time.Sleep(time.Duration(secs) * time.Second) // what a client honouring Retry-After does
	if rec := send(t, h, "GET", "/x", beta, nil); rec.Code != http.StatusOK {
		t.Errorf("GET after Retry-After = %d %s, want 200", rec.Code, rec.Body)
	}
}

// FuzzIdentify feeds identify any X-Api-Key values (newline-separated):
// it must never panic, and must name a tenant only for exactly one value
// that is that tenant's key.
func FuzzIdentify(f *testing.F) {
	for _, s := range []string{"", "acme-key", "beta-key", "acme-key\nacme-key", "acme-key\x00", strings.Repeat("k", 600), "\xff\xfe"} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, raw string, withDefault bool) {
		var keys []string
		if raw != "" {
			keys = strings.Split(raw, "\n")
		}
		tn, err := testTenancy(withDefault).identify(keys)
		want := ""
		if len(keys) == 1 {
			switch keys[0] {
			case "acme-key":
				want = "acme"
			case "beta-key":
				want = "beta"
			}
		}
		if want == "" && withDefault {
			want = defaultTenantName
		}
		got := ""
		if err == nil {
			got = tn.name
		}
		if got != want {
			t.Fatalf("identify(%q), default %v = %q, %v; want %q", keys, withDefault, got, err, want)
		}
	})
}
