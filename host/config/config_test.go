package config

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// mustAbs returns the absolute form of a path relative to the package
// directory, as the code under test resolves it.
func mustAbs(t *testing.T, p string) string {
	t.Helper()
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatalf("filepath.Abs(%q): %v", p, err)
	}
	return abs
}

// defaultConfig is the Config of a file that sets nothing, at filename in
// directory dir.
func defaultConfig(filename, dir string) Config {
	return Config{
		File:          filename,
		Listen:        "127.0.0.1:8080",
		DataDir:       filepath.Join(dir, "data"),
		PluginDir:     filepath.Join(dir, "bin", "plugins"),
		DrainDeadline: 5 * time.Second,
		Admin:         Admin{Listen: "127.0.0.1:9090"},
		Limits: Limits{
			MaxBodyBytes:   1048576,
			ReadTimeout:    5 * time.Second,
			WriteTimeout:   5 * time.Second,
			IdleTimeout:    60 * time.Second,
			RequestTimeout: 5 * time.Second,
			StartTimeout:   10 * time.Second,
			BodyTimeout:    10 * time.Second,

			MaxConns:             10000,
			MaxConnsPerIP:        2500,
			MaxConnsPerIPDefault: true,
			StreamWriteTimeout:   30 * time.Second,
			StreamMaxLifetime:    30 * time.Minute,
			StreamBuffer:         65536,
		},
		Restart: Restart{
			InitialBackoff: 100 * time.Millisecond,
			MaxBackoff:     5 * time.Second,
			MaxRestarts:    5,
			Window:         time.Minute,
			StableAfter:    10 * time.Second,
		},
		Health: Health{
			Interval: 2 * time.Second,
			Timeout:  time.Second,
			Failures: 3,
		},
	}
}

// comparePlugin compares the fields of a Plugin that are plain values, and
// the first line of each range.
type comparePlugin struct {
	Name, Path, SHA256, Mount, DataDir         string
	MaxInflight, MaxStreams                    int
	MaxBodyBytes                               int64
	LogRate, LogBurst                          int
	Required, UnreadyWhenDegraded              bool
	DeclLine, PathLine, SHA256Line, ConfigLine int
	ConfigStartLine                            int
	Env                                        map[string]string
}

func plainPlugin(p PluginBlock) comparePlugin {
	return comparePlugin{
		Name: p.Name, Path: p.Path, SHA256: p.SHA256, Mount: p.Mount, DataDir: p.DataDir,
		MaxInflight: p.MaxInflight, MaxStreams: p.MaxStreams, MaxBodyBytes: p.MaxBodyBytes, Required: p.Required,
		LogRate: p.LogRate, LogBurst: p.LogBurst,
		UnreadyWhenDegraded: p.UnreadyWhenDegraded,
		DeclLine:            p.DeclRange.Start.Line, PathLine: p.PathRange.Start.Line,
		SHA256Line: p.SHA256Range.Start.Line, ConfigLine: p.ConfigRange.Start.Line,
		ConfigStartLine: p.Config.MissingItemRange().Start.Line,
		Env:             p.Env,
	}
}

// diffConfig describes how got differs from want, section by section, or
// returns "" when they match. Files and plugin bodies are not compared.
func diffConfig(got *Config, want Config) string {
	var b strings.Builder
	check := func(name string, g, w any) {
		if !reflect.DeepEqual(g, w) {
			fmt.Fprintf(&b, "%s = %+v, want %+v\n", name, g, w)
		}
	}
	check("File", got.File, want.File)
	check("Listen", got.Listen, want.Listen)
	check("DataDir", got.DataDir, want.DataDir)
	check("PluginDir", got.PluginDir, want.PluginDir)
	check("DrainDeadline", got.DrainDeadline, want.DrainDeadline)
	type admin struct {
		Listen, TokenFile string
		TokenFileLine     int
	}
	check("Admin", admin{got.Admin.Listen, got.Admin.TokenFile, got.Admin.TokenFileRange.Start.Line},
		admin{want.Admin.Listen, want.Admin.TokenFile, want.Admin.TokenFileRange.Start.Line})
	check("Limits", got.Limits, want.Limits)
	check("Restart", got.Restart, want.Restart)
	check("Health", got.Health, want.Health)
	if len(got.Plugins) != len(want.Plugins) {
		fmt.Fprintf(&b, "len(Plugins) = %d, want %d\n", len(got.Plugins), len(want.Plugins))
		return b.String()
	}
	for i := range got.Plugins {
		check(fmt.Sprintf("Plugins[%d]", i), plainPlugin(got.Plugins[i]), plainPlugin(want.Plugins[i]))
	}
	return b.String()
}

