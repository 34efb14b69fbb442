package main

import (
	"encoding/hex"
	"fmt"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/plughost/plughost/plugins/gateway/internal/inflate"
	"github.com/plughost/plughost/sdk"
)

// defaultTenantName is the tenant label of requests served as the
// default_tenant.
const defaultTenantName = "default"

// Bounds of the attributes that are not worth a finer rule.
const (
	maxWorkers = 4096
	maxQueue   = 1 << 20
	maxCost    = 1 << 10
)

// config is the plugin's config block. Its json tags are the attributes
// declared in schema, and the host has applied the defaults. Numbers are
// float64 so that check can say what is wrong with 1.5.
type config struct {
	Workers       float64          `json:"workers"`
	Reserved      float64          `json:"reserved_workers"`
	WorkQueue     float64          `json:"work_queue"`
	SchedQueue    float64          `json:"sched_queue"`
	Shedding      bool             `json:"shedding"`
	ShedHold      sdk.Duration     `json:"shed_hold"`
	Upstreams     []upstreamConfig `json:"upstream"`
	Routes        []routeConfig    `json:"route"`
	Tenants       []tenantConfig   `json:"tenant"`
	DefaultTenant *tenantConfig    `json:"default_tenant"` // null when absent: unknown keys get 401
	Decode        *decodeConfig    `json:"decode"`
	Retry         *retryConfig     `json:"retry"`
	Breaker       *breakerConfig   `json:"breaker"`
}

type upstreamConfig struct {
	Name   string  `json:"name"`
	Plugin *string `json:"plugin"`
	URL    *string `json:"url"`
}

type routeConfig struct {
	Prefix      string  `json:"prefix"`
	Upstream    string  `json:"upstream"`
	StripPrefix bool    `json:"strip_prefix"`
	Cost        float64 `json:"cost"`
	Exempt      bool    `json:"exempt"`
}

type tenantConfig struct {
	Name         string  `json:"name"`
	APIKeySHA256 string  `json:"api_key_sha256"`
	RatePerS     float64 `json:"rate_per_s"`
	Burst        float64 `json:"burst"`
	Quantum      float64 `json:"quantum"`
	MaxQueue     float64 `json:"max_queue"`
}

type decodeConfig struct {
	RatioMax        float64 `json:"ratio_max"`
	AbsCapBytes     float64 `json:"abs_cap_bytes"`
	RatioAfterBytes float64 `json:"ratio_after_bytes"`
}

type retryConfig struct {
	MaxTries float64      `json:"max_tries"`
	Backoff  sdk.Duration `json:"backoff"`
	Cap      sdk.Duration `json:"cap"`
}

type breakerConfig struct {
	Failures    float64      `json:"failures"`
	FailureRate float64      `json:"failure_rate"`
	Window      sdk.Duration `json:"window"`
	CoolDown    sdk.Duration `json:"cool_down"`
	Probes      float64      `json:"probes"`
}

// The defaults of the single blocks, for when a block is absent; the
// schema declares the same values for its attributes.
var (
	defaultDecode  = decodeConfig{RatioMax: 10, AbsCapBytes: 8 << 20, RatioAfterBytes: 64 << 10}
	defaultRetry   = retryConfig{MaxTries: 3, Backoff: sdk.Duration(50 * time.Millisecond), Cap: sdk.Duration(2 * time.Second)}
	defaultBreaker = breakerConfig{Failures: 20, FailureRate: 0.5, Window: sdk.Duration(10 * time.Second), CoolDown: sdk.Duration(2 * time.Second), Probes: 10}
)

func tenantAttrs(named bool) []sdk.Attr {
	var attrs []sdk.Attr
	if named {
		attrs = append(attrs,
			sdk.Attr{Name: "api_key_sha256", Type: sdk.TypeString, Required: true, Description: "hex SHA-256 of the tenant's X-Api-Key (64 hex digits); the key itself is never configured"},
		)
	}
	return append(attrs,
		sdk.Attr{Name: "rate_per_s", Type: sdk.TypeNumber, Default: 100, Description: "token bucket refill, requests per second"},
		sdk.Attr{Name: "burst", Type: sdk.TypeNumber, Default: 200, Description: "token bucket size"},
		sdk.Attr{Name: "quantum", Type: sdk.TypeNumber, Default: 1, Description: "cost the tenant may dispatch per deficit round-robin round"},
		sdk.Attr{Name: "max_queue", Type: sdk.TypeNumber, Default: 64, Description: "the tenant's requests waiting for a worker; beyond it 429"},
	)
}

