package sdk

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
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
