package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/config"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// shaPlaceholder stands in the golden files for the binary's sha256, which
// changes with every toolchain and every edit to hello or the SDK. The tests
// check the real sum against catalog.FileSHA256 before replacing it.
const shaPlaceholder = "SHA256-OF-THE-BINARY"

// TestPluginInfo runs "plughost plugin info" in-process against the real
// hello and crasher binaries that TestMain (main_test.go) builds into bin.
func TestPluginInfo(t *testing.T) {
	hello := filepath.Join(bin, "hello")
	sum, err := catalog.FileSHA256(hello)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("text", func(t *testing.T) {
		out := runInfo(t, "plugin", "info", hello)
		if !strings.Contains(out, "sha256:           "+sum+"\n") {
			t.Fatalf("plugin info %s: no line \"sha256: %s\" in\n%s", hello, sum, out)
		}
		checkInfoGolden(t, "plugin-info-hello.golden", strings.ReplaceAll(out, sum, shaPlaceholder))
	})

	t.Run("json", func(t *testing.T) {
		out := runInfo(t, "plugin", "info", "-json", hello)
		var got info
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("plugin info -json: %v\n%s", err, out)
		}
		if got.SHA256 != sum {
			t.Errorf("plugin info -json: sha256 = %q, want %q", got.SHA256, sum)
		}
		wantRoutes := []infoRoute{
			{Method: "GET", Pattern: "/{$}", NoBody: true},
			{Method: "GET", Pattern: "/sleep", NoBody: true, TimeoutMS: 600000},
		}
		if diff := cmp.Diff(wantRoutes, got.Routes); diff != "" {
			t.Errorf("plugin info -json: routes (-want +got):\n%s", diff)
		}
		checkInfoGolden(t, "plugin-info-hello.json.golden", strings.ReplaceAll(out, sum, shaPlaceholder))
	})

	t.Run("bare name in working directory", func(t *testing.T) {
		// exec would look "hello" up in $PATH; the command must run the
		// file in the working directory instead.
		t.Chdir(bin)
		out := runInfo(t, "plugin", "info", "hello")
		if !strings.HasPrefix(out, "name:             hello\n") {
			t.Errorf("plugin info hello (in %s) = %q, want the hello manifest", bin, out)
		}
	})

	errTests := []struct {
		name string
		args []string
		// want is in the returned error, which main prints before exiting 1.
		want string
	}{
		{"missing file", []string{"plugin", "info", filepath.Join(bin, "nope")}, "no such file or directory"},
		{"not a plugin", []string{"plugin", "info", filepath.Join(bin, "crasher")}, "not a plughost plugin"},
		{"protocol mismatch", []string{"plugin", "info", filepath.Join(bin, "badproto")}, "plugin protocol mismatch"},
		{"not executable", []string{"plugin", "info", "-json", filepath.Join("testdata", "plugin-info-hello.golden")}, "not executable"},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tt.args, &stdout, &stderr)
			if err == nil || errors.Is(err, errReported) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run(%q) = %v, want an error mentioning %q", tt.args, err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.args[len(tt.args)-1]) {
				t.Errorf("run(%q) = %v, want the path in the error", tt.args, err)
			}
			if stdout.Len() > 0 {
				t.Errorf("run(%q) printed %q on stdout, want nothing", tt.args, stdout.String())
			}
		})
	}

	usageTests := []struct {
		name string
		args []string
	}{
		{"no plugin command", []string{"plugin"}},
		{"no path", []string{"plugin", "info"}},
		{"flag after path", []string{"plugin", "info", hello, "-json"}},
		{"unknown flag", []string{"plugin", "info", "-yaml", hello}},
		{"unknown plugin command", []string{"plugin", "describe", hello}},
	}
	for _, tt := range usageTests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if err := run(t.Context(), tt.args, &stdout, &stderr); !errors.Is(err, errReported) {
				t.Fatalf("run(%q) = %v, want errReported", tt.args, err)
			}
			if !strings.Contains(stderr.String(), "plughost plugin info [-json] PATH") {
				t.Errorf("run(%q) stderr = %q, want the usage", tt.args, stderr.String())
			}
			if stdout.Len() > 0 {
				t.Errorf("run(%q) printed %q on stdout, want nothing", tt.args, stdout.String())
			}
		})
	}
}