func schema() sdk.Schema {
	return sdk.Schema{
		Attrs: []sdk.Attr{
			{Name: "workers", Type: sdk.TypeNumber, Default: 0, Description: "upstream calls in flight at once; 0 means min(CPUs × 4, 64)"},
			{Name: "reserved_workers", Type: sdk.TypeNumber, Default: 1, Description: "workers besides workers that start at once a request of a tenant with nothing running or waiting, when every worker is busy; 0 turns them off"},
			{Name: "work_queue", Type: sdk.TypeNumber, Default: 512, Description: "requests waiting in all tenant queues together; beyond it 429"},
			{Name: "sched_queue", Type: sdk.TypeNumber, Default: 0, Description: "requests dispatched ahead of busy workers, waiting in the order dispatched; 0 keeps every waiting request in its tenant's queue, in fair order; when full, a tenant with none there displaces the oldest with 503"},
			{Name: "shedding", Type: sdk.TypeBool, Default: true, Description: "shed load by grades as the queues fill (with more than one tenant)"},
			{Name: "shed_hold", Type: sdk.TypeDuration, Default: "5s", Description: "how long the load must stay low before load shedding steps down a level"},
		},
		Blocks: []sdk.Block{
			{Name: "upstream", Labels: []string{"name"}, List: true, Description: "a service routes send requests to, labelled with the name routes call it by: another plugin, or an HTTP base URL", Schema: sdk.Schema{Attrs: []sdk.Attr{
				{Name: "plugin", Type: sdk.TypeString, Description: "the instance name of a plugin of this host; exclusive with url"},
				{Name: "url", Type: sdk.TypeString, Description: "an http:// or https:// base URL; exclusive with plugin"},
			}}},
			{Name: "route", Labels: []string{"prefix"}, List: true, Description: "labelled with a path prefix under the gateway's mount, starting with /: the upstream requests under it go to; the prefix matches the path equal to it or followed by / (any path that starts with it, written with a trailing /), and the longest prefix wins", Schema: sdk.Schema{Attrs: []sdk.Attr{
				{Name: "upstream", Type: sdk.TypeString, Required: true, Description: "the name of an upstream block"},
				{Name: "strip_prefix", Type: sdk.TypeBool, Default: false, Description: "remove the prefix from the path sent upstream"},
				{Name: "cost", Type: sdk.TypeNumber, Default: 1, Description: "what one request of the route costs in the tenant's quantum"},
				{Name: "exempt", Type: sdk.TypeBool, Default: false, Description: "health and admin traffic: never queued and never shed"},
			}}},
			{Name: "tenant", Labels: []string{"name"}, List: true, Description: "a tenant, labelled with its name in metrics and logs, known by the SHA-256 of its X-Api-Key", Schema: sdk.Schema{Attrs: tenantAttrs(true)}},
			{Name: "default_tenant", Description: "the share of requests without a known key; absent, they get 401", Schema: sdk.Schema{Attrs: tenantAttrs(false)}},
			{Name: "decode", Description: "the decompression guard of request bodies", Schema: sdk.Schema{Attrs: []sdk.Attr{
				{Name: "ratio_max", Type: sdk.TypeNumber, Default: 10, Description: "most decoded bytes per encoded byte"},
				{Name: "abs_cap_bytes", Type: sdk.TypeNumber, Default: 8 << 20, Description: "most bytes of a body, encoded or decoded"},
				{Name: "ratio_after_bytes", Type: sdk.TypeNumber, Default: 64 << 10, Description: "decoded bytes allowed before ratio_max applies"},
			}}},
			{Name: "retry", Description: "retries of idempotent requests, within the request's deadline", Schema: sdk.Schema{Attrs: []sdk.Attr{
				{Name: "max_tries", Type: sdk.TypeNumber, Default: 3, Description: "attempts of an idempotent request, the first included; 1 never retries"},
				{Name: "backoff", Type: sdk.TypeDuration, Default: "50ms", Description: "delay before the first retry, doubling with jitter"},
				{Name: "cap", Type: sdk.TypeDuration, Default: "2s", Description: "the longest delay between tries"},
			}}},
			{Name: "breaker", Description: "the circuit breaker of each upstream", Schema: sdk.Schema{Attrs: []sdk.Attr{
				{Name: "failures", Type: sdk.TypeNumber, Default: 20, Description: "failed calls that open it: in a row, or within window when they are at least failure_rate of its calls"},
				{Name: "failure_rate", Type: sdk.TypeNumber, Default: 0.5, Description: "share of the window's calls that must have failed to open it"},
				{Name: "window", Type: sdk.TypeDuration, Default: "10s", Description: "the rolling window of failure_rate"},
				{Name: "cool_down", Type: sdk.TypeDuration, Default: "2s", Description: "how long it stays open before probing"},
				{Name: "probes", Type: sdk.TypeNumber, Default: 10, Description: "calls let through at once while half-open, and successes that close it"},
			}}},
		},
	}
}

