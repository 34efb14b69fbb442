package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cliResult is how one plughost command ended.
type cliResult struct {
	code           int
	stdout, stderr string
}

// runCLI runs the plughost binary with args and waits for it to exit on
// its own; a command still running after a generous bound fails the test.
func runCLI(t *testing.T, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bins.dir, "plughost"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("plughost %s did not exit within 60s\nstderr:\n%s", strings.Join(args, " "), stderr.String())
	}
	res := cliResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.code = ee.ExitCode()
	default:
		t.Fatalf("plughost %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// writeConfigFile writes cfg to config.hcl in a new temporary directory.
func writeConfigFile(t *testing.T, cfg string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.hcl")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// lineOf returns the 1-based number of the only line of cfg that contains
// marker.
func lineOf(t *testing.T, cfg, marker string) int {
	t.Helper()
	line := 0
	for i, l := range strings.Split(cfg, "\n") {
		if strings.Contains(l, marker) {
			if line != 0 {
				t.Fatalf("marker %q is on lines %d and %d; want one line", marker, line, i+1)
			}
			line = i + 1
		}
	}
	if line == 0 {
		t.Fatalf("marker %q is not in the config", marker)
	}
	return line
}

func TestBadConfigs(t *testing.T) {
	hello := func(extra string) string { return pluginBlock("hello", "hello", extra) }
	tests := []struct {
		name string
		// drain is baseConfig's drain_deadline; default "1s".
		drain string
		// cfg follows baseConfig.
		cfg string
		// at is text on the line the diagnostic must name.
		at string
	}{
		{
			name: "syntax error",
			cfg:  hello(`  mount "/x"`),
			at:   `mount "/x"`,
		},
		{
			name: "unknown top-level key",
			cfg:  "colour = \"red\"\n" + hello(""),
			at:   `colour = "red"`,
		},
		{
			name: "unknown key in plugin block",
			cfg:  hello(`  colour = "red"`),
			at:   `colour = "red"`,
		},
		{
			name: "wrong type in host setting",
			cfg:  hello(`  max_inflight = "many"`),
			at:   `max_inflight = "many"`,
		},
		{
			name: "wrong type in plugin config block",
			cfg:  pluginBlock("faulty", "faulty", "  config {\n    limit = \"abc\"\n  }"),
			at:   `limit = "abc"`,
		},
		{
			name: "list for a string in plugin config block",
			cfg:  hello("  config {\n    greeting = [\"a\"]\n  }"),
			at:   `greeting = ["a"]`,
		},
		{
			name: "unknown attribute in plugin config block",
			cfg:  hello("  config {\n    colour = \"red\"\n  }"),
			at:   `colour = "red"`,
		},
		{
			name: "checksum mismatch",
			cfg:  hello(`  sha256 = "` + strings.Repeat("0", 64) + `"`),
			at:   `sha256 = "000`,
		},
		{
			name: "unknown plugin path",
			cfg:  pluginBlock("hello", "no-such-plugin", ""),
			at:   `path = "no-such-plugin"`,
		},
		{
			name:  "bad duration",
			drain: "soon",
			cfg:   hello(""),
			at:    `drain_deadline = "soon"`,
		},
		{
			name: "config nesting 100,000 brackets",
			cfg:  hello("  config {\n    greeting = " + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + "\n  }"),
			at:   "greeting = [[[",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			drain := tt.drain
			if drain == "" {
				drain = "1s"
			}
			cfg := baseConfig(drain) + tt.cfg
			path := writeConfigFile(t, cfg)
			want := fmt.Sprintf("%s:%d:", path, lineOf(t, cfg, tt.at))
			for _, cmd := range []string{"validate", "run"} {
				res := runCLI(t, cmd, "-config", path)
				if res.code != 1 {
					t.Errorf("plughost %s: exit code = %d, want 1\nstderr:\n%s", cmd, res.code, res.stderr)
				}
				if !strings.Contains(res.stderr, want) {
					t.Errorf("plughost %s: stderr does not name %q\nstderr:\n%s", cmd, want, res.stderr)
				}
				if !strings.Contains(res.stderr, "Error: ") {
					t.Errorf("plughost %s: stderr has no \"Error: \" diagnostic\nstderr:\n%s", cmd, res.stderr)
				}
			}
		})
	}
}

func TestValidateGoodConfig(t *testing.T) {
	cfg := baseConfig("1s") + pluginBlock("hello", "hello", "  config {\n    greeting = \"hi\"\n  }") +
		pluginBlock("faulty", "faulty", "  config {\n    limit = 7\n  }")
	path := writeConfigFile(t, cfg)
	res := runCLI(t, "validate", "-config", path)
	if res.code != 0 {
		t.Fatalf("plughost validate: exit code = %d, want 0\nstderr:\n%s", res.code, res.stderr)
	}
	if !strings.Contains(res.stdout, "valid") {
		t.Errorf("plughost validate: stdout = %q, want it to say valid", res.stdout)
	}
	if res.stderr != "" {
		t.Errorf("plughost validate: stderr = %q, want nothing (no log records of the plugins it launched)", res.stderr)
	}
}
