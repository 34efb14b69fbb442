package config

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/hcl/v2"

	"github.com/plughost/plughost/proto/pluginv1"
)

// proxySchema declares labelled blocks: upstream and route take one label,
// cert two, and the single block tls holds sni blocks labelled by host.
func proxySchema() *pluginv1.Schema {
	list := pluginv1.Block_NESTING_LIST
	return &pluginv1.Schema{Blocks: []*pluginv1.Block{
		{Name: "upstream", Nesting: list, Labels: []string{"name"}, Body: &pluginv1.Schema{Attributes: []*pluginv1.Attribute{
			{Name: "url", Type: "string", Required: true},
			{Name: "weight", Type: "number", DefaultJson: "1"},
		}}},
		{Name: "cert", Nesting: list, Labels: []string{"kind", "name"}, Body: &pluginv1.Schema{Attributes: []*pluginv1.Attribute{
			{Name: "file", Type: "string", Required: true},
		}}},
		{Name: "route", Nesting: list, Labels: []string{"prefix"}, Body: &pluginv1.Schema{Attributes: []*pluginv1.Attribute{
			{Name: "upstream", Type: "string", Required: true},
		}}},
		{Name: "tls", Nesting: pluginv1.Block_NESTING_SINGLE, Body: &pluginv1.Schema{
			Attributes: []*pluginv1.Attribute{{Name: "min_version", Type: "string", DefaultJson: `"1.2"`}},
			Blocks: []*pluginv1.Block{{Name: "sni", Nesting: list, Labels: []string{"host"}, Body: &pluginv1.Schema{
				Attributes: []*pluginv1.Attribute{{Name: "cert", Type: "string"}},
			}}},
		}},
	}}
}

// decodeFile loads a host config file with one plugin and decodes its
// config block against schema.
func decodeFile(t *testing.T, file string, schema *pluginv1.Schema) (*Config, []byte, hcl.Diagnostics) {
	t.Helper()
	c, diags := Load(file)
	if diags.HasErrors() {
		t.Fatalf("Load(%s): %s", file, diags.Error())
	}
	js, diags := DecodePluginConfig(c.Plugins[0].Config, schema)
	return c, js, diags
}

// TestDecodeLabels: each label arrives in its block's object under the
// label's name, blocks in the order of the file.
func TestDecodeLabels(t *testing.T) {
	_, got, diags := decodeFile(t, "testdata/labels.hcl", proxySchema())
	if diags.HasErrors() {
		t.Fatalf("DecodePluginConfig(labels.hcl): %s", diags.Error())
	}
	want := `{"cert":[{"file":"server.pem","kind":"server","name":"main"},{"file":"client.pem","kind":"client","name":"main"}],` +
		`"route":[{"prefix":"/api/","upstream":"wallet"}],` +
		`"tls":{"min_version":"1.2","sni":[{"cert":"main","host":"a.example"}]},` +
		`"upstream":[{"name":"wallet","url":"http://127.0.0.1:7001","weight":1},{"name":"legacy","url":"http://127.0.0.1:7000","weight":2}]}`
	if string(got) != want {
		t.Errorf("DecodePluginConfig(labels.hcl) =\n%s\nwant\n%s", got, want)
	}

	// Absent, a labelled list is [] and a single block null, as without labels.
	c, diags := Parse([]byte(hostFile("")), "empty.hcl")
	if diags.HasErrors() {
		t.Fatalf("Parse: %s", diags.Error())
	}
	got, diags = DecodePluginConfig(c.Plugins[0].Config, proxySchema())
	if want := `{"cert":[],"route":[],"tls":null,"upstream":[]}`; diags.HasErrors() || string(got) != want {
		t.Errorf("DecodePluginConfig(empty) = %s, %v; want %s", got, diags, want)
	}
}

