package config

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/plughost/plughost/proto/pluginv1"
)

// greeterSchema exercises every type and nesting a plugin may declare.
func greeterSchema() *pluginv1.Schema {
	return &pluginv1.Schema{
		Attributes: []*pluginv1.Attribute{
			{Name: "greeting", Type: "string", Required: true},
			{Name: "repeat", Type: "number", DefaultJson: "1"},
			{Name: "loud", Type: "bool", DefaultJson: "false"},
			{Name: "timeout", Type: "duration", DefaultJson: `"5s"`},
			{Name: "tags", Type: "list(string)"},
			{Name: "weights", Type: "map(number)"},
			{Name: "backoffs", Type: "list(duration)", DefaultJson: `["1s"]`},
			{Name: "start", Type: "int", DefaultJson: "0"},
			{Name: "counts", Type: "map(int)"},
		},
		Blocks: []*pluginv1.Block{
			{
				Name:    "tls",
				Nesting: pluginv1.Block_NESTING_SINGLE,
				Body: &pluginv1.Schema{Attributes: []*pluginv1.Attribute{
					{Name: "cert", Type: "string", Required: true},
					{Name: "key", Type: "string", Required: true},
				}},
			},
			{
				Name:    "upstream",
				Nesting: pluginv1.Block_NESTING_LIST,
				Body: &pluginv1.Schema{Attributes: []*pluginv1.Attribute{
					{Name: "url", Type: "string", Required: true},
					{Name: "weight", Type: "number", DefaultJson: "1"},
				}},
			},
		},
	}
}

// hostFile wraps a plugin's config block in a host config file: the block
// starts on line 3, its first attribute is on line 4.
func hostFile(config string) string {
	return "plugin \"greeter\" {\n  path = \"greeter\"\n  config {\n" + config + "  }\n}\n"
}

