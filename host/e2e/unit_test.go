package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/config"
)

// unitPath is the systemd unit docs/deploy ships.
const unitPath = "../../docs/deploy/plughost.service"

// unitBinary is the host binary's path in the unit's ExecStart.
const unitBinary = "/usr/local/bin/plughost"

// needTool returns the path of the named tool, skipping the test where it
// is not installed, except in CI (CI=true), whose .ci/run installs it.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not installed; .ci/run installs Debian's %s", name, pkg)
	}
	t.Skipf("%s is not installed (Debian's %s); skipping", name, pkg)
	return ""
}

// unitDirectives returns the unit's directives, each key with its values
// in order; comments and section headers are left out.
func unitDirectives(t *testing.T, text string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q is not KEY=VALUE", unitPath, line)
		}
		out[k] = append(out[k], v)
	}
	return out
}

// TestSystemdUnit checks docs/deploy/plughost.service: systemd-analyze
// verify accepts it with no warning at all (it exits 0 on an unknown key
// or a bad value, and only says so), with ExecStart pointed at the host
// binary this run built, as verify checks that it exists; and the
// settings the host depends on are there: Type=notify, a SIGHUP reload,
// KillMode=mixed so the host drains its plugins, a TimeoutStopSec above
// the drain the repository's config.hcl allows, AF_UNIX for the plugin
// sockets.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	d := unitDirectives(t, text)
	want := map[string]string{
		"Type":            "notify",
		"ExecReload":      "/bin/kill -HUP $MAINPID",
		"KillMode":        "mixed",
		"NoNewPrivileges": "yes",
		"ProtectSystem":   "strict",
		"PrivateTmp":      "yes",
		"ProtectHome":     "yes",
	}
	for k, v := range want {
		if got := d[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s: %s=%q, want %s=%s", unitPath, k, got, k, v)
		}
	}
	if fams := strings.Fields(strings.Join(d["RestrictAddressFamilies"], " ")); !strings.Contains(" "+strings.Join(fams, " ")+" ", " AF_UNIX ") {
		t.Errorf("%s: RestrictAddressFamilies=%q lacks AF_UNIX, which the plugins' sockets and NOTIFY_SOCKET need", unitPath, fams)
	}
	if len(d["User"]) != 1 || d["User"][0] == "root" || len(d["Group"]) != 1 {
		t.Errorf("%s: User=%q Group=%q, want a dedicated user and group", unitPath, d["User"], d["Group"])
	}
	if len(d["WatchdogSec"]) != 1 {
		t.Errorf("%s: WatchdogSec=%q, want one", unitPath, d["WatchdogSec"])
	}

	cfg, diags := config.Load("../../config.hcl")
	if diags.HasErrors() {
		t.Fatalf("config.hcl: %v", diags)
	}
	if len(d["TimeoutStopSec"]) != 1 {
		t.Fatalf("%s: TimeoutStopSec=%q, want one", unitPath, d["TimeoutStopSec"])
	}
	stop, err := time.ParseDuration(d["TimeoutStopSec"][0])
	if err != nil {
		t.Fatalf("%s: TimeoutStopSec=%s: %v", unitPath, d["TimeoutStopSec"][0], err)
	}
	// The host exits within drain_deadline + 1s of SIGTERM.
	if limit := cfg.DrainDeadline + time.Second; stop <= limit {
		t.Errorf("%s: TimeoutStopSec=%v, want above drain_deadline + 1s = %v, or systemd kills plugins mid-drain", unitPath, stop, limit)
	}

	analyze := needTool(t, "systemd-analyze", "systemd")
	if !strings.Contains(text, "ExecStart="+unitBinary+" ") {
		t.Fatalf("%s: ExecStart does not run %s", unitPath, unitBinary)
	}
	dir := t.TempDir()
	unit := filepath.Join(dir, "plughost.service")
	text = strings.Replace(text, "ExecStart="+unitBinary+" ", "ExecStart="+filepath.Join(bins.dir, "plughost")+" ", 1)
	if err := os.WriteFile(unit, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", unit).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unitPath, err, out)
	}
}