func TestLoad(t *testing.T) {
	testdata := mustAbs(t, "testdata")

	full := defaultConfig(filepath.Join("testdata", "full.hcl"), testdata)
	full.Listen = "0.0.0.0:8443"
	full.DataDir = "/var/lib/plughost"
	full.PluginDir = filepath.Join(testdata, "plugins")
	full.DrainDeadline = 30 * time.Second
	full.Admin = Admin{Listen: "127.0.0.1:9191", TokenFile: filepath.Join(testdata, "secrets", "admin.token"),
		TokenFileRange: hcl.Range{Start: hcl.Pos{Line: 9}}}
	full.Limits = Limits{
		MaxBodyBytes:   4096,
		ReadTimeout:    2 * time.Second,
		WriteTimeout:   3 * time.Second,
		IdleTimeout:    90 * time.Second,
		RequestTimeout: 1500 * time.Millisecond,
		StartTimeout:   20 * time.Second,
		BodyTimeout:    4 * time.Second,

		MaxConns:             10000,
		MaxConnsPerIP:        2500,
		MaxConnsPerIPDefault: true,
		StreamWriteTimeout:   30 * time.Second,
		StreamMaxLifetime:    30 * time.Minute,
		StreamBuffer:         65536,
	}
	full.Restart = Restart{
		InitialBackoff: 250 * time.Millisecond,
		MaxBackoff:     30 * time.Second,
		MaxRestarts:    0,
		Window:         10 * time.Minute,
		StableAfter:    time.Minute,
	}
	full.Health = Health{Interval: 5 * time.Second, Timeout: 5 * time.Second, Failures: 1}
	rng := func(line int) hcl.Range { return hcl.Range{Start: hcl.Pos{Line: line}} }
	full.Plugins = []PluginBlock{
		{
			Name:        "hello",
			Path:        filepath.Join(testdata, "plugins", "hello"),
			SHA256:      "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
			Mount:       "/greet/hello",
			MaxInflight: 8,
			MaxStreams:  1024,
			LogRate:     50,
			LogBurst:    100,
			Required:    false,
			DataDir:     "/var/lib/plughost/hello",
			Config:      emptyBody(rng(45)),
			DeclRange:   rng(36),
			PathRange:   rng(37),
			SHA256Range: rng(38),
			ConfigRange: rng(45),
		},
		{
			Name:                "kv_store-2",
			Path:                "/opt/plughost/kv",
			Mount:               "/kv_store-2",
			MaxInflight:         512,
			MaxStreams:          1024,
			LogRate:             200,
			LogBurst:            1000,
			Required:            true,
			DataDir:             "/var/lib/plughost/kv_store-2",
			UnreadyWhenDegraded: true,
			Env:                 map[string]string{"GOGC": "400", "GOMEMLIMIT": "256MiB", "EMPTY": ""},
			Config:              emptyBody(rng(51)),
			DeclRange:           rng(51),
			PathRange:           rng(52),
			SHA256Range:         rng(51),
			ConfigRange:         rng(51),
		},
	}

	tests := []struct {
		name string
		file string
		want Config
	}{
		{"full", "full.hcl", full},
		{"defaults", "minimal.hcl", defaultConfig(filepath.Join("testdata", "minimal.hcl"), testdata)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join("testdata", tt.file)
			got, diags := Load(path)
			if diags.HasErrors() {
				t.Fatalf("Load(%q) diagnostics: %s", path, diags.Error())
			}
			if d := diffConfig(got, tt.want); d != "" {
				t.Errorf("Load(%q) mismatch:\n%s", path, d)
			}
			if got.Files[path] == nil {
				t.Errorf("Load(%q).Files has no entry for %q", path, path)
			}
		})
	}
}