// settings are the checked config.
type settings struct {
	workers, reserved     int
	workQueue, schedQueue int
	shedding              bool
	shedHold              time.Duration
	upstreams             []upstreamSettings
	routes                []routeSettings // longest prefix first
	tenants               []tenantSettings
	defaultTenant         *tenantSettings
	decode                inflate.Limits
	maxTries              int
	backoff, backoffCap   time.Duration
	breaker               breakerConfig
}

type upstreamSettings struct {
	name   string
	plugin string   // set for a plugin upstream
	url    *url.URL // set for an HTTP upstream
}

type routeSettings struct {
	prefix   string
	upstream string
	strip    bool
	cost     int
	exempt   bool
}

type tenantSettings struct {
	name               string
	keySum             [32]byte // zero for the default tenant
	rate               float64
	burst, quantum, mq int
}

// check refuses what the schema cannot express. The host has refused two
// upstream, route or tenant blocks with the same label.
func (cfg config) check() (settings, error) {
	var s settings
	// The first refusal, named by the path the host points its
	// diagnostic at: upstream["wallet"].url, retry.cap.
	var c sdk.ConfigChecker
	s.workers = c.Whole("workers", cfg.Workers, 0, maxWorkers)
	if s.workers == 0 {
		s.workers = min(runtime.NumCPU()*4, 64)
	}
	s.reserved = c.Whole("reserved_workers", cfg.Reserved, 0, maxWorkers)
	s.workQueue = c.Whole("work_queue", cfg.WorkQueue, 1, maxQueue)
	s.schedQueue = c.Whole("sched_queue", cfg.SchedQueue, 0, maxQueue)
	s.shedding = cfg.Shedding
	s.shedHold = c.Duration("shed_hold", cfg.ShedHold, 0, time.Hour)

	upstreams := map[string]bool{}
	for _, u := range cfg.Upstreams {
		at := fmt.Sprintf("upstream[%q]", u.Name)
		switch {
		case u.Name == "":
			c.Refuse(at, "an upstream's name must not be empty")
		case (u.Plugin == nil) == (u.URL == nil):
			c.Refuse(at, "needs exactly one of plugin and url")
		case u.Plugin != nil && *u.Plugin == "":
			c.Refuse(at+".plugin", "must not be empty")
		}
		upstreams[u.Name] = true
		us := upstreamSettings{name: u.Name}
		if u.Plugin != nil {
			us.plugin = *u.Plugin
		}
		if u.URL != nil {
			p, err := url.Parse(*u.URL)
			if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.RawQuery != "" || p.Fragment != "" || p.User != nil {
				c.Refuse(at+".url", "must be an http:// or https:// URL with a host and no query, fragment or credentials, got %q", *u.URL)
			}
			us.url = p
		}
		s.upstreams = append(s.upstreams, us)
	}

	for _, r := range cfg.Routes {
		at := fmt.Sprintf("route[%q]", r.Prefix)
		switch {
		case !strings.HasPrefix(r.Prefix, "/"):
			c.Refuse(at, "the prefix must start with /")
		case !upstreams[r.Upstream]:
			c.Refuse(at+".upstream", "upstream %q is not declared in an upstream block", r.Upstream)
		}
		cost := c.Whole(at+".cost", r.Cost, 1, maxCost)
		s.routes = append(s.routes, routeSettings{prefix: r.Prefix, upstream: r.Upstream, strip: r.StripPrefix, cost: cost, exempt: r.Exempt})
	}
	// The longest prefix wins.
	sortRoutes(s.routes)

	sums := map[[32]byte]string{}
	for _, t := range cfg.Tenants {
		at := fmt.Sprintf("tenant[%q]", t.Name)
		switch {
		case t.Name == "":
			c.Refuse(at, "a tenant's name must not be empty")
		case t.Name == defaultTenantName:
			c.Refuse(at, "%q is reserved for default_tenant", t.Name)
		}
		ts := checkTenant(&c, at, t)
		b, err := hex.DecodeString(t.APIKeySHA256)
		switch {
		case err != nil || len(b) != 32:
			c.Refuse(at+".api_key_sha256", "must be 64 hex digits (the SHA-256 of the key), got %d characters", len(t.APIKeySHA256))
		case sums[[32]byte(b)] != "":
			c.Refuse(at+".api_key_sha256", "is also tenant %q's", sums[[32]byte(b)])
		default:
			ts.keySum = [32]byte(b)
			sums[ts.keySum] = t.Name
		}
		s.tenants = append(s.tenants, ts)
	}
	if cfg.DefaultTenant != nil {
		t := *cfg.DefaultTenant
		t.Name = defaultTenantName
		ts := checkTenant(&c, "default_tenant", t)
		s.defaultTenant = &ts
	}

	d := defaultDecode
	if cfg.Decode != nil {
		d = *cfg.Decode
	}
	s.decode = inflate.Limits{
		RatioMax:   d.RatioMax,
		AbsCap:     int64(c.Whole("decode.abs_cap_bytes", d.AbsCapBytes, 1, 1<<30)),
		RatioAfter: int64(c.Whole("decode.ratio_after_bytes", d.RatioAfterBytes, 0, 1<<30)),
	}
	if !(d.RatioMax >= 1 && d.RatioMax <= 1e6) {
		c.Refuse("decode.ratio_max", "must be from 1 to 1000000, got %v", d.RatioMax)
	}

	r := defaultRetry
	if cfg.Retry != nil {
		r = *cfg.Retry
	}
	s.maxTries = c.Whole("retry.max_tries", r.MaxTries, 1, 10)
	s.backoff = c.Duration("retry.backoff", r.Backoff, time.Millisecond, time.Minute)
	s.backoffCap = c.Duration("retry.cap", r.Cap, s.backoff, time.Hour)

	b := defaultBreaker
	if cfg.Breaker != nil {
		b = *cfg.Breaker
	}
	c.Whole("breaker.failures", b.Failures, 1, 1<<20)
	c.Whole("breaker.probes", b.Probes, 1, 1024)
	c.Duration("breaker.window", b.Window, 100*time.Millisecond, time.Hour)
	c.Duration("breaker.cool_down", b.CoolDown, time.Millisecond, time.Hour)
	if !(b.FailureRate > 0 && b.FailureRate <= 1) {
		c.Refuse("breaker.failure_rate", "must be above 0 and at most 1, got %v", b.FailureRate)
	}
	s.breaker = b
	return s, c.Err()
}

// checkTenant checks the numbers of the tenant block at path.
func checkTenant(c *sdk.ConfigChecker, path string, t tenantConfig) tenantSettings {
	ts := tenantSettings{name: t.Name, rate: t.RatePerS}
	if !(t.RatePerS > 0 && t.RatePerS <= 1e6) {
		c.Refuse(path+".rate_per_s", "must be above 0 and at most 1000000, got %v", t.RatePerS)
	}
	ts.burst = c.Whole(path+".burst", t.Burst, 1, 1e6)
	ts.quantum = c.Whole(path+".quantum", t.Quantum, 1, maxCost)
	ts.mq = c.Whole(path+".max_queue", t.MaxQueue, 1, maxQueue)
	return ts
}

// sortRoutes orders routes longest prefix first.
func sortRoutes(rs []routeSettings) {
	slices.SortStableFunc(rs, func(a, b routeSettings) int { return len(b.prefix) - len(a.prefix) })
}
