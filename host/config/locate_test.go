package config

import (
	"testing"

	"github.com/hashicorp/hcl/v2"
)

// TestLocate maps the paths a plugin's ConfigError names to places in
// testdata/labels.hcl, and the paths it cannot follow to the last block on
// the way, or to nothing.
func TestLocate(t *testing.T) {
	c, diags := Load("testdata/labels.hcl")
	if diags.HasErrors() {
		t.Fatalf("Load: %s", diags.Error())
	}
	body := c.Plugins[0].Config
	tests := []struct {
		path         string
		line, column int // 0: not found
	}{
		{`upstream["wallet"].url`, 8, 13},
		{`upstream["legacy"].weight`, 12, 16},
		{`upstream[1].url`, 11, 16},
		{`upstream[0]`, 7, 5},
		{`upstream["legacy"]`, 10, 5},
		{`upstream["legacy"].name`, 10, 5},  // a label: the block's header
		{`upstream["wallet"].weight`, 7, 5}, // defaulted: the block
		{`upstream["nowhere"].url`, 0, 0},
		{`upstream[2].url`, 0, 0},
		{`upstream.url`, 0, 0}, // which of two?
		{`cert["client"]["main"].file`, 18, 14},
		{`cert["main"]["client"].file`, 0, 0},
		{`route["/api/"].upstream`, 21, 18},
		{`route.upstream`, 21, 18}, // the only route
		{`tls.sni["a.example"].cert`, 25, 16},
		{`tls.sni["b.example"].cert`, 23, 5}, // no such sni: tls
		{`tls.min_version`, 23, 5},
		{`colour`, 0, 0},
		{``, 0, 0},
		{`upstream[`, 0, 0},
	}
	for _, tt := range tests {
		rng, ok := Locate(body, tt.path)
		if tt.line == 0 {
			if ok {
				t.Errorf("Locate(%q) = %s, true; want false", tt.path, rng)
			}
			continue
		}
		if !ok || rng.Filename != "testdata/labels.hcl" || rng.Start.Line != tt.line || rng.Start.Column != tt.column {
			t.Errorf("Locate(%q) = %s, %t; want testdata/labels.hcl:%d,%d", tt.path, rng, ok, tt.line, tt.column)
		}
	}
}

// TestLocateElements: a path into a list or map attribute points at the
// element, when the operator wrote the list or map out.
func TestLocateElements(t *testing.T) {
	c, diags := Parse([]byte(hostFile("    greeting = \"hi\"\n    tags = [\"a\",\n      \"b\"]\n    weights = {\n      east = 1\n      \"west\" = 2\n    }\n")), "elements.hcl")
	if diags.HasErrors() {
		t.Fatalf("Parse: %s", diags.Error())
	}
	for _, tt := range []struct {
		path string
		want hcl.Pos
	}{
		{"tags[1]", hcl.Pos{Line: 6, Column: 7}},
		{"tags[5]", hcl.Pos{Line: 5, Column: 12}},
		{"tags", hcl.Pos{Line: 5, Column: 12}},
		{`weights["east"]`, hcl.Pos{Line: 8, Column: 14}},
		{`weights["west"]`, hcl.Pos{Line: 9, Column: 16}},
		{`weights["north"]`, hcl.Pos{Line: 7, Column: 15}},
		{"greeting", hcl.Pos{Line: 4, Column: 16}},
	} {
		rng, ok := Locate(c.Plugins[0].Config, tt.path)
		if !ok || rng.Start.Line != tt.want.Line || rng.Start.Column != tt.want.Column {
			t.Errorf("Locate(%q) = %s, %t; want elements.hcl:%d,%d", tt.path, rng, ok, tt.want.Line, tt.want.Column)
		}
	}
}