func TestDecodePluginConfig(t *testing.T) {
	const filename = "file.hcl"
	requiredBlock := &pluginv1.Schema{Blocks: []*pluginv1.Block{
		{Name: "tls", Nesting: pluginv1.Block_NESTING_SINGLE, Required: true},
	}}
	requiredList := &pluginv1.Schema{Blocks: []*pluginv1.Block{
		{Name: "upstream", Nesting: pluginv1.Block_NESTING_LIST, Required: true},
	}}
	badSchema := &pluginv1.Schema{Attributes: []*pluginv1.Attribute{{Name: "port", Type: "integer"}}}

	tests := []struct {
		name   string
		src    string // a host config file with one plugin
		schema *pluginv1.Schema
		want   string // JSON, when no error is expected
		// When summary is set, the first error must contain it and sit on line.
		summary string
		line    int
	}{
		{
			name:   "defaults",
			src:    hostFile("    greeting = \"hi\"\n"),
			schema: greeterSchema(),
			want:   `{"backoffs":["1s"],"counts":null,"greeting":"hi","loud":false,"repeat":1,"start":0,"tags":null,"timeout":"5s","tls":null,"upstream":[],"weights":null}`,
		},
		{
			name: "every value set",
			src: hostFile(`    greeting = "hi"
    repeat   = 2.5
    loud     = true
    timeout  = "250ms"
    tags     = ["a", "b"]
    weights  = { east = 1, west = 2 }
    backoffs = ["1s", "2m"]
    tls {
      cert = "c.pem"
      key  = "k.pem"
    }
    upstream {
      url = "http://a"
    }
    upstream {
      url    = "http://b"
      weight = 3
    }
`),
			schema: greeterSchema(),
			want:   `{"backoffs":["1s","2m"],"counts":null,"greeting":"hi","loud":true,"repeat":2.5,"start":0,"tags":["a","b"],"timeout":"250ms","tls":{"cert":"c.pem","key":"k.pem"},"upstream":[{"url":"http://a","weight":1},{"url":"http://b","weight":3}],"weights":{"east":1,"west":2}}`,
		},
		{
			name:   "nil schema, no config block",
			src:    "plugin \"a\" {\n  path = \"a\"\n}\n",
			schema: nil,
			want:   `{}`,
		},
		{
			name:    "wrong type",
			src:     hostFile("    greeting = \"hi\"\n    repeat   = \"often\"\n"),
			schema:  greeterSchema(),
			summary: "Incorrect attribute value type",
			line:    5,
		},
		{
			name:    "wrong type for bool",
			src:     hostFile("    greeting = \"hi\"\n\n    loud = \"very\"\n"),
			schema:  greeterSchema(),
			summary: "Incorrect attribute value type",
			line:    6,
		},
		{
			name:    "wrong element type",
			src:     hostFile("    greeting = \"hi\"\n    weights  = { east = \"near\" }\n"),
			schema:  greeterSchema(),
			summary: "Incorrect attribute value type",
			line:    5,
		},
		{
			name:    "unknown attribute",
			src:     hostFile("    greeting = \"hi\"\n    colour   = \"blue\"\n"),
			schema:  greeterSchema(),
			summary: "Unsupported argument",
			line:    5,
		},
		{
			name:    "unknown block",
			src:     hostFile("    greeting = \"hi\"\n    cache {\n    }\n"),
			schema:  greeterSchema(),
			summary: "Unsupported block type",
			line:    5,
		},
		{
			name:    "attribute with nil schema",
			src:     hostFile("    greeting = \"hi\"\n"),
			schema:  nil,
			summary: "Unsupported argument",
			line:    4,
		},
		{
			name:    "required attribute missing",
			src:     hostFile("    repeat = 2\n"),
			schema:  greeterSchema(),
			summary: "Missing required argument",
			line:    3,
		},
		{
			name:    "required attribute missing without config block",
			src:     "\nplugin \"greeter\" {\n  path = \"greeter\"\n}\n",
			schema:  greeterSchema(),
			summary: "Missing required argument",
			line:    2,
		},
		{
			name:    "invalid duration",
			src:     hostFile("    greeting = \"hi\"\n    timeout  = \"soon\"\n"),
			schema:  greeterSchema(),
			summary: "Invalid duration",
			line:    5,
		},
		{
			name:   "ints",
			src:    hostFile("    greeting = \"hi\"\n    start = -3\n    counts = { a = 1, b = 1e3 }\n"),
			schema: greeterSchema(),
			want:   `{"backoffs":["1s"],"counts":{"a":1,"b":1000},"greeting":"hi","loud":false,"repeat":1,"start":-3,"tags":null,"timeout":"5s","tls":null,"upstream":[],"weights":null}`,
		},
		{
			name:    "fractional int",
			src:     hostFile("    greeting = \"hi\"\n    start = 1.5\n"),
			schema:  greeterSchema(),
			summary: "Invalid whole number",
			line:    5,
		},
		{
			name:    "fractional int in map",
			src:     hostFile("    greeting = \"hi\"\n    counts = {\n      a = 1\n      b = 0.25\n    }\n"),
			schema:  greeterSchema(),
			summary: "Invalid whole number",
			line:    5,
		},
		{
			name:    "int that is a string",
			src:     hostFile("    greeting = \"hi\"\n    start = \"one\"\n"),
			schema:  greeterSchema(),
			summary: "Incorrect attribute value type",
			line:    5,
		},
		{
			name:    "invalid duration in list",
			src:     hostFile("    greeting = \"hi\"\n    backoffs = [\"1s\",\n      \"2 minutes\"]\n"),
			schema:  greeterSchema(),
			summary: "Invalid duration",
			line:    5,
		},
		{
			name:    "required attribute missing in single block",
			src:     hostFile("    greeting = \"hi\"\n    tls {\n      cert = \"c.pem\"\n    }\n"),
			schema:  greeterSchema(),
			summary: "Missing required argument",
			line:    5,
		},
		{
			name:    "wrong type in list block",
			src:     hostFile("    greeting = \"hi\"\n    upstream {\n      url = \"u\"\n    }\n    upstream {\n      url    = \"v\"\n      weight = \"heavy\"\n    }\n"),
			schema:  greeterSchema(),
			summary: "Incorrect attribute value type",
			line:    10,
		},
		{
			name:    "duplicate single block",
			src:     hostFile("    greeting = \"hi\"\n    tls {\n      cert = \"c\"\n      key  = \"k\"\n    }\n    tls {\n      cert = \"c\"\n      key  = \"k\"\n    }\n"),
			schema:  greeterSchema(),
			summary: "Duplicate tls block",
			line:    9,
		},
		{
			name:    "required block missing",
			src:     hostFile(""),
			schema:  requiredBlock,
			summary: "Missing tls block",
			line:    3,
		},
		{
			name:    "required list block missing",
			src:     hostFile(""),
			schema:  requiredList,
			summary: "Insufficient upstream blocks",
			line:    3,
		},
		{
			name:    "variable",
			src:     hostFile("    greeting = var.name\n"),
			schema:  greeterSchema(),
			summary: "Variables not allowed",
			line:    4,
		},
		{
			name:    "unusable schema",
			src:     hostFile("    port = 1\n"),
			schema:  badSchema,
			summary: "Invalid plugin config schema",
			line:    3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, diags := Parse([]byte(tt.src), filename)
			if diags.HasErrors() {
				t.Fatalf("Parse: %s", diags.Error())
			}
			got, diags := DecodePluginConfig(c.Plugins[0].Config, tt.schema)

			if tt.summary == "" {
				if diags.HasErrors() {
					t.Fatalf("DecodePluginConfig() diagnostics: %s", diags.Error())
				}
				if string(got) != tt.want {
					t.Errorf("DecodePluginConfig() = %s, want %s", got, tt.want)
				}
				return
			}

			if !diags.HasErrors() {
				t.Fatalf("DecodePluginConfig() = %s, no errors, want %q", got, tt.summary)
			}
			if got != nil {
				t.Errorf("DecodePluginConfig() = %s with errors, want nil", got)
			}
			d := diags.Errs()[0].(*hcl.Diagnostic)
			if !strings.Contains(d.Summary, tt.summary) {
				t.Errorf("DecodePluginConfig() summary = %q, want %q (all: %v)", d.Summary, tt.summary, diags)
			}
			if d.Subject == nil {
				t.Fatalf("DecodePluginConfig() diagnostic %q has no subject", d.Summary)
			}
			if d.Subject.Filename != filename || d.Subject.Start.Line != tt.line {
				t.Errorf("DecodePluginConfig() subject = %s:%d, want %s:%d",
					d.Subject.Filename, d.Subject.Start.Line, filename, tt.line)
			}
			var buf bytes.Buffer
			if err := WriteDiagnostics(&buf, c.Files, diags); err != nil {
				t.Fatalf("WriteDiagnostics: %v", err)
			}
			if want := fmt.Sprintf("%s:%d:", filename, tt.line); !strings.Contains(buf.String(), want) {
				t.Errorf("WriteDiagnostics text = %q, want it to contain %q", buf.String(), want)
			}
		})
	}
}