// TestDecodeLabelsInvalid pins where each refusal of a labelled block
// points: file:line:col, and what it says.
func TestDecodeLabelsInvalid(t *testing.T) {
	const file = "testdata/labels-invalid.hcl"
	type where struct {
		Summary      string
		Line, Column int
	}
	c, got, diags := decodeFile(t, file, proxySchema())
	if got != nil {
		t.Errorf("DecodePluginConfig(%s) = %s with errors, want nil", file, got)
	}
	want := []where{
		{"Missing name for upstream block", 9, 5},
		{"Label written as an argument", 12, 5},
		{"Extraneous label for upstream block", 16, 22},
		{"Label written as an argument", 20, 7},
		{"Duplicate upstream block", 23, 5},
		{"Missing name for cert block", 26, 5},
		{"Duplicate cert block", 31, 5},
		{"Duplicate sni block", 34, 7},
		{"Incorrect attribute value type", 37, 18},
		{"Extraneous label for route block", 39, 19},
		{"Extraneous label for tls", 42, 9},
	}
	var gotWhere []where
	for _, d := range diags {
		if d.Subject == nil || d.Subject.Filename != file {
			t.Errorf("diagnostic %q subject = %v, want one in %s", d.Summary, d.Subject, file)
			continue
		}
		gotWhere = append(gotWhere, where{d.Summary, d.Subject.Start.Line, d.Subject.Start.Column})
	}
	if diff := cmp.Diff(want, gotWhere); diff != "" {
		t.Errorf("DecodePluginConfig(%s) diagnostics (-want +got):\n%s", file, diff)
	}

	// What the operator reads, refreshed with go test -update.
	var buf bytes.Buffer
	if err := WriteDiagnostics(&buf, c.Files, diags); err != nil {
		t.Fatalf("WriteDiagnostics: %v", err)
	}
	const golden = "testdata/labels-invalid.golden"
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatalf("update golden: %v", err)
		}
	}
	wantText, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("read golden (run go test -update to create it): %v", err)
	}
	if buf.String() != string(wantText) {
		t.Errorf("WriteDiagnostics(%s) =\n%s\nwant (%s):\n%s", file, buf.String(), golden, wantText)
	}
}

// TestDecodeLabelsHints: the refusal of a block without its labels says
// how to write it, with the values of the arguments that stood for them.
func TestDecodeLabelsHints(t *testing.T) {
	tests := []struct {
		name, config string
		want         string // in the first diagnostic's detail
	}{
		{"label as an argument", "    upstream {\n      name = \"legacy\"\n      url = \"u\"\n    }\n",
			`upstream blocks take the name as a label, not as an argument; write upstream "legacy" { ... } without the name argument.`},
		{"label as an argument that is not a string", "    upstream {\n      name = 7\n      url = \"u\"\n    }\n",
			`write upstream "NAME" { ... } without the name argument`},
		{"no label", "    upstream {\n      url = \"u\"\n    }\n",
			`upstream blocks take one label, the name; write upstream "NAME" { ... }.`},
		{"one of two labels as an argument", "    cert \"server\" {\n      name = \"main\"\n      file = \"f\"\n    }\n",
			`cert blocks take the kind and name as labels, not as arguments; write cert "server" "main" { ... } without the name argument.`},
		{"both labels as arguments", "    cert {\n      kind = \"server\"\n      name = \"main\"\n      file = \"f\"\n    }\n",
			`write cert "server" "main" { ... } without the kind and name arguments.`},
		{"one label too many", "    upstream \"a\" \"b\" {\n      url = \"u\"\n    }\n",
			`upstream blocks take one label, the name; write upstream "a" { ... }.`},
		{"label also an argument", "    upstream \"a\" {\n      name = \"a\"\n      url = \"u\"\n    }\n",
			`The name of upstream "a" is its label; remove the name argument.`},
		{"duplicate", "    upstream \"a\" {\n      url = \"u\"\n    }\n    upstream \"a\" {\n      url = \"v\"\n    }\n",
			`upstream "a" was already declared at hints.hcl:4,5-17. No two upstream blocks may have the same name.`},
		{"duplicate of two labels", "    cert \"k\" \"n\" {\n      file = \"f\"\n    }\n    cert \"k\" \"n\" {\n      file = \"g\"\n    }\n",
			`cert "k" "n" was already declared at hints.hcl:4,5-17. No two cert blocks may have the same kind and name.`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, diags := Parse([]byte(hostFile(tt.config)), "hints.hcl")
			if diags.HasErrors() {
				t.Fatalf("Parse: %s", diags.Error())
			}
			_, diags = DecodePluginConfig(c.Plugins[0].Config, proxySchema())
			if len(diags) == 0 {
				t.Fatalf("DecodePluginConfig(%q) = no diagnostics, want one saying %q", tt.config, tt.want)
			}
			if !strings.Contains(diags[0].Detail, tt.want) {
				t.Errorf("DecodePluginConfig(%q) detail = %q, want it to contain %q (all: %v)", tt.config, diags[0].Detail, tt.want, diags)
			}
			if len(diags) != 1 {
				t.Errorf("DecodePluginConfig(%q) = %d diagnostics, want 1: %v", tt.config, len(diags), diags)
			}
		})
	}
}
