package config

import (
	"testing"
)

// TestParseKeepsIntactPlugins pins what validate relies on: broken host
// settings, even a syntax error, leave the plugin blocks the parser read
// whole in Plugins, with a Path only where it can be resolved.
func TestParseKeepsIntactPlugins(t *testing.T) {
	tests := []struct {
		name string
		src  string
		// paths are the Paths of Plugins, in order.
		paths []string
	}{
		{
			name:  "syntax error in the host part",
			src:   "plugin_dir = \"/p\"\nlimits {\n  max_body_bytes =\n}\nplugin \"a\" {\n  path = \"a\"\n}\nplugin \"b\" {\n  path = \"/abs/b\"\n}\n",
			paths: []string{"/p/a", "/abs/b"},
		},
		{
			name:  "syntax error in a plugin block",
			src:   "plugin \"a\" {\n  path = \n}\nplugin \"b\" {\n  path = \"/abs/b\"\n}\n",
			paths: []string{"/abs/b"},
		},
		{
			name:  "damaged plugin_dir",
			src:   "plugin_dir = \"/p\" \"/q\"\nplugin \"a\" {\n  path = \"a\"\n}\nplugin \"b\" {\n  path = \"/abs/b\"\n}\n",
			paths: []string{"", "/abs/b"},
		},
		{
			name:  "invalid plugin_dir",
			src:   "plugin_dir = \"\"\nplugin \"a\" {\n  path = \"a\"\n}\n",
			paths: []string{""},
		},
		{
			name:  "conflicting listeners and a host-key typo",
			src:   "listen = \"127.0.0.1:1\"\nadmin {\n  listen = \"127.0.0.1:1\"\n}\ndrain_deadlin = \"1s\"\nplugin \"a\" {\n  path = \"/abs/a\"\n}\n",
			paths: []string{"/abs/a"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, diags := Parse([]byte(tt.src), "/etc/c.hcl")
			if !diags.HasErrors() {
				t.Fatalf("Parse(%q) has no errors, want some", tt.src)
			}
			var paths []string
			for _, p := range c.Plugins {
				paths = append(paths, p.Path)
			}
			if len(paths) != len(tt.paths) {
				t.Fatalf("Parse(%q) Plugins paths = %q, want %q", tt.src, paths, tt.paths)
			}
			for i := range paths {
				if paths[i] != tt.paths[i] {
					t.Errorf("Parse(%q) Plugins paths = %q, want %q", tt.src, paths, tt.paths)
				}
			}
		})
	}
}
