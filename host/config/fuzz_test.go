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
	} {
		f.Add([]byte(seed))
	}

	f.Fuzz(func(t *testing.T, src []byte) {
		const filename = "fuzz.hcl"
		file, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
		if diags.HasErrors() {
			return
		}
		out, diags := DecodePluginConfig(file.Body, greeterSchema())
		files := map[string]*hcl.File{filename: file}
		if err := WriteDiagnostics(io.Discard, files, diags); err != nil {
			t.Fatalf("WriteDiagnostics: %v", err)
		}
		if diags.HasErrors() {
			if out != nil {
				t.Errorf("DecodePluginConfig() = %q with errors, want nil", out)
			}
			return
		}
		var obj map[string]any
		if err := json.Unmarshal(out, &obj); err != nil {
			t.Errorf("DecodePluginConfig() = %q, not a JSON object: %v", out, err)
		}
	})
}
