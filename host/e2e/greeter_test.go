package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// greeterDir is the example plugin of the plugin guide. It is a Go module
// of its own that depends on this one only through the SDK, as a third
// party's plugin would.
const greeterDir = "../../docs/examples/greeter"

// buildGreeter builds the example module the way its author would: go
// build in the module's own directory.
func buildGreeter(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "greeter")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = greeterDir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build in %s: %v\n%s", greeterDir, err, b)
	}
	return out
}

// greeterBlock returns the example's plugin block, docs/examples/greeter/
// greeter.hcl, with its path replaced by bin and pinned to sum.
func greeterBlock(t *testing.T, bin, sum string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(greeterDir, "greeter.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	const path = `path  = "greeter"`
	if !bytes.Contains(b, []byte(path)) {
		t.Fatalf("greeter.hcl has no line %q to replace", path)
	}
	return strings.Replace(string(b), path, fmt.Sprintf("path   = %q\n  sha256 = %q", bin, sum), 1)
}

// TestGreeterThroughHost builds the out-of-tree example, inspects and pins
// it, validates a config file with its block, and runs it in a real host.
func TestGreeterThroughHost(t *testing.T) {
	bin := buildGreeter(t)

	res := runCLI(t, "plugin", "info", "-json", bin)
	if res.code != 0 {
		t.Fatalf("plughost plugin info -json = exit %d\n%s", res.code, res.stderr)
	}
	var info struct {
		Name   string `json:"name"`
		SHA256 string `json:"sha256"`
		Routes []struct {
			Method  string `json:"method"`
			Pattern string `json:"pattern"`
		} `json:"routes"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &info); err != nil {
		t.Fatalf("plugin info -json: %v\n%s", err, res.stdout)
	}
	raw, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if info.Name != "greeter" || info.SHA256 != hex.EncodeToString(sum[:]) || len(info.Routes) != 4 {
		t.Fatalf("plugin info = %+v, want greeter with 4 routes and the binary's sha256 %x", info, sum)
	}

	cfg := baseConfig("2s") + greeterBlock(t, bin, info.SHA256)
	if res := runCLI(t, "validate", "-config", writeConfigFile(t, cfg)); res.code != 0 || !strings.Contains(res.stdout, "valid (1 plugin)") {
		t.Fatalf("plughost validate = exit %d %s%s, want valid", res.code, res.stdout, res.stderr)
	}

	h := startHost(t, cfg)
	first := readyPlugin(t, h, "greeter")
	post := func(body string) (*http.Response, []byte) {
		return mustRequest(t, http.MethodPost, h.ingress+"/greeter/greetings", strings.NewReader(body),
			http.Header{"Content-Type": {"application/json"}})
	}
	wantGreeting := func(path, want string) {
		t.Helper()
		code, body := h.get(h.ingress + path)
		if code != http.StatusOK || strings.TrimSpace(body) != `{"greeting":"`+want+`"}` {
			t.Fatalf("GET %s = %d %s, want 200 with greeting %q", path, code, body, want)
		}
	}

	wantGreeting("/greeter/", "hi") // greeter.hcl configures "hi"
	wantGreeting("/greeter/greet/ada", "hi, ada")
	if resp, body := post(`{"name": "ada", "greeting": "ahoy"}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /greeter/greetings = %d %s, want 201", resp.StatusCode, body)
	}
	wantGreeting("/greeter/greet/ada", "ahoy, ada")

	resp, body := post(`{"name": "ada", "greeting": "hej"}`)
	checkJSONError(t, "a change within the 10s cooldown", resp, body, http.StatusTooManyRequests, "cooldown")
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 10 {
		t.Errorf("Retry-After = %q, want 1 to 10 seconds", resp.Header.Get("Retry-After"))
	}
	resp, body = post(`{"name": "ada", "greting": "typo"}`)
	checkJSONError(t, "an unknown field", resp, body, http.StatusBadRequest, "bad_request")
	resp, body = post(`{"name": "` + strings.Repeat("a", 33) + `", "greeting": "hej"}`)
	checkJSONError(t, "a name over max_name_len = 32", resp, body, http.StatusBadRequest, "bad_request")
	resp, body = mustRequest(t, http.MethodDelete, h.ingress+"/greeter/greetings", nil, nil)
	checkJSONError(t, "an undeclared method", resp, body, http.StatusMethodNotAllowed, "method_not_allowed")

	for series, want := range map[string]float64{
		`greeter_greetings_total{kind="plain",plugin="greeter"}`:  1,
		`greeter_greetings_total{kind="named",plugin="greeter"}`:  1,
		`greeter_greetings_total{kind="custom",plugin="greeter"}`: 1,
		`greeter_custom_greetings{plugin="greeter"}`:              1,
	} {
		if got, ok := h.metric(series); !ok || got != want {
			t.Errorf("admin /metrics %s = %v (found %v), want %v", series, got, ok, want)
		}
	}

	// A restart drains the plugin, which saves ada's greeting in its data
	// directory; the next process loads it.
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/greeter/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST /v1/plugins/greeter/restart = %d %s, want 202", code, body)
	}
	waitFor(t, 15*time.Second, "greeter to come back with a new pid", func() bool {
		st := h.plugins()["greeter"]
		return st.State == "ready" && st.Pid != 0 && st.Pid != first.Pid
	})
	wantGreeting("/greeter/greet/ada", "ahoy, ada")
}

