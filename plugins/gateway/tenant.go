package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// maxKeyLen bounds the X-Api-Key header the gateway hashes; a longer one
// is no configured key.
const maxKeyLen = 512

// Errors of tenancy and rate limiting.
var (
	// errUnauthorized: no known key and no default_tenant.
	errUnauthorized = errors.New("a known X-Api-Key is required")
)

// rateLimitedError is a request over its tenant's token bucket.
type rateLimitedError struct {
	tenant string
	wait   time.Duration // until the bucket holds a token
}

func (e *rateLimitedError) Error() string {
	return fmt.Sprintf("tenant %q is over its rate; retry in %v", e.tenant, e.wait.Round(time.Millisecond))
}

// tenant is one tenant at run time.
type tenant struct {
	tenantSettings
	limiter *rate.Limiter
	// policy is the RateLimit-Policy field, the same for every answer;
	// answers share it, and nothing changes it.
	policy []string
	// served is gateway_tenant_requests_total{tenant,outcome="served"},
	// looked up once rather than per request.
	served prometheus.Counter
}

func newTenant(ts tenantSettings) *tenant {
	// The window is the time the bucket takes to fill from empty.
	window := max(int(math.Ceil(float64(ts.burst)/ts.rate)), 1)
	return &tenant{tenantSettings: ts, limiter: rate.NewLimiter(rate.Limit(ts.rate), ts.burst),
		policy: []string{`"tenant";q=` + strconv.Itoa(ts.burst) + ";w=" + strconv.Itoa(window)}}
}

// tenancy finds a request's tenant. It is read-only after newTenancy.
type tenancy struct {
	tenants []*tenant
	deflt   *tenant // nil: unknown keys get 401
}

func newTenancy(s settings) *tenancy {
	t := &tenancy{}
	for _, ts := range s.tenants {
		t.tenants = append(t.tenants, newTenant(ts))
	}
	if d := s.defaultTenant; d != nil {
		t.deflt = newTenant(*d)
	}
	return t
}

// all returns every tenant, the default last when there is one.
func (t *tenancy) all() []*tenant {
	if t.deflt == nil {
		return t.tenants
	}
	return append(slices.Clip(t.tenants), t.deflt)
}

// count is how many tenants share the workers.
func (t *tenancy) count() int {
	n := len(t.tenants)
	if t.deflt != nil {
		n++
	}
	return n
}

// identify returns the tenant of the X-Api-Key values of a request: the
// tenant whose key hashes to a configured api_key_sha256, else the
// default tenant, else errUnauthorized. The hash is compared with every
// tenant's in constant time, so the time taken says nothing about which
// tenant, if any, nearly matched. More than one X-Api-Key is no key.
func (t *tenancy) identify(keys []string) (*tenant, error) {
	if len(keys) == 1 && keys[0] != "" && len(keys[0]) <= maxKeyLen {
		sum := sha256.Sum256([]byte(keys[0]))
		var found *tenant
		for _, tn := range t.tenants {
			if subtle.ConstantTimeCompare(sum[:], tn.keySum[:]) == 1 {
				found = tn
			}
		}
		if found != nil {
			return found, nil
		}
	}
	if t.deflt != nil {
		return t.deflt, nil
	}
	return nil, errUnauthorized
}

// admit takes a token from tn's bucket at now, setting the RateLimit
// header fields of the IETF draft (draft-ietf-httpapi-ratelimit-headers)
// on h either way. Over the rate it takes nothing and returns a
// *rateLimitedError whose wait is when the bucket next holds a token.
func (tn *tenant) admit(h http.Header, now time.Time) error {
	lim := tn.limiter
	var wait time.Duration
	if !lim.AllowN(now, 1) {
		// The bucket refills at rate tokens a second; the wait is
		// until it holds a whole one again.
		missing := 1 - lim.TokensAt(now)
		wait = max(time.Duration(missing/tn.rate*float64(time.Second)), time.Nanosecond)
	}
	remaining := max(int(math.Floor(lim.TokensAt(now))), 0)
	// The keys in canonical form, set without canonicalizing them.
	h["Ratelimit-Policy"] = tn.policy
	h["Ratelimit"] = []string{`"tenant";r=` + strconv.Itoa(remaining) + ";t=" + strconv.Itoa(ceilSeconds(wait))}
	if wait > 0 {
		h.Set("Retry-After", strconv.Itoa(ceilSeconds(wait)))
		return &rateLimitedError{tenant: tn.name, wait: wait}
	}
	return nil
}

// ceilSeconds rounds d up to whole seconds, as Retry-After needs.
func ceilSeconds(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return int((d + time.Second - 1) / time.Second)
}
