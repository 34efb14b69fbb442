package route_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/sdk/route"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    route.Route
		wantErr string
	}{
		{in: "/items/{id}", want: route.Route{Pattern: "/items/{id}"}},
		{in: "GET /items/{id}", want: route.Route{Method: "GET", Pattern: "/items/{id}"}},
		{in: "POST \t /x", want: route.Route{Method: "POST", Pattern: "/x"}},
		{in: "items", wantErr: "must start with /"},
		{in: "", wantErr: "must start with /"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := route.Parse(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) = %v, %v, want an error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q) = %v, want nil", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Parse(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestAdd(t *testing.T) {
	tests := []struct {
		name    string
		routes  []route.Route
		wantErr string // about the last route; "" accepts it
	}{
		{name: "valid", routes: []route.Route{{Method: "GET", Pattern: "/{$}"}}},
		{name: "extension method", routes: []route.Route{{Method: "PROPFIND", Pattern: "/x"}}},
		{name: "pattern without slash", routes: []route.Route{{Pattern: "items"}}, wantErr: `route "items": pattern must start with /`},
		{name: "host pattern", routes: []route.Route{{Pattern: "example.com/x"}}, wantErr: "must start with /"},
		{name: "negative timeout", routes: []route.Route{{Pattern: "/x", Timeout: -time.Second}}, wantErr: "negative timeout"},
		{name: "sub-millisecond timeout", routes: []route.Route{{Pattern: "/x", Timeout: 500 * time.Microsecond}}, wantErr: "whole number of milliseconds"},
		{name: "body limit", routes: []route.Route{{Method: "POST", Pattern: "/x", MaxBody: 8 << 20}}},
		{name: "body limit at the ceiling", routes: []route.Route{{Method: "POST", Pattern: "/x", MaxBody: route.MaxBodyCeiling}}},
		{name: "body limit over the ceiling", routes: []route.Route{{Method: "POST", Pattern: "/x", MaxBody: route.MaxBodyCeiling + 1}}, wantErr: "over the host's ceiling of 33554432 bytes"},
		{name: "negative body limit", routes: []route.Route{{Method: "POST", Pattern: "/x", MaxBody: -1}}, wantErr: "negative body limit"},
		{name: "body limit without a body", routes: []route.Route{{Method: "POST", Pattern: "/x", MaxBody: 1, NoBody: true}}, wantErr: "a body limit on a route that takes no body"},
		{name: "bad wildcard", routes: []route.Route{{Pattern: "/items/{id"}}, wantErr: `route "/items/{id"`},
		{name: "method with space", routes: []route.Route{{Method: "GE T", Pattern: "/x"}}, wantErr: `method "GE T" is not an HTTP token`},
		{name: "method with slash", routes: []route.Route{{Method: "GET/x", Pattern: "/x"}}, wantErr: "not an HTTP token"},
		{name: "duplicate", routes: []route.Route{{Method: "GET", Pattern: "/x"}, {Method: "GET", Pattern: "/x"}}, wantErr: `route "GET /x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tab route.Table
			var err error
			for _, r := range tt.routes {
				err = tab.Add(r)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Add(%v) = %v, want nil", tt.routes[len(tt.routes)-1], err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Add(%v) = %v, want an error containing %q", tt.routes[len(tt.routes)-1], err, tt.wantErr)
			}
			if got, want := tab.Len(), len(tt.routes)-1; got != want {
				t.Errorf("Len() after a refused Add = %d, want %d", got, want)
			}
		})
	}
}

func TestMatch(t *testing.T) {
	var tab route.Table
	for _, r := range []route.Route{
		{Method: "GET", Pattern: "/{$}"},
		{Method: "GET", Pattern: "/items/{id}", Timeout: time.Second},
		{Method: "POST", Pattern: "/items/"},
		{Pattern: "/any/{rest...}", Streaming: true},
	} {
		if err := tab.Add(r); err != nil {
			t.Fatalf("Add(%v) = %v", r, err)
		}
	}
	tests := []struct {
		method, path string
		wantPattern  string
		wantErr      error
	}{
		{"GET", "/", "GET /{$}", nil},
		{"HEAD", "/", "GET /{$}", nil}, // ServeMux serves HEAD with GET routes
		{"GET", "/items/7", "GET /items/{id}", nil},
		{"POST", "/items/7", "POST /items/", nil},
		{"DELETE", "/any/a/b", "/any/{rest...}", nil},
		{"PUT", "/items/7", "", route.ErrMethodNotAllowed},
		{"POST", "/", "", route.ErrMethodNotAllowed},
		{"GET", "/nothing", "", route.ErrNotFound},
		{"GET", "/a/../items/1", "", route.ErrNotFound}, // ServeMux redirects unclean paths
		{"GET", "", "", route.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			r, pat, err := tab.Match(tt.method, tt.path)
			if !errors.Is(err, tt.wantErr) || pat != tt.wantPattern {
				t.Fatalf("Match(%q, %q) = %q, %v, want %q, %v", tt.method, tt.path, pat, err, tt.wantPattern, tt.wantErr)
			}
			if err == nil && r.String() != pat {
				t.Errorf("Match(%q, %q) route = %v, want the route of %q", tt.method, tt.path, r, pat)
			}
		})
	}
	t.Run("allow", func(t *testing.T) {
		for _, tt := range []struct{ method, path, want string }{
			{"PUT", "/items/7", "GET, HEAD, POST"},
			{"POST", "/", "GET, HEAD"},
		} {
			_, _, err := tab.Match(tt.method, tt.path)
			var me *route.MethodError
			if !errors.As(err, &me) || me.Allow != tt.want {
				t.Errorf("Match(%q, %q) = %v, want a *MethodError allowing %q", tt.method, tt.path, err, tt.want)
			}
		}
	})
	t.Run("timeout and streaming", func(t *testing.T) {
		r, _, err := tab.Match("GET", "/items/1")
		if err != nil || r.Timeout != time.Second || r.Streaming {
			t.Errorf("Match(GET, /items/1) = %+v, %v, want the 1s non-streaming route", r, err)
		}
		r, _, err = tab.Match("GET", "/any/x")
		if err != nil || !r.Streaming {
			t.Errorf("Match(GET, /any/x) = %+v, %v, want the streaming route", r, err)
		}
	})
	t.Run("empty table", func(t *testing.T) {
		var empty route.Table
		if _, _, err := empty.Match("GET", "/"); !errors.Is(err, route.ErrNotFound) {
			t.Errorf("Match on an empty table = %v, want ErrNotFound", err)
		}
	})
}

func TestServeHTTP(t *testing.T) {
	var tab route.Table
	err := tab.Handle(route.Route{Method: "GET", Pattern: "/items/{id}"}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.Pattern + " " + r.PathValue("id")))
	}))
	if err != nil {
		t.Fatalf("Handle() = %v", err)
	}
	tests := []struct {
		method, path string
		wantCode     int
		wantBody     string
	}{
		{"GET", "/items/7", http.StatusOK, "GET /items/{id} 7"},
		{"POST", "/items/7", http.StatusMethodNotAllowed, ""},
		{"GET", "/other", http.StatusNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tab.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
			if rec.Code != tt.wantCode || (tt.wantBody != "" && rec.Body.String() != tt.wantBody) {
				t.Errorf("ServeHTTP(%s %s) = %d %q, want %d %q", tt.method, tt.path, rec.Code, rec.Body, tt.wantCode, tt.wantBody)
			}
		})
	}
}

// TestMatchAllocs checks that Match reuses its request. A wildcard's
// values are ServeMux's own allocation, so the route here has none.
func TestMatchAllocs(t *testing.T) {
	var tab route.Table
	if err := tab.Add(route.Route{Method: "GET", Pattern: "/items/list"}); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := tab.Match("GET", "/items/list"); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("Match of a declared route allocates %v times, want 0", allocs)
	}
}

// A Table is built from route declarations and tells a match from a
// missing path and from a method the path does not allow.
func ExampleTable() {
	var tab route.Table
	for _, r := range []route.Route{
		{Method: "GET", Pattern: "/items/{id}"},
		{Method: "GET", Pattern: "/events", Streaming: true},
	} {
		if err := tab.Add(r); err != nil {
			panic(err)
		}
	}
	r, pattern, _ := tab.Match("GET", "/events")
	fmt.Println(pattern, r.Streaming)
	_, _, err := tab.Match("POST", "/items/1")
	fmt.Println(err)
	_, _, err = tab.Match("GET", "/nowhere")
	fmt.Println(err)
	// Output:
	// GET /events true
	// the path does not allow the method; it allows GET, HEAD
	// no route matches the path
}