// TestPluginMaxBodyBytes: a plugin block's max_body_bytes may be above or
// below the host-wide one, up to the ceiling; unset, it is 0, which the
// host reads as the host-wide limit.
func TestPluginMaxBodyBytes(t *testing.T) {
	path := filepath.Join("testdata", "body.hcl")
	c, diags := Load(path)
	if diags.HasErrors() {
		t.Fatalf("Load(%q) diagnostics: %s", path, diags.Error())
	}
	if got, want := c.Limits.MaxBodyBytes, int64(65536); got != want {
		t.Errorf("Load(%q).Limits.MaxBodyBytes = %d, want %d", path, got, want)
	}
	want := map[string]int64{"rewarder": 8 << 20, "small": 1024, "largest": 32 << 20, "unset": 0}
	got := map[string]int64{}
	for _, p := range c.Plugins {
		got[p.Name] = p.MaxBodyBytes
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load(%q) plugins' MaxBodyBytes = %v, want %v", path, got, want)
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.hcl")
	c, diags := Load(path)
	if c == nil {
		t.Fatalf("Load(%q) = nil Config, want non-nil", path)
	}
	if !diags.HasErrors() {
		t.Fatalf("Load(%q) diagnostics = %v, want an error", path, diags)
	}
	if s := diags[0].Subject; s == nil || s.Filename != path {
		t.Errorf("Load(%q) subject = %v, want file %q", path, s, path)
	}
	var buf bytes.Buffer
	if err := WriteDiagnostics(&buf, c.Files, diags); err != nil {
		t.Fatalf("WriteDiagnostics: %v", err)
	}
	if want := path + ":1:1: Error: Cannot read config file"; !strings.Contains(buf.String(), want) {
		t.Errorf("WriteDiagnostics text = %q, want it to contain %q", buf.String(), want)
	}
}

// parseErrorCases each hold one mistake, at line, whose diagnostic summary
// contains summary. FuzzParse seeds from them too.
var parseErrorCases = []struct {
	name    string
	src     string
	line    int
	summary string
}{
	{"syntax", "listen = \"127.0.0.1:8080\"\nadmin {\n  listen = = 1\n}\n", 3, "Invalid expression"},
	{"unterminated block", "health {\n  interval = \"1s\"\n", 1, "Unclosed configuration block"},
	{"unknown attribute", "listen = \"127.0.0.1:8080\"\ncolour = \"blue\"\n", 2, "Unsupported argument"},
	{"unknown block", "\nmetrics {\n}\n", 2, "Unsupported block type"},
	{"unknown nested attribute", "admin {\n  port = 1\n}\n", 2, "Unsupported argument"},
	{"unknown plugin attribute", "plugin \"a\" {\n  path = \"a\"\n  args = []\n}\n", 3, "Unsupported argument"},
	{"duplicate block", "admin {\n}\nadmin {\n}\n", 3, "Duplicate admin block"},
	{"duplicate config block", "plugin \"a\" {\n  path = \"a\"\n  config {\n  }\n  config {\n  }\n}\n", 5, "Duplicate config block"},
	{"variable", "listen = var.listen\n", 1, "Variables not allowed"},
	{"function call", "\nlisten = upper(\"x\")\n", 2, "Function calls not allowed"},
	{"null", "data_dir = null\n", 1, "Unsuitable value type"},
	{"string for number", "limits {\n  max_body_bytes = \"lots\"\n}\n", 2, "Unsuitable value type"},
	{"fraction for integer", "restart {\n  max_restarts = 1.5\n}\n", 2, "Unsuitable value type"},
	{"number too large", "restart {\n  max_restarts = 1e40\n}\n", 2, "Unsuitable value type"},
	{"string for bool", "plugin \"a\" {\n  path     = \"a\"\n  required = \"yes\"\n}\n", 3, "Unsuitable value type"},
	{"list for string", "\n\nlisten = [\"a\"]\n", 3, "Unsuitable value type"},
	{"bad duration", "drain_deadline = \"soon\"\n", 1, "Invalid duration"},
	{"duration without unit", "limits {\n  read_timeout = \"5\"\n}\n", 2, "Invalid duration"},
	{"number for duration", "limits {\n  idle_timeout = 5\n}\n", 2, "Invalid duration"},
	{"negative duration", "limits {\n  write_timeout = \"-1s\"\n}\n", 2, "Invalid duration"},
	{"zero duration", "health {\n  interval = \"0s\"\n}\n", 2, "Invalid duration"},
	{"zero start timeout", "limits {\n\n  start_timeout = \"0\"\n}\n", 3, "Invalid duration"},
	{"zero body timeout", "limits {\n  body_timeout = \"0s\"\n}\n", 2, "Invalid duration"},
	{"max backoff below initial", "restart {\n  initial_backoff = \"2s\"\n  max_backoff     = \"1s\"\n}\n", 3, "Invalid restart backoff"},
	{"initial backoff above default max", "restart {\n  initial_backoff = \"1h\"\n}\n", 2, "Invalid restart backoff"},
	{"health timeout above interval", "health {\n  interval = \"1s\"\n  timeout  = \"2s\"\n}\n", 3, "Invalid health timeout"},
	{"zero body limit", "limits {\n  max_body_bytes = 0\n}\n", 2, "Value out of range"},
	{"body limit over 32 MiB", "limits {\n  max_body_bytes = 33554433\n}\n", 2, "Value out of range"},
	{"plugin body limit over 32 MiB", "plugin \"a\" {\n  path = \"a\"\n  max_body_bytes = 33554433\n}\n", 3, "Value out of range"},
	{"plugin body limit of 0", "\nplugin \"a\" {\n  path = \"a\"\n\n  max_body_bytes = 0\n}\n", 5, "Value out of range"},
	{"negative restarts", "restart {\n  max_restarts = -1\n}\n", 2, "Value out of range"},
	{"zero failures", "health {\n  failures = 0\n}\n", 2, "Value out of range"},
	{"zero max inflight", "plugin \"a\" {\n  path         = \"a\"\n  max_inflight = 0\n}\n", 3, "Value out of range"},
	{"listen without port", "listen = \"localhost\"\n", 1, "Invalid listen address"},
	{"listen with named port", "listen = \"127.0.0.1:http\"\n", 1, "Invalid listen address"},
	{"listen port too large", "listen = \":65536\"\n", 1, "Invalid listen address"},
	{"admin listen", "admin {\n  listen = \"127.0.0.1\"\n}\n", 2, "Invalid listen address"},
	{"admin host with a port", "admin {\n  hosts = [\"admin.example:9090\"]\n}\n", 2, "Invalid admin host"},
	{"admin host that is a URL", "admin {\n\n  hosts = [\"ok.example\", \"http://x\"]\n}\n", 3, "Invalid admin host"},
	{"empty admin host", "admin {\n  hosts = [\"\"]\n}\n", 2, "Invalid admin host"},
	{"same listen twice", "listen = \":8080\"\nadmin {\n  listen = \":8080\"\n}\n", 3, "Conflicting listen addresses"},
	{"listen on admin default", "listen = \"127.0.0.1:9090\"\n", 1, "Conflicting listen addresses"},
	{"empty data dir", "data_dir = \"\"\n", 1, "Invalid directory"},
	{"empty plugin dir", "\nplugin_dir = \"\"\n", 2, "Invalid directory"},
	{"uppercase plugin name", "plugin \"Hello\" {\n  path = \"hello\"\n}\n", 1, "Invalid plugin name"},
	{"plugin name with digit first", "\nplugin \"1x\" {\n  path = \"x\"\n}\n", 2, "Invalid plugin name"},
	{"plugin name with dot", "plugin \"a.b\" {\n  path = \"x\"\n}\n", 1, "Invalid plugin name"},
	{"empty plugin name", "plugin \"\" {\n  path = \"x\"\n}\n", 1, "Invalid plugin name"},
	{"duplicate plugin name", "plugin \"a\" {\n  path = \"a\"\n}\nplugin \"a\" {\n  path  = \"a\"\n  mount = \"/other\"\n}\n", 4, "Duplicate plugin name"},
	{"missing plugin label", "plugin {\n  path = \"a\"\n}\n", 1, "Missing name for plugin"},
	{"extra plugin label", "plugin \"a\" \"b\" {\n  path = \"a\"\n}\n", 1, "Extraneous label for plugin"},
	{"missing path", "plugin \"a\" {\n  mount = \"/a\"\n}\n", 1, "Missing required argument"},
	{"empty path", "plugin \"a\" {\n  path = \"\"\n}\n", 2, "Invalid plugin path"},
	{"short sha256", "plugin \"a\" {\n  path   = \"a\"\n  sha256 = \"abc\"\n}\n", 3, "Invalid sha256"},
	{"non-hex sha256", "plugin \"a\" {\n  path   = \"a\"\n  sha256 = \"" + strings.Repeat("g", 64) + "\"\n}\n", 3, "Invalid sha256"},
	{"mount without slash", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"a\"\n}\n", 3, "Invalid mount"},
	{"empty mount", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"\"\n}\n", 3, "Invalid mount"},
	{"root mount", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/\"\n}\n", 3, "Invalid mount"},
	{"mount with trailing slash", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/a/\"\n}\n", 3, "Invalid mount"},
	{"mount with query", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/a?b\"\n}\n", 3, "Invalid mount"},
	{"mount with fragment", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/a#b\"\n}\n", 3, "Invalid mount"},
	{"mount with wildcard", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/{id}\"\n}\n", 3, "Invalid mount"},
	{"mount with space", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/a b\"\n}\n", 3, "Invalid mount"},
	{"mount with double slash", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"//a\"\n}\n", 3, "Invalid mount"},
	{"mount with dot dot", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/a/../b\"\n}\n", 3, "Invalid mount"},
	{"healthz mount", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/healthz\"\n}\n", 3, "Reserved mount"},
	{"mount under readyz", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/readyz/a\"\n}\n", 3, "Reserved mount"},
	{"default mount reserved", "plugin \"healthz\" {\n  path = \"a\"\n}\n", 1, "Reserved mount"},
	{"duplicate mount", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/x\"\n}\nplugin \"b\" {\n  path  = \"b\"\n  mount = \"/x\"\n}\n", 7, "Duplicate mount"},
	{"explicit mount on default", "plugin \"a\" {\n  path = \"a\"\n}\nplugin \"b\" {\n  path  = \"b\"\n  mount = \"/a\"\n}\n", 6, "Duplicate mount"},
	{"default mount on explicit", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/b\"\n}\nplugin \"b\" {\n  path = \"b\"\n}\n", 5, "Duplicate mount"},
	{"nested mount", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/api\"\n}\nplugin \"b\" {\n  path  = \"b\"\n  mount = \"/api/v1\"\n}\n", 7, "Overlapping mounts"},
	{"env number", "plugin \"a\" {\n  path = \"a\"\n  env {\n    GOGC = 800\n  }\n}\n", 4, "Invalid environment value"},
	{"env list", "plugin \"a\" {\n  path = \"a\"\n  env {\n    GOGC = [\"800\"]\n  }\n}\n", 4, "Invalid environment value"},
	{"env variable reference", "plugin \"a\" {\n  path = \"a\"\n  env {\n    GOGC = x\n  }\n}\n", 4, "Variables not allowed"},
	{"env name with dash", "plugin \"a\" {\n  path = \"a\"\n  env {\n    MY-VAR = \"1\"\n  }\n}\n", 4, "Invalid environment variable name"},
	{"env handshake cookie", "plugin \"a\" {\n  path = \"a\"\n  env {\n    PLUGHOST_PLUGIN = \"x\"\n  }\n}\n", 4, "Reserved environment variable"},
	{"env data plane", "plugin \"a\" {\n  path = \"a\"\n  env {\n    PLUGHOST_DATA_PLANE_FDS = \"0\"\n  }\n}\n", 4, "Reserved environment variable"},
	{"env go-plugin port", "plugin \"a\" {\n  path = \"a\"\n  env {\n    PLUGIN_MIN_PORT = \"1\"\n  }\n}\n", 4, "Reserved environment variable"},
	{"env go-plugin lowercase", "plugin \"a\" {\n  path = \"a\"\n  env {\n    plugin_client_cert = \"\"\n  }\n}\n", 4, "Reserved environment variable"},
	{"env nested block", "plugin \"a\" {\n  path = \"a\"\n  env {\n    inner {\n    }\n  }\n}\n", 4, "Unexpected \"inner\" block"},
	{"env twice", "plugin \"a\" {\n  path = \"a\"\n  env {\n  }\n  env {\n  }\n}\n", 5, "Duplicate env block"},
	{"env duplicate name", "plugin \"a\" {\n  path = \"a\"\n  env {\n    GOGC = \"1\"\n    GOGC = \"2\"\n  }\n}\n", 5, "Attribute redefined"},
	{"nested too deeply", "limits {\n  max_conns = " + strings.Repeat("(", maxNesting) + "1" + strings.Repeat(")", maxNesting) + "\n}\n", 2, "Config nested too deeply"},
	{"expression too complex", "\nlisten = " + strings.Repeat("-", maxExprDepth) + "1\n", 2, "Expression too complex"},
	{"enclosing mount", "plugin \"a\" {\n  path  = \"a\"\n  mount = \"/api/v1\"\n}\nplugin \"b\" {\n  path  = \"b\"\n  mount = \"/api\"\n}\n", 7, "Overlapping mounts"},
}

func TestParseErrors(t *testing.T) {
	const filename = "file.hcl"
	for _, tt := range parseErrorCases {
		t.Run(tt.name, func(t *testing.T) {
			c, diags := Parse([]byte(tt.src), filename)
			if c == nil {
				t.Fatalf("Parse() = nil Config, want non-nil")
			}
			errs := diags.Errs()
			if len(errs) != 1 {
				t.Fatalf("Parse(%q) gave %d errors, want 1: %v", tt.src, len(errs), diags)
			}
			d := diags[0]
			if !strings.Contains(d.Summary, tt.summary) {
				t.Errorf("Parse(%q) summary = %q, want %q", tt.src, d.Summary, tt.summary)
			}
			if d.Subject == nil {
				t.Fatalf("Parse(%q) diagnostic %q has no subject", tt.src, d.Summary)
			}
			if d.Subject.Filename != filename || d.Subject.Start.Line != tt.line {
				t.Errorf("Parse(%q) subject = %s:%d, want %s:%d",
					tt.src, d.Subject.Filename, d.Subject.Start.Line, filename, tt.line)
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

// TestWriteDiagnosticsGolden pins the text operators see for a file with
// several mistakes. Refresh with go test -update.
func TestWriteDiagnosticsGolden(t *testing.T) {
	tests := []struct {
		name   string
		file   string
		golden string
	}{
		{"invalid", "testdata/invalid.hcl", "testdata/invalid.golden"},
		{"env", "testdata/env.hcl", "testdata/env.golden"},
		{"unknown keys", "testdata/keys.hcl", "testdata/keys.golden"},
		{"connection and stream limits", "testdata/conns-invalid.hcl", "testdata/conns-invalid.golden"},
		{"nested too deeply", "testdata/deep.hcl", "testdata/deep.golden"},
		{"log limits", "testdata/logs-invalid.hcl", "testdata/logs-invalid.golden"},
		{"plugin body limits", "testdata/body-invalid.hcl", "testdata/body-invalid.golden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, diags := Load(tt.file)
			var buf bytes.Buffer
			if err := WriteDiagnostics(&buf, c.Files, diags); err != nil {
				t.Fatalf("WriteDiagnostics: %v", err)
			}
			if *update {
				if err := os.WriteFile(tt.golden, buf.Bytes(), 0o644); err != nil {
					t.Fatalf("update golden: %v", err)
				}
			}
			want, err := os.ReadFile(tt.golden)
			if err != nil {
				t.Fatalf("read golden (run go test -update to create it): %v", err)
			}
			if got := buf.String(); got != string(want) {
				t.Errorf("WriteDiagnostics(%s) =\n%s\nwant (%s):\n%s", tt.file, got, tt.golden, want)
			}
		})
	}
}
