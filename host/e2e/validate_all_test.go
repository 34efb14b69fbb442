package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// diagLineRE matches the file:line:col prefix of a printed diagnostic.
var diagLineRE = regexp.MustCompile(`(?m)^(\S+\.hcl):(\d+):\d+: (Error|Warning): (.*)$`)

// reportedLines returns the lines of the diagnostics validate printed, in
// the order printed, failing t unless each names path.
func reportedLines(t *testing.T, path, stderr string) []int {
	t.Helper()
	var lines []int
	for _, m := range diagLineRE.FindAllStringSubmatch(stderr, -1) {
		if m[1] != path {
			t.Errorf("diagnostic %q names file %s, want %s", m[0], m[1], path)
		}
		var n int
		fmt.Sscan(m[2], &n)
		lines = append(lines, n)
	}
	return lines
}

// checkAllReported runs validate on cfg and checks that it exits 1 with a
// diagnostic on each marker's line, in order of line, and no others.
func checkAllReported(t *testing.T, cfg string, markers map[string]string) {
	t.Helper()
	path := writeConfigFile(t, cfg)
	res := runCLI(t, "validate", "-config", path)
	if res.code != 1 {
		t.Errorf("plughost validate: exit code = %d, want 1\nstderr:\n%s", res.code, res.stderr)
	}
	var want []int
	for marker, summary := range markers {
		line := lineOf(t, cfg, marker)
		want = append(want, line)
		if at := fmt.Sprintf("%s:%d:", path, line); !strings.Contains(res.stderr, at) ||
			!strings.Contains(res.stderr, "Error: "+summary) {
			t.Errorf("plughost validate: stderr has no %q at %s (%s)\nstderr:\n%s", summary, at, marker, res.stderr)
		}
	}
	slices.Sort(want)
	if got := reportedLines(t, path, res.stderr); !slices.Equal(got, want) {
		t.Errorf("plughost validate: diagnostics on lines %v, want %v, sorted\nstderr:\n%s", got, want, res.stderr)
	}
}

// TestValidateReportsEveryError: a host-key typo, a wrong type in a
// plugin's config block, a missing plugin binary and a config the plugin
// itself refuses are four runs' worth of errors in one.
func TestValidateReportsEveryError(t *testing.T) {
	cfg := baseConfig("1s") + "drain_deadlin = \"2s\"\n" +
		pluginBlock("hello", "hello", "  config {\n    greeting = [\"a\"]\n  }") +
		pluginBlock("gone", "no-such-plugin", "") +
		pluginBlock("terse", "hello", "  config {\n    greeting = \"\"\n  }") +
		pluginBlock("faulty", "faulty", "  config {\n    limit = 7\n  }")
	checkAllReported(t, cfg, map[string]string{
		`drain_deadlin = "2s"`:    "Unsupported argument",
		`greeting = ["a"]`:        "Incorrect attribute value type",
		`path = "no-such-plugin"`: "Unusable plugin binary",
		`greeting = ""`:           "Plugin rejected its config",
	})
}

// TestValidateReportsPluginErrorsPastBrokenHost: a host part with a syntax
// error, a conflict and a bad value still lets validate check the plugin
// blocks it can read whole.
func TestValidateReportsPluginErrorsPastBrokenHost(t *testing.T) {
	cfg := fmt.Sprintf(`
listen     = "127.0.0.1:7000"
plugin_dir = %q
admin {
  listen = "127.0.0.1:7000"
}
limits {
  max_body_bytes =
}
`, bins.plugins) +
		pluginBlock("hello", "hello", "  config {\n    greeting = [\"a\"]\n  }") +
		pluginBlock("gone", "no-such-plugin", "")
	checkAllReported(t, cfg, map[string]string{
		`max_body_bytes =`:            "Invalid expression",
		`  listen = "127.0.0.1:7000"`: "Conflicting listen addresses",
		`greeting = ["a"]`:            "Incorrect attribute value type",
		`path = "no-such-plugin"`:     "Unusable plugin binary",
	})
}