// TestGreeterGuideQuotes keeps docs/plugin-guide.md in step with the
// example module. A fenced block right after a line
// <!-- from: PATH --> must appear in PATH (from the repository root) line
// for line; every Go block must be marked so, or <!-- sketch --> when it is
// not taken from the example; and every Go file of the example must be
// quoted at least once.
func TestGreeterGuideQuotes(t *testing.T) {
	const guide = "docs/plugin-guide.md" // from the repository root
	src, err := os.ReadFile(filepath.Join("../..", guide))
	if err != nil {
		t.Fatal(err)
	}
	quoted := map[string]bool{}
	for _, b := range fencedBlocks(t, string(src)) {
		path, ok := strings.CutPrefix(b.marker, "<!-- from: ")
		if ok {
			path, ok = strings.CutSuffix(path, " -->")
		}
		switch {
		case ok:
			quoted[path] = true
			file, err := os.ReadFile(filepath.Join("../..", filepath.FromSlash(path)))
			if err != nil {
				t.Errorf("%s:%d quotes %s: %v", guide, b.line, path, err)
				continue
			}
			if err := quotes(string(file), b.body); err != nil {
				t.Errorf("%s:%d is not a copy of %s: %v", guide, b.line, path, err)
			}
		case b.lang == "go" && b.marker != "<!-- sketch -->" && b.marker != guideMain && b.marker != guideNotes:
			t.Errorf("%s:%d: a Go block needs <!-- from: PATH -->, %s (compiled by TestGuideMinimalPlugin), %s (by TestGuideNotesPlugin) or <!-- sketch --> on the line before it", guide, b.line, guideMain, guideNotes)
		}
	}
	files, err := filepath.Glob(filepath.Join(greeterDir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if p := "docs/examples/greeter/" + filepath.Base(f); !quoted[p] {
			t.Errorf("%s quotes nothing from %s; the walkthrough should cover every file of the example", guide, p)
		}
	}
}

// block is one fenced code block of a Markdown file.
type block struct {
	line   int    // of the opening fence, 1-based
	lang   string // the info string
	marker string // the line before the opening fence
	body   string // the lines between the fences, without the last newline
}

func fencedBlocks(t *testing.T, md string) []block {
	t.Helper()
	var (
		out  []block
		cur  *block
		body []string
		prev string
		n    int
	)
	var indent string // of the open fence, as in a list item
	sc := bufio.NewScanner(strings.NewReader(md))
	for sc.Scan() {
		n++
		line := sc.Text()
		fence := strings.TrimLeft(line, " ")
		switch {
		case cur == nil && strings.HasPrefix(fence, "```"):
			cur = &block{line: n, lang: strings.TrimPrefix(fence, "```"), marker: strings.TrimSpace(prev)}
			indent, body = line[:len(line)-len(fence)], nil
		case cur != nil && fence == "```":
			cur.body = strings.Join(body, "\n")
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body = append(body, strings.TrimPrefix(line, indent))
		}
		prev = line
	}
	if cur != nil {
		t.Fatalf("the block opened on line %d is never closed", cur.line)
	}
	return out
}

// quotes reports why body is not a run of whole lines of file.
func quotes(file, body string) error {
	if strings.TrimSpace(body) == "" {
		return fmt.Errorf("the block is empty")
	}
	if strings.Contains("\n"+file+"\n", "\n"+body+"\n") {
		return nil
	}
	lines := strings.Split(file, "\n")
	for i, l := range strings.Split(body, "\n") {
		found := false
		for _, fl := range lines {
			if fl == l {
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("its line %d, %q, is not in the file (mind tabs and spaces)", i+1, l)
		}
	}
	return fmt.Errorf("each line is in the file, but not as one run in this order")
}
