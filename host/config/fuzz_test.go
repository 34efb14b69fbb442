package config

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/plughost/plughost/proto/pluginv1"
)

// FuzzParse checks that no file, however broken, panics Parse or
// WriteDiagnostics, that every diagnostic points into the file, and that a
// file Parse accepts meets the documented invariants.
func FuzzParse(f *testing.F) {
	seeds, err := filepath.Glob(filepath.Join("testdata", "*.hcl"))
	if err != nil {
		f.Fatalf("glob testdata: %v", err)
	}
	for _, name := range seeds {
		src, err := os.ReadFile(name)
		if err != nil {
			f.Fatalf("read seed: %v", err)
		}
		f.Add(src)
	}
	for _, tt := range parseErrorCases {
		f.Add([]byte(tt.src))
	}

	f.Fuzz(func(t *testing.T, src []byte) {
		const filename = "fuzz.hcl"
		c, diags := Parse(src, filename)
		if c == nil {
			t.Fatal("Parse() = nil Config")
		}
		for _, d := range diags {
			if d.Subject == nil || d.Subject.Filename != filename {
				t.Errorf("Parse() diagnostic %q subject = %v, want one in %s", d.Summary, d.Subject, filename)
			}
		}
		if err := WriteDiagnostics(io.Discard, c.Files, diags); err != nil {
			t.Fatalf("WriteDiagnostics: %v", err)
		}
		if diags.HasErrors() {
			return
		}

		checkValid(t, c)
		for _, p := range c.Plugins {
			out, diags := DecodePluginConfig(p.Config, greeterSchema())
			if err := WriteDiagnostics(io.Discard, c.Files, diags); err != nil {
				t.Fatalf("WriteDiagnostics: %v", err)
			}
			if !diags.HasErrors() && !json.Valid(out) {
				t.Errorf("DecodePluginConfig() = %q, not JSON", out)
			}
		}
	})
}

// checkValid asserts what Parse promises about a file it accepts.
func checkValid(t *testing.T, c *Config) {
	t.Helper()
	for _, dir := range []string{c.DataDir, c.PluginDir} {
		if !filepath.IsAbs(dir) {
			t.Errorf("directory %q is not absolute", dir)
		}
	}
	if err := checkListen(c.Listen); err != nil {
		t.Errorf("Listen %q: %v", c.Listen, err)
	}
	if err := checkListen(c.Admin.Listen); err != nil {
		t.Errorf("Admin.Listen %q: %v", c.Admin.Listen, err)
	}
	for _, d := range []struct {
		name string
		v    int64
	}{
		{"DrainDeadline", int64(c.DrainDeadline)},
		{"MaxBodyBytes", c.Limits.MaxBodyBytes},
		{"ReadTimeout", int64(c.Limits.ReadTimeout)},
		{"RequestTimeout", int64(c.Limits.RequestTimeout)},
		{"StartTimeout", int64(c.Limits.StartTimeout)},
		{"BodyTimeout", int64(c.Limits.BodyTimeout)},
		{"InitialBackoff", int64(c.Restart.InitialBackoff)},
		{"Window", int64(c.Restart.Window)},
		{"Health.Interval", int64(c.Health.Interval)},
		{"Health.Failures", int64(c.Health.Failures)},
	} {
		if d.v <= 0 {
			t.Errorf("%s = %d, want > 0", d.name, d.v)
		}
	}
	if c.Restart.MaxBackoff < c.Restart.InitialBackoff || c.Health.Timeout > c.Health.Interval {
		t.Errorf("Restart = %+v, Health = %+v: bounds out of order", c.Restart, c.Health)
	}
	names := make(map[string]bool)
	for _, p := range c.Plugins {
		if !pluginNameRE.MatchString(p.Name) || names[p.Name] {
			t.Errorf("plugin name %q invalid or duplicate", p.Name)
		}
		names[p.Name] = true
		if !filepath.IsAbs(p.Path) {
			t.Errorf("plugin %q path %q is not absolute", p.Name, p.Path)
		}
		if problem := checkMount(p.Mount); problem != "" {
			t.Errorf("plugin %q mount %q %s", p.Name, p.Mount, problem)
		}
		for _, q := range c.Plugins {
			if p.Name != q.Name && (p.Mount == q.Mount || strings.HasPrefix(p.Mount, q.Mount+"/")) {
				t.Errorf("plugins %q and %q share or nest mounts %q, %q", p.Name, q.Name, p.Mount, q.Mount)
			}
		}
		if p.MaxInflight < 1 || p.Config == nil {
			t.Errorf("plugin %q = %+v, want MaxInflight >= 1 and a Config body", p.Name, p)
		}
		if p.LogRate < 0 || p.LogBurst < 1 {
			t.Errorf("plugin %q has log_rate %d, log_burst %d, want at least 0 and 1", p.Name, p.LogRate, p.LogBurst)
		}
	}
}