// TestPluginInfoSchema covers what hello does not declare: any-method and
// streaming and no-body routes, required attributes, and nested single and
// list blocks, with and without labels.
func TestPluginInfoSchema(t *testing.T) {
	m := &pluginv1.DescribeResponse{
		Name:       "proxy",
		Version:    "1.2.3",
		SdkVersion: "0.1.0",
		Routes: []*pluginv1.Route{
			{Pattern: "/items/{id}"},
			{Method: "GET", Pattern: "/events", Streaming: true},
			{Method: "POST", Pattern: "/upload", TimeoutMs: 1500},
			{Method: "POST", Pattern: "/ping", NoBody: true},
		},
		ConfigSchema: &pluginv1.Schema{
			Attributes: []*pluginv1.Attribute{
				{Name: "target", Type: "string", Required: true, Description: "upstream base URL"},
				{Name: "retries", Type: "number", DefaultJson: "3"},
				{Name: "tags", Type: "list(string)", DefaultJson: `[ "a", "b" ]`, Description: "line one\nline two"},
			},
			Blocks: []*pluginv1.Block{
				{Name: "tls", Nesting: pluginv1.Block_NESTING_SINGLE, Description: "client TLS", Body: &pluginv1.Schema{
					Attributes: []*pluginv1.Attribute{{Name: "ca_file", Type: "string", Required: true}},
				}},
				{Name: "rule", Nesting: pluginv1.Block_NESTING_LIST, Labels: []string{"name"}, Required: true, Body: &pluginv1.Schema{
					Attributes: []*pluginv1.Attribute{{Name: "match", Type: "string", Required: true}},
					Blocks: []*pluginv1.Block{{Name: "rewrite", Nesting: pluginv1.Block_NESTING_SINGLE, Labels: []string{"from", "to"}, Body: &pluginv1.Schema{
						Attributes: []*pluginv1.Attribute{{Name: "headers", Type: "map(string)", DefaultJson: `{}`}},
					}}},
				}},
			},
		},
	}
	if err := config.CheckSchema(m.GetConfigSchema()); err != nil {
		t.Fatalf("CheckSchema: %v; the test's manifest must be one a host accepts", err)
	}
	in := newInfo(m, 1, shaPlaceholder)

	var text bytes.Buffer
	if err := in.writeText(&text); err != nil {
		t.Fatal(err)
	}
	checkInfoGolden(t, "plugin-info-schema.golden", text.String())

	js, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Routes []struct {
			Method string `json:"method"`
		} `json:"routes"`
		Config struct {
			Attributes []struct {
				Default json.RawMessage `json:"default"`
			} `json:"attributes"`
			Blocks []struct {
				Nesting string   `json:"nesting"`
				Labels  []string `json:"labels"`
				Config  struct {
					Blocks []struct {
						Config struct {
							Attributes []struct {
								Name string `json:"name"`
							} `json:"attributes"`
						} `json:"config"`
					} `json:"blocks"`
				} `json:"config"`
			} `json:"blocks"`
		} `json:"config"`
	}
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatalf("unmarshal %s: %v", js, err)
	}
	checks := []struct{ what, got, want string }{
		{"routes[0].method", got.Routes[0].Method, "*"},
		{"config.attributes[0].default", string(got.Config.Attributes[0].Default), "null"},
		{"config.attributes[2].default", string(got.Config.Attributes[2].Default), `["a","b"]`},
		{"config.blocks[1].nesting", got.Config.Blocks[1].Nesting, "list"},
		{"config.blocks[1].labels", fmt.Sprint(got.Config.Blocks[1].Labels), "[name]"},
		{"config.blocks[0].labels", fmt.Sprintf("%#v", got.Config.Blocks[0].Labels), "[]string{}"},
		{"config.blocks[1].config.blocks[0].config.attributes[0].name", got.Config.Blocks[1].Config.Blocks[0].Config.Attributes[0].Name, "headers"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("JSON %s = %s, want %s\n%s", c.what, c.got, c.want, js)
		}
	}
}

// runInfo runs the command in-process, fails the test on an error and
// returns stdout.
func runInfo(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run(%q) = %v; stderr:\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

// checkInfoGolden compares got with testdata/name, or rewrites the file
// when the test runs with -update.
func checkInfoGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got):\n%s\nIf the change is intended, rerun with -update.", path, diff)
	}
}

// TestInfoRouteBody: the BODY column and max_body_bytes show a route's
// own body limit, and "none" wins for a route that takes no body, which
// no_body says as the text does; single_instance shows in both.
func TestInfoRouteBody(t *testing.T) {
	in := newInfo(&pluginv1.DescribeResponse{Name: "rewarder", Version: "1", SingleInstance: true, Routes: []*pluginv1.Route{
		{Method: "POST", Pattern: "/v1/epochs/{id}/compute", MaxBodyBytes: 16 << 20},
		{Method: "POST", Pattern: "/v1/epochs/{id}/retry"},
		{Method: "GET", Pattern: "/v1/epochs/{id}"},
		{Method: "POST", Pattern: "/v1/checkpoint", NoBody: true},
		{Pattern: "/any"},
	}}, 2, "sum")
	if got := in.Routes[0].MaxBody; got != 16<<20 {
		t.Errorf("newInfo: routes[0].MaxBody = %d, want %d", got, 16<<20)
	}
	for i, want := range []bool{false, false, true, true, false} {
		if got := in.Routes[i].NoBody; got != want {
			t.Errorf("newInfo: routes[%d] (%s %s) NoBody = %t, want %t", i, in.Routes[i].Method, in.Routes[i].Pattern, got, want)
		}
	}
	if !in.SingleInstance {
		t.Errorf("newInfo: SingleInstance = false, want true")
	}
	var b strings.Builder
	if err := in.writeText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"POST    /v1/epochs/{id}/compute  no         16777216  default",
		"POST    /v1/epochs/{id}/retry    no         yes       default",
		"GET     /v1/epochs/{id}          no         none      default",
		"POST    /v1/checkpoint           no         none      default",
		"*       /any                     no         yes       default",
		"single instance:  yes",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("writeText: no line %q in\n%s", want, b.String())
		}
	}
}
