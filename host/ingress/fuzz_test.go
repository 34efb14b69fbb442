package ingress

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/route"
)

// fakeTarget is a Target with a fixed mount and manifest and no process:
// the matcher and route lookup never touch the connection.
type fakeTarget struct {
	spec     supervisor.Spec
	manifest *pluginv1.DescribeResponse
}

func (f *fakeTarget) Name() string                         { return f.spec.Name }
func (f *fakeTarget) Spec() supervisor.Spec                { return f.spec }
func (f *fakeTarget) Endpoint() *supervisor.Endpoint       { return nil }
func (f *fakeTarget) Manifest() *pluginv1.DescribeResponse { return f.manifest }
func (f *fakeTarget) Status() supervisor.Status {
	return supervisor.Status{Name: f.spec.Name, State: supervisor.StateStarting, Mount: f.spec.Mount}
}

// fuzzMounts are mounts as the config allows them, plus a nested pair to
// check that the longest mount wins.
var fuzzMounts = []string{"/hello", "/api", "/api/v2", "/a-b_c"}

func fuzzIngress() *Ingress {
	g := New(hclog.NewNullLogger(), metrics.New(), Limits{MaxBodyBytes: 1024})
	var ts []Target
	for _, m := range fuzzMounts {
		name := strings.ReplaceAll(strings.TrimPrefix(m, "/"), "/", "-")
		ts = append(ts, &fakeTarget{
			spec: supervisor.Spec{Name: name, Mount: m},
			manifest: &pluginv1.DescribeResponse{Name: name, Version: "1", Routes: []*pluginv1.Route{
				{Method: "GET", Pattern: "/{$}"},
				{Method: "GET", Pattern: "/items/{id}"},
				{Method: "POST", Pattern: "/items/"},
				{Pattern: "/any/{rest...}", Streaming: true, TimeoutMs: 1000},
			}},
		})
	}
	g.Update(ts)
	return g
}

// FuzzMatch checks that any request path resolves to at most one mount, on
// a segment boundary, preferring the longest, and never panics.
func FuzzMatch(f *testing.F) {
	for _, s := range []string{"/", "", "/hello", "/hello/", "/hellox", "/hello/x/y", "/api", "/api/v2",
		"/api/v2/items/1", "/api/v20", "//hello", "/hello/../api", "/%2e%2e/", "/a-b_c/any/x", "hello"} {
		f.Add(s)
	}
	g := fuzzIngress()
	t0 := g.table.Load()
	f.Fuzz(func(t *testing.T, p string) {
		e, rest := t0.match(p)
		var best string
		for _, m := range fuzzMounts {
			if (p == m || strings.HasPrefix(p, m+"/")) && len(m) > len(best) {
				best = m
			}
		}
		if e == nil {
			if best != "" {
				t.Fatalf("match(%q) = nil, want mount %q", p, best)
			}
			return
		}
		if e.mount != best {
			t.Fatalf("match(%q) = mount %q, want %q", p, e.mount, best)
		}
		if !strings.HasPrefix(rest, "/") {
			t.Fatalf("match(%q) rest = %q, want a path starting with /", p, rest)
		}
		if want := strings.TrimPrefix(p, e.mount); want != rest && !(want == "" && rest == "/") {
			t.Fatalf("match(%q) rest = %q, want %q", p, rest, want)
		}
	})
}

// FuzzLookup checks that matching any method and path against a plugin's
// routes never panics and answers a route, 404 or 405.
func FuzzLookup(f *testing.F) {
	for _, s := range []struct{ method, path string }{
		{"GET", "/"}, {"POST", "/"}, {"GET", "/items/1"}, {"POST", "/items/"}, {"PUT", "/items/x"},
		{"GET", "/any/a/b"}, {"DELETE", "/any/"}, {"GET", "/a/../items/1"}, {"GET", "//"}, {"", ""},
		{"GET", "/items/%zz"}, {"G\x00T", "/\x00"}, {"HEAD", "/"}, {"CONNECT", "/items/1"},
	} {
		f.Add(s.method, s.path)
	}
	g := fuzzIngress()
	routes := g.table.Load().byName["hello"].routes
	f.Fuzz(func(t *testing.T, method, path string) {
		rt, pattern, err := routes.Match(method, path)
		switch {
		case err == nil:
			if pattern == "" || rt == nil || rt.String() != pattern {
				t.Fatalf("Match(%q, %q) = %v, %q, want a route and its pattern", method, path, rt, pattern)
			}
		case errors.Is(err, route.ErrNotFound), errors.Is(err, route.ErrMethodNotAllowed):
		default:
			t.Fatalf("Match(%q, %q) = %v, want a route, ErrNotFound or ErrMethodNotAllowed", method, path, err)
		}
	})
}

// FuzzBuildRoutes checks that routes a plugin declares, which the host does
// not trust, never crash the host, however malformed.
func FuzzBuildRoutes(f *testing.F) {
	for _, s := range []struct{ method, pattern, path string }{
		{"GET", "/{$}", "/"},
		{"", "/items/{id}", "/items/1"},
		{"GET", "/{", "/"},
		{"GE T", "/x", "/x"},
		{"GET", "example.com/x", "/x"},
		{"GET", "/{a}/{a}", "/1/2"},
		{"", "", "/"},
		{"GET", "/x/{rest...}/y", "/x/1/y"},
	} {
		f.Add(s.method, s.pattern, s.path)
	}
	g := New(hclog.NewNullLogger(), metrics.New(), Limits{})
	f.Fuzz(func(t *testing.T, method, pattern, path string) {
		m := &pluginv1.DescribeResponse{Routes: []*pluginv1.Route{
			{Method: method, Pattern: pattern},
			{Method: "GET", Pattern: "/ok"}, // a second route still registers
			{Method: method, Pattern: pattern},
		}}
		routes := g.buildRoutes("fuzz", m)
		// A malformed or conflicting route is dropped, not the others.
		if _, _, err := routes.Match(http.MethodGet, "/ok"); err != nil {
			t.Fatalf("after buildRoutes with route %q %q, Match(GET, /ok) = %v, want the valid route", method, pattern, err)
		}
		_, _, _ = routes.Match(method, path)
	})
}