// FuzzDecodePluginConfig checks that no config body panics
// DecodePluginConfig and that what it accepts is a JSON object.
func FuzzDecodePluginConfig(f *testing.F) {
	for _, seed := range []string{
		"greeting = \"hi\"\n",
		"greeting = \"hi\"\nrepeat = 2.5\nloud = true\ntimeout = \"1s\"\ntags = [\"a\"]\nweights = { a = 1 }\nbackoffs = [\"1s\"]\n",
		"greeting = \"hi\"\ntls {\n  cert = \"c\"\n  key = \"k\"\n}\nupstream {\n  url = \"u\"\n}\nupstream {\n  url = \"v\"\n  weight = 2\n}\n",
		"greeting = \"hi\"\ntimeout = \"soon\"\n",
		"repeat = \"often\"\n",
		"colour = \"blue\"\n",
		"greeting = var.x\n",
		"greeting = null\nbackoffs = [null, \"1s\"]\n",
		"greeting = \"hi\"\nstart = 1.5\ncounts = { a = 2, b = 0.5 }\n",
		"greeting = \"hi\"\nstart = -7\ncounts = { a = 1e300 }\n",
		"upstream \"a\" {\n  url = \"u\"\n}\nupstream \"b\" {\n  url = \"v\"\n  weight = 2\n}\n",
		"upstream \"a\" {\n  url = \"u\"\n}\nupstream \"a\" {\n  url = \"v\"\n}\n",
		"upstream {\n  name = \"a\"\n  url = \"u\"\n}\n",
		"upstream \"a\" \"b\" {\n  url = \"u\"\n}\n",
		"upstream \"a\" {\n  name = \"a\"\n  url = \"u\"\n}\n",
		"cert \"k\" \"n\" {\n  file = \"f\"\n}\ncert \"k\" {\n  file = \"g\"\n}\n",
		"tls {\n  sni \"a\" {\n    cert = \"c\"\n  }\n  sni \"a\" {}\n}\nroute \"/\" {\n  upstream = \"a\"\n}\n",
		"upstream \"\" {\n  url = \"\"\n}\nupstream \"\\u0000\" {\n  url = \"\"\n}\n",
	} {
		f.Add([]byte(seed))
	}

	f.Fuzz(func(t *testing.T, src []byte) {
		const filename = "fuzz.hcl"
		file, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
		if diags.HasErrors() {
			return
		}
		files := map[string]*hcl.File{filename: file}
		for _, schema := range []*pluginv1.Schema{greeterSchema(), proxySchema()} {
			out, diags := DecodePluginConfig(file.Body, schema)
			if err := WriteDiagnostics(io.Discard, files, diags); err != nil {
				t.Fatalf("WriteDiagnostics: %v", err)
			}
			for _, d := range diags {
				if d.Subject == nil || d.Subject.Filename != filename {
					t.Errorf("DecodePluginConfig() diagnostic %q subject = %v, want one in %s", d.Summary, d.Subject, filename)
				}
			}
			if diags.HasErrors() {
				if out != nil {
					t.Errorf("DecodePluginConfig() = %q with errors, want nil", out)
				}
				continue
			}
			var obj map[string]any
			if err := json.Unmarshal(out, &obj); err != nil {
				t.Errorf("DecodePluginConfig() = %q, not a JSON object: %v", out, err)
			}
			checkLabelled(t, obj, schema)
		}
	})
}

// checkLabelled checks what DecodePluginConfig promises of the labelled
// blocks of schema in obj, the JSON it accepted: each object of a list
// holds its labels as strings, and no two objects of a list the same ones.
func checkLabelled(t *testing.T, obj map[string]any, schema *pluginv1.Schema) {
	t.Helper()
	for _, b := range schema.GetBlocks() {
		var objs []any
		switch v := obj[b.GetName()].(type) {
		case []any:
			objs = v
		case map[string]any:
			objs = []any{v}
		}
		seen := map[string]bool{}
		for _, o := range objs {
			o, _ := o.(map[string]any)
			var key []string
			for _, l := range b.GetLabels() {
				s, ok := o[l].(string)
				if !ok {
					t.Errorf("block %s = %v, want label %s as a string", b.GetName(), o, l)
				}
				key = append(key, s)
			}
			if k := strings.Join(key, "\x00"); len(key) > 0 && seen[k] {
				t.Errorf("block %s: two objects with labels %q", b.GetName(), key)
			} else {
				seen[k] = true
			}
			checkLabelled(t, o, b.GetBody())
		}
	}
}

// FuzzLocate checks that no path a plugin names in its ConfigError panics
// Locate, and that what it finds lies in the config block.
func FuzzLocate(f *testing.F) {
	for _, seed := range []string{`upstream["wallet"].url`, `upstream[1].weight`, `cert["client"]["main"].file`,
		`tls.sni["a.example"].cert`, `upstream[99999999999999999999]`, `a["\xff"]`, `x[0][0]`, ``} {
		f.Add(seed)
	}
	c, diags := Load("testdata/labels.hcl")
	if diags.HasErrors() {
		f.Fatalf("Load: %s", diags.Error())
	}
	body := c.Plugins[0].Config.(*hclsyntax.Body)
	f.Fuzz(func(t *testing.T, path string) {
		rng, ok := Locate(body, path)
		if ok && (rng.Filename != body.SrcRange.Filename || !body.SrcRange.ContainsOffset(rng.Start.Byte)) {
			t.Errorf("Locate(%q) = %s, outside the config block %s", path, rng, body.SrcRange)
		}
	})
}
