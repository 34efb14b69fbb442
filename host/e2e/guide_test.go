package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

// The blocks of the plugin guide's opening section, "A minimal plugin",
// each found by the line right before its opening fence. The main.go block
// is compiled here, so TestGreeterGuideQuotes lets it stand unquoted.
const (
	guideMain    = "<!-- guide: main.go -->"
	guideGoMod   = "<!-- guide: go.mod -->"
	guideBuild   = "<!-- guide: build -->"
	guideBlock   = "<!-- guide: config.hcl -->"
	guideCurl    = "<!-- guide: curl -->"
	guideRefused = "<!-- guide: refused -->"
)

// guideListen is the ingress address the guide's curl commands use, the
// host's default listen.
const guideListen = "127.0.0.1:8080"

// TestGuideMinimalPlugin holds the plugin guide's minimal plugin to what
// the guide says of it: its main.go and go.mod, written into a module of
// their own with the replace line pointed at this repository, build with
// the guide's command; the operator block it shows passes validate and
// runs in a real host; each curl gets the answer shown; the blank value
// shown is refused at start with the message shown; and the binary passes
// the conformance kit.
func TestGuideMinimalPlugin(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(root, "docs", "plugin-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := fencedBlocks(t, string(src))
	find := func(marker string) string {
		t.Helper()
		var found []string
		for _, b := range blocks {
			if b.marker == marker {
				found = append(found, b.body)
			}
		}
		if len(found) != 1 {
			t.Fatalf("docs/plugin-guide.md has %d blocks right after %s, want 1", len(found), marker)
		}
		return found[0]
	}

	mainSrc := find(guideMain) + "\n"
	bin := buildGuidePlugin(t, root, mainSrc, find(guideGoMod), find(guideBuild))

	block := find(guideBlock)
	m := regexp.MustCompile(`(?m)^plugin "([^"]+)" \{`).FindStringSubmatch(block)
	if m == nil {
		t.Fatalf("the guide's operator block has no plugin \"NAME\" { line:\n%s", block)
	}
	name := m[1]
	top := fmt.Sprintf("listen     = \"127.0.0.1:0\"\ndata_dir   = \"./data\"\nplugin_dir = %q\nadmin {\n  listen = \"127.0.0.1:0\"\n}\n\n",
		filepath.Dir(bin))
	cfg := top + block + "\n"

	t.Run("host", func(t *testing.T) {
		if res := runCLI(t, "validate", "-config", writeConfigFile(t, cfg)); res.code != 0 {
			t.Fatalf("plughost validate with the guide's block = exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
		h := startHost(t, cfg)
		readyPlugin(t, h, name)
		exchanges := parseCurls(t, find(guideCurl))
		if len(exchanges) == 0 {
			t.Fatalf("the guide's curl block has no $ curl lines")
		}
		for _, ex := range exchanges {
			code, body := h.get(h.ingress + ex.path)
			if got := strings.TrimSpace(body); got != ex.want {
				t.Errorf("curl -s %s%s = %d %s\nthe guide shows %s", guideListen, ex.path, code, got, ex.want)
			}
		}
	})

	t.Run("refused", func(t *testing.T) {
		lines := strings.Split(find(guideRefused), "\n")
		m := regexp.MustCompile(`^\$ .*plughost run -config \S+\s+# with (\w+) = (.+)$`).FindStringSubmatch(lines[0])
		if m == nil {
			t.Fatalf("the guide's refusal block starts with %q, want \"$ ... plughost run -config FILE   # with ATTR = VALUE\"", lines[0])
		}
		attr, value := m[1], m[2]
		re := regexp.MustCompile(`(?m)^(\s*)` + attr + `\s*=.*$`)
		if n := len(re.FindAllString(block, -1)); n != 1 {
			t.Fatalf("the guide's operator block sets %s on %d lines, want 1", attr, n)
		}
		bad := top + re.ReplaceAllString(block, "${1}"+attr+" = "+value) + "\n"
		// A refusal by Configure does not stop the host: it serves, lists
		// the plugin failed with the refusal, answers 503 at its mount, and
		// logs the lines the guide shows, at the place of the value in
		// the file the host runs, which differs from the guide's.
		h := startHost(t, bad)
		place := regexp.MustCompile(`config\.hcl:\d+:`)
		at := fmt.Sprintf("%s:%d:", h.cfgPath, lineOf(t, bad, attr+" = "+value))
		var st pluginStatus
		waitFor(t, 30*time.Second, name+" to show its refusal", func() bool {
			st = h.plugins()[name]
			return strings.Contains(st.LastError, "plugin rejected config")
		})
		if st.State != "failed" || st.Restarts != 0 {
			t.Errorf("%s with %s = %s is %s after %d restarts, want failed after 0", name, attr, value, st.State, st.Restarts)
		}
		if code, body := h.get(h.ingress + "/" + name + "/"); code != http.StatusServiceUnavailable || !strings.Contains(body, "plugin_unavailable") {
			t.Errorf("GET /%s/ with %s = %s = %d %s, want 503 plugin_unavailable", name, attr, value, code, body)
		}
		for _, want := range lines[1:] {
			if want = strings.TrimSpace(want); want == "..." {
				continue
			}
			want = place.ReplaceAllLiteralString(want, at)
			waitFor(t, 30*time.Second, "the host log to show "+want, func() bool {
				return strings.Contains(h.log.String(), want)
			})
		}
	})

	t.Run("conformance", func(t *testing.T) {
		plugintest.Conformance(t, bin, configBody(t, block))
	})
}

// buildGuidePlugin writes the guide's main.go and go.mod into a module of
// their own, points the go.mod's replace line at root, and runs the
// guide's go build command there. It returns the built binary. The module
// gets a copy of root's go.sum, and the build runs with -mod=mod in place
// of go mod tidy, fetching through the environment's GOPROXY what the
// module cache lacks; the replace line alone decides where
// github.com/plughost/plughost comes from.
func buildGuidePlugin(t *testing.T, root, mainSrc, goMod, build string) string {
	t.Helper()
	dir := t.TempDir()
	const replace = "replace github.com/plughost/plughost => "
	var mod []string
	replaced := false
	for _, l := range strings.Split(goMod, "\n") {
		if strings.HasPrefix(l, replace) {
			l, replaced = replace+root, true
		}
		mod = append(mod, l)
	}
	if !replaced {
		t.Fatalf("the guide's go.mod has no line starting %q:\n%s", replace, goMod)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"main.go": mainSrc,
		"go.mod":  strings.Join(mod, "\n") + "\n",
		"go.sum":  string(sum),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	args := strings.Fields(build)
	if len(args) != 5 || args[0] != "go" || args[1] != "build" || args[2] != "-o" || args[4] != "." || filepath.IsAbs(args[3]) {
		t.Fatalf("the guide's build block is %q, want one command: go build -o RELATIVE/PATH .", build)
	}
	cmd := exec.CommandContext(t.Context(), "go", args[1:]...)
	cmd.Dir = dir
	// A module of its own loads go.mod files that this repository's
	// pruned module graph never needs, so a fresh cache lacks some.
	goflags := strings.TrimSpace(os.Getenv("GOFLAGS") + " -mod=mod")
	cmd.Env = append(os.Environ(), "GOFLAGS="+goflags, "GOWORK=off", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s in a module of the guide's main.go and go.mod: %v\n%s", build, err, out)
	}
	return filepath.Join(dir, filepath.FromSlash(args[3]))
}

// exchange is one curl command of the guide and the answer it shows.
type exchange struct {
	path string // after guideListen
	want string
}

// parseCurls reads a block of "$ curl -s ADDR/PATH" lines, each followed
// by the answer the guide shows for it.
func parseCurls(t *testing.T, body string) []exchange {
	t.Helper()
	var out []exchange
	for _, l := range strings.Split(body, "\n") {
		cmd, isCmd := strings.CutPrefix(l, "$ ")
		if !isCmd {
			if len(out) == 0 {
				t.Fatalf("the guide's curl block starts with %q, not a $ curl line", l)
			}
			out[len(out)-1].want = strings.TrimSpace(out[len(out)-1].want + "\n" + l)
			continue
		}
		f := strings.Fields(cmd)
		if len(f) != 3 || f[0] != "curl" || f[1] != "-s" || !strings.HasPrefix(f[2], guideListen+"/") {
			t.Fatalf("the guide's curl block has %q; this test understands only $ curl -s %s/PATH", l, guideListen)
		}
		out = append(out, exchange{path: strings.TrimPrefix(f[2], guideListen)})
	}
	return out
}

// configBody returns what is inside the config { } block of a plugin
// block, as plugintest takes it.
func configBody(t *testing.T, block string) string {
	t.Helper()
	lines := strings.Split(block, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "config {" {
			continue
		}
		end := l[:len(l)-len(strings.TrimLeft(l, " \t"))] + "}"
		for j := i + 1; j < len(lines); j++ {
			if lines[j] == end {
				return strings.Join(lines[i+1:j], "\n")
			}
		}
	}
	t.Fatalf("the guide's operator block has no config { ... } block:\n%s", block)
	return ""
}
