package sdk

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

func validPlugin() Plugin {
	return Plugin{
		Name:    "hello",
		Version: "0.1.0",
		Routes:  muxWith(func(m *Mux) { m.Handle("GET /{$}", http.NotFoundHandler()) }),
	}
}

// muxWith returns a new Mux after register has declared its routes.
func muxWith(register func(m *Mux)) *Mux {
	m := NewMux()
	register(m)
	return m
}

// routesOf returns a Mux that serves each pattern with a NotFoundHandler.
func routesOf(patterns ...string) *Mux {
	return muxWith(func(m *Mux) {
		for _, p := range patterns {
			m.Handle(p, http.NotFoundHandler())
		}
	})
}

func TestPluginValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(p *Plugin)
		wantErr string // substring; empty means valid
	}{
		{"minimal", func(*Plugin) {}, ""},
		{"name with dash and digits", func(p *Plugin) { p.Name = "hello-2_b" }, ""},
		{"every route kind", func(p *Plugin) {
			p.Routes = muxWith(func(m *Mux) {
				m.Handle("GET /{$}", http.NotFoundHandler())
				m.Handle("POST /items/{id}", http.NotFoundHandler(), Timeout(time.Second))
				m.Handle("/static/", http.NotFoundHandler())
				m.Handle("GET /events", http.NotFoundHandler(), Streaming())
				m.Handle("POST /uploads/", http.NotFoundHandler(), MaxBody(8<<20))
				m.Handle("PUT /largest", http.NotFoundHandler(), MaxBody(32<<20), Timeout(time.Minute))
			})
		}, ""},
		{"empty name", func(p *Plugin) { p.Name = "" }, `plugin name ""`},
		{"upper-case name", func(p *Plugin) { p.Name = "Hello" }, `plugin name "Hello"`},
		{"name starting with digit", func(p *Plugin) { p.Name = "1hello" }, `plugin name "1hello"`},
		{"name with slash", func(p *Plugin) { p.Name = "a/b" }, `plugin name "a/b"`},
		{"no version", func(p *Plugin) { p.Version = "" }, "version is empty"},
		{"nil handler", func(p *Plugin) { p.Routes.Handle("GET /x", nil) }, `route "GET /x": handler is nil`},
		{"nil handler func", func(p *Plugin) { p.Routes.HandleFunc("GET /x", nil) }, `route "GET /x": handler is nil`},
		{"no mux", func(p *Plugin) { p.Routes = nil }, "no routes"},
		{"no routes", func(p *Plugin) { p.Routes = NewMux() }, "no routes"},
		{"pattern without slash", func(p *Plugin) { p.Routes = routesOf("items") }, `route "items": pattern must start with /`},
		{"host in pattern", func(p *Plugin) { p.Routes = routesOf("example.com/x") }, "pattern must start with /"},
		{"negative timeout", func(p *Plugin) {
			p.Routes = muxWith(func(m *Mux) { m.Handle("/x", http.NotFoundHandler(), Timeout(-time.Second)) })
		}, "negative timeout"},
		{"body limit over the ceiling", func(p *Plugin) {
			p.Routes = muxWith(func(m *Mux) { m.Handle("POST /x", http.NotFoundHandler(), MaxBody(32<<20+1)) })
		}, `route "/x": body limit 33554433 is over the host's ceiling of 33554432 bytes`},
		{"negative body limit", func(p *Plugin) {
			p.Routes = muxWith(func(m *Mux) { m.Handle("POST /x", http.NotFoundHandler(), MaxBody(-1)) })
		}, "negative body limit"},
		{"body limit on a route without a body", func(p *Plugin) {
			p.Routes = muxWith(func(m *Mux) { m.Handle("POST /x", http.NotFoundHandler(), NoBody(), MaxBody(1<<20)) })
		}, "a body limit on a route that takes no body"},
		{"bad wildcard", func(p *Plugin) { p.Routes = routesOf("/items/{id") }, `route "/items/{id"`},
		{"duplicate route", func(p *Plugin) { p.Routes = routesOf("GET /x", "GET /x") }, `route "GET /x"`},
		{"every bad route named", func(p *Plugin) { p.Routes = routesOf("GET /x", "items", "GET /x") }, `route "GET /x"`},
		{"method that is not a token", func(p *Plugin) { p.Routes = routesOf("GE(T) /x") }, `method "GE(T)" is not an HTTP token`},
		{"method with slash", func(p *Plugin) { p.Routes = routesOf("GET/x /x") }, "not an HTTP token"},
		{"extension method", func(p *Plugin) { p.Routes = routesOf("PROPFIND /x") }, ""},
		{"bad schema", func(p *Plugin) {
			p.Config = Schema{Attrs: []Attr{{Name: "Greeting", Type: TypeString}}}
		}, `config schema: attribute name "Greeting"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := validPlugin()
			tt.edit(&p)
			err := p.validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Plugin{Name: %q}.validate() = %v, want nil", p.Name, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Plugin{Name: %q}.validate() = %v, want error containing %q", p.Name, err, tt.wantErr)
			}
		})
	}
}

func TestSchemaToProtoErrors(t *testing.T) {
	tests := []struct {
		name    string
		schema  Schema
		wantErr string // substring; empty means valid
	}{
		{"empty", Schema{}, ""},
		{"all scalar and composite types", Schema{Attrs: []Attr{
			{Name: "s", Type: TypeString}, {Name: "n", Type: TypeNumber}, {Name: "b", Type: TypeBool},
			{Name: "d", Type: TypeDuration}, {Name: "l", Type: ListOf(TypeNumber)}, {Name: "m", Type: MapOf(TypeDuration)},
		}}, ""},
		{"required without default", Schema{Attrs: []Attr{{Name: "a", Type: TypeString, Required: true}}}, ""},
		{"attr name upper-case", Schema{Attrs: []Attr{{Name: "Greeting", Type: TypeString}}}, `attribute name "Greeting": want snake_case`},
		{"attr name with dash", Schema{Attrs: []Attr{{Name: "max-size", Type: TypeNumber}}}, `attribute name "max-size"`},
		{"attr name empty", Schema{Attrs: []Attr{{Name: "", Type: TypeNumber}}}, `attribute name ""`},
		{"attr declared twice", Schema{Attrs: []Attr{{Name: "a", Type: TypeString}, {Name: "a", Type: TypeNumber}}}, `attribute "a" declared twice`},
		{"unknown type", Schema{Attrs: []Attr{{Name: "a", Type: "integer"}}}, `attribute "a": unknown type "integer"`},
		{"int", Schema{Attrs: []Attr{{Name: "a", Type: TypeInt, Default: 3}}}, ""},
		{"list of int", Schema{Attrs: []Attr{{Name: "a", Type: ListOf(TypeInt), Default: []int{1, 2}}}}, ""},
		{"fractional int default", Schema{Attrs: []Attr{{Name: "a", Type: TypeInt, Default: 1.5}}}, "1.5 is not a whole number"},
		{"fractional map(int) default", Schema{Attrs: []Attr{{Name: "a", Type: MapOf(TypeInt), Default: map[string]float64{"x": 0.5}}}}, "not a whole number"},
		{"empty type", Schema{Attrs: []Attr{{Name: "a"}}}, `unknown type ""`},
		{"list of list", Schema{Attrs: []Attr{{Name: "a", Type: ListOf(ListOf(TypeString))}}}, `unknown type "list(list(string))"`},
		{"map of list", Schema{Attrs: []Attr{{Name: "a", Type: MapOf(ListOf(TypeString))}}}, "unknown type"},
		{"list unclosed", Schema{Attrs: []Attr{{Name: "a", Type: "list(string"}}}, "unknown type"},
		{"list empty", Schema{Attrs: []Attr{{Name: "a", Type: "list()"}}}, "unknown type"},
		{"list trailing text", Schema{Attrs: []Attr{{Name: "a", Type: "list(string)x"}}}, "unknown type"},
		{"required with default", Schema{Attrs: []Attr{{Name: "a", Type: TypeString, Required: true, Default: "x"}}}, `attribute "a": required attributes take no default`},
		{"default not encodable", Schema{Attrs: []Attr{{Name: "a", Type: TypeNumber, Default: math.Inf(1)}}}, `attribute "a": encode default`},
		{"default of the wrong type", Schema{Attrs: []Attr{{Name: "a", Type: TypeNumber, Default: "ten"}}}, `attribute "a": default "ten": does not match type number`},
		{"default duration unparsable", Schema{Attrs: []Attr{{Name: "a", Type: TypeDuration, Default: "soon"}}}, `attribute "a": default "soon"`},
		{"default list element wrong", Schema{Attrs: []Attr{{Name: "a", Type: ListOf(TypeBool), Default: []any{true, "x"}}}}, "does not match type bool"},
		{"default map fits", Schema{Attrs: []Attr{{Name: "a", Type: MapOf(TypeDuration), Default: map[string]string{"x": "1s"}}}}, ""},
		{"block name bad", Schema{Blocks: []Block{{Name: "Upstream"}}}, `block name "Upstream"`},
		{"block clashes with attr", Schema{Attrs: []Attr{{Name: "a", Type: TypeString}}, Blocks: []Block{{Name: "a"}}}, `name "a" declared twice`},
		{"block declared twice", Schema{Blocks: []Block{{Name: "b"}, {Name: "b", List: true}}}, `name "b" declared twice`},
		{"error inside block", Schema{Blocks: []Block{{Name: "b", Schema: Schema{Attrs: []Attr{{Name: "x", Type: "integer"}}}}}}, `block "b": attribute "x": unknown type "integer"`},
		{"labelled list", Schema{Blocks: []Block{{Name: "upstream", Labels: []string{"name"}, List: true, Schema: Schema{Attrs: []Attr{{Name: "url", Type: TypeString}}}}}}, ""},
		{"two labels on a single block", Schema{Blocks: []Block{{Name: "cert", Labels: []string{"kind", "name"}}}}, ""},
		{"label name bad", Schema{Blocks: []Block{{Name: "upstream", Labels: []string{"Name"}}}}, `block "upstream": label name "Name": want snake_case`},
		{"label name empty", Schema{Blocks: []Block{{Name: "upstream", Labels: []string{""}}}}, `label name ""`},
		{"label declared twice", Schema{Blocks: []Block{{Name: "cert", Labels: []string{"name", "name"}}}}, `block "cert": label "name" declared twice`},
		{"label is also an attribute", Schema{Blocks: []Block{{Name: "upstream", Labels: []string{"name"}, Schema: Schema{Attrs: []Attr{{Name: "name", Type: TypeString}}}}}}, `block "upstream": label "name" is also declared in the block's body`},
		{"label is also a block", Schema{Blocks: []Block{{Name: "upstream", Labels: []string{"tls"}, Schema: Schema{Blocks: []Block{{Name: "tls"}}}}}}, `label "tls" is also declared`},
		{"bad label in nested block", Schema{Blocks: []Block{{Name: "a", Schema: Schema{Blocks: []Block{{Name: "b", Labels: []string{"x-y"}}}}}}}, `block "a": block "b": label name "x-y"`},
		{"label named as an outer attribute is fine", Schema{Attrs: []Attr{{Name: "name", Type: TypeString}}, Blocks: []Block{{Name: "upstream", Labels: []string{"name"}}}}, ""},
		{"same name in nested block is fine", Schema{Attrs: []Attr{{Name: "a", Type: TypeString}}, Blocks: []Block{{Name: "b", Schema: Schema{Attrs: []Attr{{Name: "a", Type: TypeString}}}}}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.schema.toProto()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Schema.toProto() = %v, want nil error", err)
			case tt.wantErr == "" && got == nil:
				t.Errorf("Schema.toProto() = nil, nil, want a schema")
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Schema.toProto() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestListOfMapOf(t *testing.T) {
	tests := []struct {
		got, want Type
	}{
		{ListOf(TypeString), "list(string)"},
		{ListOf(TypeDuration), "list(duration)"},
		{MapOf(TypeNumber), "map(number)"},
		{MapOf(TypeBool), "map(bool)"},
		{ListOf(TypeInt), "list(int)"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("type = %q, want %q", tt.got, tt.want)
		}
		if _, _, err := ParseType(tt.got); err != nil {
			t.Errorf("ParseType(%q) = %v, want nil", tt.got, err)
		}
	}
}

func TestParseType(t *testing.T) {
	tests := []struct {
		in         Type
		wantShape  Shape
		wantScalar Type
		wantErr    bool
	}{
		{in: "string", wantShape: ShapeScalar, wantScalar: TypeString},
		{in: "number", wantShape: ShapeScalar, wantScalar: TypeNumber},
		{in: "int", wantShape: ShapeScalar, wantScalar: TypeInt},
		{in: "bool", wantShape: ShapeScalar, wantScalar: TypeBool},
		{in: "duration", wantShape: ShapeScalar, wantScalar: TypeDuration},
		{in: "list(int)", wantShape: ShapeList, wantScalar: TypeInt},
		{in: "map(duration)", wantShape: ShapeMap, wantScalar: TypeDuration},
		{in: "", wantErr: true},
		{in: "integer", wantErr: true},
		{in: "list(list(int))", wantErr: true},
		{in: "list(int", wantErr: true},
		{in: "list()", wantErr: true},
		{in: "list(int)x", wantErr: true},
		{in: "set(int)", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(string(tt.in), func(t *testing.T) {
			shape, scalar, err := ParseType(tt.in)
			if tt.wantErr {
				if err == nil {
					t.Errorf("ParseType(%q) = %v, %q, nil, want an error", tt.in, shape, scalar)
				}
				return
			}
			if err != nil || shape != tt.wantShape || scalar != tt.wantScalar {
				t.Errorf("ParseType(%q) = %v, %q, %v, want %v, %q, nil", tt.in, shape, scalar, err, tt.wantShape, tt.wantScalar)
			}
		})
	}
}

// TestSchemaLabelsRoundTrip sends a schema with labelled blocks through
// the protobuf encoding the host receives, and reads the labels back.
func TestSchemaLabelsRoundTrip(t *testing.T) {
	s := Schema{Blocks: []Block{
		{Name: "upstream", Labels: []string{"name"}, List: true, Schema: Schema{
			Attrs:  []Attr{{Name: "url", Type: TypeString}},
			Blocks: []Block{{Name: "header", Labels: []string{"scope", "key"}, List: true}},
		}},
		{Name: "tls"},
	}}
	p, err := s.toProto()
	if err != nil {
		t.Fatalf("toProto() = %v", err)
	}
	b, err := proto.Marshal(p)
	if err != nil {
		t.Fatalf("proto.Marshal() = %v", err)
	}
	var got pluginv1.Schema
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatalf("proto.Unmarshal() = %v", err)
	}
	if diff := cmp.Diff(p, &got, protocmp.Transform()); diff != "" {
		t.Errorf("schema after a round trip (-sent +received):\n%s", diff)
	}
	for _, c := range []struct {
		got  []string
		want []string
	}{
		{got.GetBlocks()[0].GetLabels(), []string{"name"}},
		{got.GetBlocks()[0].GetBody().GetBlocks()[0].GetLabels(), []string{"scope", "key"}},
		{got.GetBlocks()[1].GetLabels(), nil},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("labels after a round trip = %q, want %q", c.got, c.want)
		}
	}
	if !s.hasLabels() || (Schema{Blocks: []Block{{Name: "tls"}}}).hasLabels() {
		t.Errorf("hasLabels() does not tell a labelled schema from one without labels")
	}
	nested := Schema{Blocks: []Block{{Name: "a", Schema: Schema{Blocks: []Block{{Name: "b", Labels: []string{"n"}}}}}}}
	if !nested.hasLabels() {
		t.Errorf("hasLabels() = false for labels in a nested block, want true")
	}
}

func TestParseConfigPath(t *testing.T) {
	tests := []struct {
		path string
		want []PathStep
	}{
		{"", nil},
		{"port", []PathStep{{Name: "port"}}},
		{"tls.cert", []PathStep{{Name: "tls"}, {Name: "cert"}}},
		{"upstream[0]", []PathStep{{Name: "upstream", Indexed: true}}},
		{"upstream[12].url", []PathStep{{Name: "upstream", Index: 12, Indexed: true}, {Name: "url"}}},
		{`upstream["wallet"].url`, []PathStep{{Name: "upstream", Labels: []string{"wallet"}}, {Name: "url"}}},
		{`route["/api/"]`, []PathStep{{Name: "route", Labels: []string{"/api/"}}}},
		{`cert["a"]["b\"]."].key`, []PathStep{{Name: "cert", Labels: []string{"a", `b"].`}}, {Name: "key"}}},
		{`x[""]`, []PathStep{{Name: "x", Labels: []string{""}}}},
		{`approver["\u00e9"]`, []PathStep{{Name: "approver", Labels: []string{"é"}}}},
		{"a.b.c", []PathStep{{Name: "a"}, {Name: "b"}, {Name: "c"}}},
		{"max-size", []PathStep{{Name: "max-size"}}},
	}
	for _, tt := range tests {
		got, err := ParseConfigPath(tt.path)
		if err != nil {
			t.Errorf("ParseConfigPath(%q) = %v", tt.path, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("ParseConfigPath(%q) mismatch (-want +got):\n%s", tt.path, diff)
		}
		// What fmt's %q writes reads back.
		for _, st := range got {
			for _, l := range st.Labels {
				again, err := ParseConfigPath(fmt.Sprintf("b[%q]", l))
				if err != nil || again[0].Labels[0] != l {
					t.Errorf("ParseConfigPath(b[%q]) = %v, %v, want label %q", l, again, err, l)
				}
			}
		}
	}
	for _, bad := range []string{".", "a.", ".a", "a..b", "a[", "a[]", "a[x]", "a[-1]", `a["x"`, `a["x]`, `a[0]["x"]`, `a["x"][0]`, "a[0][1]", "a b", "a[0]b", `a['x']`, "a[`x`]", "[0]", "a.[0]"} {
		if got, err := ParseConfigPath(bad); err == nil {
			t.Errorf("ParseConfigPath(%q) = %+v, nil, want an error", bad, got)
		}
	}
}

// FuzzParseConfigPath checks that no path a plugin writes panics the
// parser the host runs on it, and that a path it reads, written out
// again, reads the same.
func FuzzParseConfigPath(f *testing.F) {
	for _, seed := range []string{`upstream["wallet"].url`, "upstream[0].url", `cert["a"]["b"]`, "a.b.c", `x["\u00e9\n"]`, "a[", `a["`, "a[01]"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, path string) {
		steps, err := ParseConfigPath(path)
		if err != nil {
			return
		}
		var b strings.Builder
		for i, st := range steps {
			if i > 0 {
				b.WriteString(".")
			}
			b.WriteString(st.Name)
			if st.Indexed {
				fmt.Fprintf(&b, "[%d]", st.Index)
			}
			for _, l := range st.Labels {
				fmt.Fprintf(&b, "[%q]", l)
			}
		}
		again, err := ParseConfigPath(b.String())
		if err != nil {
			t.Fatalf("ParseConfigPath(%q) = %v, after ParseConfigPath(%q) = %+v", b.String(), err, path, steps)
		}
		if diff := cmp.Diff(steps, again, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("ParseConfigPath(%q) then again (-first +again):\n%s", path, diff)
		}
	})
}