func TestDecodePluginConfigNilBody(t *testing.T) {
	got, diags := DecodePluginConfig(nil, nil)
	if diags.HasErrors() || string(got) != "{}" {
		t.Errorf("DecodePluginConfig(nil, nil) = %s, %v; want {}, no diagnostics", got, diags)
	}
}

func TestCheckSchema(t *testing.T) {
	attrs := func(as ...*pluginv1.Attribute) *pluginv1.Schema { return &pluginv1.Schema{Attributes: as} }
	single := func(name string, body *pluginv1.Schema) *pluginv1.Block {
		return &pluginv1.Block{Name: name, Nesting: pluginv1.Block_NESTING_SINGLE, Body: body}
	}
	deep := &pluginv1.Schema{}
	for range maxSchemaDepth + 1 {
		deep = &pluginv1.Schema{Blocks: []*pluginv1.Block{single("b", deep)}}
	}

	tests := []struct {
		name    string
		schema  *pluginv1.Schema
		wantErr string // a fragment of the error, or "" for none
	}{
		{"nil", nil, ""},
		{"empty", &pluginv1.Schema{}, ""},
		{"every type", greeterSchema(), ""},
		{"map of durations", attrs(&pluginv1.Attribute{Name: "d", Type: "map(duration)", DefaultJson: `{"a":"1s"}`}), ""},
		{"list of ints", attrs(&pluginv1.Attribute{Name: "n", Type: "list(int)", DefaultJson: `[1,2]`}), ""},
		{"default not a whole number", attrs(&pluginv1.Attribute{Name: "n", Type: "int", DefaultJson: `1.5`}), `attribute "n": default_json "1.5": got 1.5`},
		{"default map element not whole", attrs(&pluginv1.Attribute{Name: "n", Type: "map(int)", DefaultJson: `{"a":0.5}`}), `attribute "n": default_json`},
		{"null default", attrs(&pluginv1.Attribute{Name: "s", Type: "string", DefaultJson: "null"}), ""},
		{"unknown type", attrs(&pluginv1.Attribute{Name: "port", Type: "integer"}), `attribute "port": unknown type "integer"`},
		{"empty type", attrs(&pluginv1.Attribute{Name: "port"}), `attribute "port": unknown type ""`},
		{"list of unknown", attrs(&pluginv1.Attribute{Name: "l", Type: "list(integer)"}), `unknown type "list(integer)"`},
		{"list of list", attrs(&pluginv1.Attribute{Name: "l", Type: "list(list(string))"}), `unknown type "list(list(string))"`},
		{"unclosed list", attrs(&pluginv1.Attribute{Name: "l", Type: "list(string"}), `unknown type "list(string"`},
		{"object type", attrs(&pluginv1.Attribute{Name: "o", Type: "object({a=string})"}), "unknown type"},
		{"default not JSON", attrs(&pluginv1.Attribute{Name: "n", Type: "number", DefaultJson: "one"}), `attribute "n": default_json "one"`},
		{"default of wrong type", attrs(&pluginv1.Attribute{Name: "n", Type: "number", DefaultJson: `"x"`}), `attribute "n": default_json`},
		{"default bool for string list", attrs(&pluginv1.Attribute{Name: "l", Type: "list(string)", DefaultJson: "true"}), `attribute "l": default_json`},
		{"default not a duration", attrs(&pluginv1.Attribute{Name: "d", Type: "duration", DefaultJson: `"soon"`}), `attribute "d": default_json "\"soon\""`},
		{"default list element not a duration", attrs(&pluginv1.Attribute{Name: "d", Type: "list(duration)", DefaultJson: `["1s","x"]`}), `attribute "d": default_json`},
		{"required with default", attrs(&pluginv1.Attribute{Name: "r", Type: "string", Required: true, DefaultJson: `"x"`}), `attribute "r": required attribute has a default`},
		{"empty attribute name", attrs(&pluginv1.Attribute{Type: "string"}), `attribute "": empty name`},
		{"nil attribute", attrs(nil), `attribute "": empty name`},
		{"invalid attribute name", attrs(&pluginv1.Attribute{Name: "a b", Type: "string"}), `attribute "a b": name is not a valid HCL identifier`},
		{"duplicate attribute", attrs(&pluginv1.Attribute{Name: "a", Type: "string"}, &pluginv1.Attribute{Name: "a", Type: "number"}), `attribute "a": duplicate name`},
		{"attribute and block share a name", &pluginv1.Schema{
			Attributes: []*pluginv1.Attribute{{Name: "tls", Type: "bool"}},
			Blocks:     []*pluginv1.Block{single("tls", nil)},
		}, `block "tls": duplicate name`},
		{"duplicate block", &pluginv1.Schema{Blocks: []*pluginv1.Block{single("b", nil), single("b", nil)}}, `block "b": duplicate name`},
		{"empty block name", &pluginv1.Schema{Blocks: []*pluginv1.Block{single("", nil)}}, `block "": empty name`},
		{"unspecified nesting", &pluginv1.Schema{Blocks: []*pluginv1.Block{{Name: "b"}}}, `block "b": unknown nesting NESTING_UNSPECIFIED`},
		{"bad nested attribute", &pluginv1.Schema{Blocks: []*pluginv1.Block{
			single("outer", attrs(&pluginv1.Attribute{Name: "x", Type: "float"})),
		}}, `block "outer": attribute "x": unknown type "float"`},
		{"too deep", deep, "nest more than"},
		{"labelled blocks", proxySchema(), ""},
		{"label not an identifier", &pluginv1.Schema{Blocks: []*pluginv1.Block{{Name: "b", Nesting: pluginv1.Block_NESTING_LIST, Labels: []string{"a b"}}}},
			`block "b": label "a b": name is not a valid HCL identifier`},
		{"empty label name", &pluginv1.Schema{Blocks: []*pluginv1.Block{{Name: "b", Nesting: pluginv1.Block_NESTING_LIST, Labels: []string{""}}}},
			`block "b": label "": empty name`},
		{"label twice", &pluginv1.Schema{Blocks: []*pluginv1.Block{{Name: "b", Nesting: pluginv1.Block_NESTING_LIST, Labels: []string{"n", "n"}}}},
			`block "b": label "n": duplicate name`},
		{"label also an attribute", &pluginv1.Schema{Blocks: []*pluginv1.Block{{Name: "b", Nesting: pluginv1.Block_NESTING_LIST, Labels: []string{"url"},
			Body: attrs(&pluginv1.Attribute{Name: "url", Type: "string"})}}},
			`block "b": label "url": also the name of an attribute or block`},
		{"label also a block", &pluginv1.Schema{Blocks: []*pluginv1.Block{{Name: "b", Nesting: pluginv1.Block_NESTING_SINGLE, Labels: []string{"tls"},
			Body: &pluginv1.Schema{Blocks: []*pluginv1.Block{single("tls", nil)}}}}},
			`block "b": label "tls": also the name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckSchema(tt.schema)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckSchema() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidSchema) {
				t.Fatalf("CheckSchema() = %v, want an error wrapping ErrInvalidSchema", err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("CheckSchema() = %q, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

// TestPluginConfigSuggestions: an unknown name in a plugin's config
// block, or in a block of it, that a declared name starts or ends with
// gets that name as its suggestion, as the host's own blocks do; one HCL
// already made a suggestion for gets no second.
func TestPluginConfigSuggestions(t *testing.T) {
	schema := &pluginv1.Schema{
		Attributes: []*pluginv1.Attribute{
			{Name: "max_message_bytes", Type: "number", DefaultJson: "1"},
			{Name: "dedup_window", Type: "duration", DefaultJson: `"5m"`},
		},
		Blocks: []*pluginv1.Block{{
			Name: "retention", Nesting: pluginv1.Block_NESTING_SINGLE,
			Body: &pluginv1.Schema{Attributes: []*pluginv1.Attribute{{Name: "keep_after_checkpoint", Type: "number", DefaultJson: "0"}}},
		}},
	}
	for _, tt := range []struct{ src, want string }{
		{"    max_message = 5\n", `Did you mean "max_message_bytes"?`},
		{"    window = \"1s\"\n", `Did you mean "dedup_window"?`},
		{"    retention {\n      keep = 1\n    }\n", `Did you mean "keep_after_checkpoint"?`},
		{"    colour = 1\n", ""},
	} {
		c, diags := Parse([]byte(hostFile(tt.src)), "file.hcl")
		if diags.HasErrors() {
			t.Fatalf("Parse: %s", diags.Error())
		}
		_, diags = DecodePluginConfig(c.Plugins[0].Config, schema)
		if len(diags) != 1 || diags[0].Summary != "Unsupported argument" {
			t.Fatalf("config %q: diagnostics %v, want one Unsupported argument", tt.src, diags)
		}
		if d := diags[0].Detail; tt.want == "" && strings.Contains(d, "Did you mean") || tt.want != "" && !strings.HasSuffix(d, " "+tt.want) {
			t.Errorf("config %q: detail %q, want it to end %q", tt.src, d, tt.want)
		}
	}

	// config written as an attribute: HCL suggests the block, and the
	// host adds nothing after it.
	_, diags := Parse([]byte("plugin \"greeter\" {\n  path = \"greeter\"\n  config = { greeting = \"hi\" }\n}\n"), "file.hcl")
	if len(diags) != 1 || strings.Count(diags[0].Detail, "Did you mean") != 1 || !strings.Contains(diags[0].Detail, `block of type "config"`) {
		t.Errorf("config = {...} in a plugin block: %v, want one diagnostic suggesting the config block, once", diags)
	}
}
