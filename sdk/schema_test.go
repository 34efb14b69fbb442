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
		Routes:  []Route{{Method: "GET", Pattern: "/{$}"}},
		Handler: http.NotFoundHandler(),
	}
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
			p.Routes = []Route{
				{Method: "GET", Pattern: "/{$}"},
				{Method: "POST", Pattern: "/items/{id}", Timeout: time.Second},
				{Pattern: "/static/"},
				{Method: "GET", Pattern: "/events", Streaming: true},
			}
		}, ""},
		{"empty name", func(p *Plugin) { p.Name = "" }, `plugin name ""`},
		{"upper-case name", func(p *Plugin) { p.Name = "Hello" }, `plugin name "Hello"`},
		{"name starting with digit", func(p *Plugin) { p.Name = "1hello" }, `plugin name "1hello"`},
		{"name with slash", func(p *Plugin) { p.Name = "a/b" }, `plugin name "a/b"`},
		{"no version", func(p *Plugin) { p.Version = "" }, "version is empty"},
		{"nil handler", func(p *Plugin) { p.Handler = nil }, "handler is nil"},
		{"no routes", func(p *Plugin) { p.Routes = nil }, "no routes"},
		{"pattern without slash", func(p *Plugin) { p.Routes = []Route{{Pattern: "items"}} }, `route "items": pattern must start with /`},
		{"negative timeout", func(p *Plugin) { p.Routes = []Route{{Pattern: "/x", Timeout: -time.Second}} }, "negative timeout"},
		{"bad wildcard", func(p *Plugin) { p.Routes = []Route{{Pattern: "/items/{id"}} }, `route "/items/{id"`},
		{"duplicate route", func(p *Plugin) {
			p.Routes = []Route{{Method: "GET", Pattern: "/x"}, {Method: "GET", Pattern: "/x"}}
		}, `route "GET /x"`},
		{"method with space", func(p *Plugin) { p.Routes = []Route{{Method: "GE T", Pattern: "/x"}} }, `method "GE T" is not an HTTP token`},
		{"method with slash", func(p *Plugin) { p.Routes = []Route{{Method: "GET/x", Pattern: "/x"}} }, "not an HTTP token"},
		{"extension method", func(p *Plugin) { p.Routes = []Route{{Method: "PROPFIND", Pattern: "/x"}} }, ""},
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
		{"unknown type", Schema{Attrs: []Attr{{Name: "a", Type: "int"}}}, `attribute "a": unknown type "int"`},
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
		{"error inside block", Schema{Blocks: []Block{{Name: "b", Schema: Schema{Attrs: []Attr{{Name: "x", Type: "int"}}}}}}, `block "b": attribute "x": unknown type "int"`},
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
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("type = %q, want %q", tt.got, tt.want)
		}
		if !validType(tt.got) {
			t.Errorf("validType(%q) = false, want true", tt.got)
		}
	}
}
