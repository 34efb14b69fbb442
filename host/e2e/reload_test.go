package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// reload rewrites the host's config file with cfg, sends SIGHUP and waits
// until the host has logged one more line containing outcome ("config
// reloaded" or "config reload rejected").
func (h *hostProc) reload(cfg, outcome string) {
	h.t.Helper()
	before := strings.Count(h.log.String(), outcome)
	if err := os.WriteFile(h.cfgPath, []byte(cfg), 0o644); err != nil {
		h.t.Fatal(err)
	}
	h.signal(syscall.SIGHUP)
	waitFor(h.t, 30*time.Second, "the host to log "+outcome, func() bool {
		return strings.Count(h.log.String(), outcome) > before
	})
}

// greeting returns what GET /hello/ answers.
func (h *hostProc) greeting() (int, string) {
	h.t.Helper()
	return h.get(h.ingress + "/hello/")
}

func helloWith(greeting string) string {
	return pluginBlock("hello", "hello", "  config {\n    greeting = \""+greeting+"\"\n  }")
}

func TestSIGHUPReload(t *testing.T) {
	base := baseConfig("2s")
	h := startHost(t, base+helloWith("one"))
	if code, body := h.greeting(); code != http.StatusOK || !strings.Contains(body, `"greeting":"one"`) {
		t.Fatalf("GET /hello/ = %d %s, want 200 with greeting one", code, body)
	}
	pid1 := h.plugins()["hello"].Pid

	// A changed plugin config takes effect: hello restarts with it. While
	// it restarts, requests get 200 (old or new) or 503, never anything else.
	if err := os.WriteFile(h.cfgPath, []byte(base+helloWith("two")), 0o644); err != nil {
		t.Fatal(err)
	}
	h.signal(syscall.SIGHUP)
	var unexpected []string
	unavailable := 0
	waitFor(t, 10*time.Second, "GET /hello/ to answer two", func() bool {
		code, body := h.greeting()
		if code == http.StatusServiceUnavailable {
			unavailable++
		}
		if code != http.StatusOK && code != http.StatusServiceUnavailable && len(unexpected) < 3 {
			unexpected = append(unexpected, fmt.Sprintf("%d %s", code, strings.TrimSpace(body)))
		}
		return code == http.StatusOK && strings.Contains(body, `"greeting":"two"`)
	})
	if len(unexpected) > 0 {
		t.Errorf("GET /hello/ during the reload = %q, want only 200 or 503", unexpected)
	}
	t.Logf("GET /hello/ answered 503 %d times while hello restarted", unavailable)
	pid2 := h.plugins()["hello"].Pid
	if pid2 == 0 || pid2 == pid1 {
		t.Errorf("hello pid after the reload = %d, want a new process (was %d)", pid2, pid1)
	}
	if !waitGone(pid1, 5*time.Second) {
		t.Errorf("old hello process %d still alive 5s after the reload", pid1)
	}

	// Broken configs are rejected and the running one stays.
	broken := []struct{ name, cfg string }{
		{"syntax error", base + pluginBlock("hello", "hello", "  mount \"/x\"")},
		{"wrong type in plugin config block", base + pluginBlock("hello", "hello", "  config {\n    greeting = [\"a\"]\n  }")},
		{"unknown plugin path", base + helloWith("two") + pluginBlock("faulty", "no-such-plugin", "")},
	}
	// Not subtests: the hostProc helpers fail h.t, which must happen on
	// this goroutine.
	for _, b := range broken {
		h.reload(b.cfg, "config reload rejected")
		if code, body := h.greeting(); code != http.StatusOK || !strings.Contains(body, `"greeting":"two"`) {
			t.Errorf("%s: GET /hello/ after the rejected reload = %d %s, want 200 with greeting two", b.name, code, body)
		}
		if pid := h.plugins()["hello"].Pid; pid != pid2 {
			t.Errorf("%s: hello pid after the rejected reload = %d, want %d unchanged", b.name, pid, pid2)
		}
	}

	// A new plugin block starts the plugin; hello, unchanged, keeps running.
	h.reload(base+helloWith("two")+pluginBlock("faulty", "faulty", ""), "config reloaded")
	if code, body := h.get(h.ingress + "/faulty/ok"); code != http.StatusOK {
		t.Fatalf("GET /faulty/ok after adding faulty = %d %s, want 200", code, body)
	}
	ps := h.plugins()
	faultyPid := ps["faulty"].Pid
	if faultyPid == 0 || ps["faulty"].State != "ready" {
		t.Errorf("faulty after adding it = %+v, want ready with a pid", ps["faulty"])
	}
	if pid := ps["hello"].Pid; pid != pid2 {
		t.Errorf("hello pid after adding faulty = %d, want %d unchanged", pid, pid2)
	}

	// Removing the block drains the plugin and forgets it.
	h.reload(base+helloWith("two"), "config reloaded")
	if _, ok := h.plugins()["faulty"]; ok {
		t.Errorf("/v1/plugins still lists faulty after its block was removed")
	}
	if !waitGone(faultyPid, 5*time.Second) {
		t.Errorf("faulty process %d still alive 5s after its block was removed", faultyPid)
	}
	if code, body := h.get(h.ingress + "/faulty/ok"); code != http.StatusNotFound {
		t.Errorf("GET /faulty/ok after removing faulty = %d %s, want 404", code, body)
	}
	if _, ok := h.metric(`plughost_plugin_up{plugin="faulty"}`); ok {
		t.Errorf(`plughost_plugin_up{plugin="faulty"} still exported after faulty was removed`)
	}
	if code, body := h.greeting(); code != http.StatusOK || !strings.Contains(body, `"greeting":"two"`) {
		t.Errorf("GET /hello/ at the end = %d %s, want 200 with greeting two", code, body)
	}
	// Three reloads applied (the new greeting, faulty added, faulty
	// removed), three rejected, none refused by a plugin; the host ready.
	for series, want := range map[string]float64{
		`plughost_config_reloads_total{result="applied"}`:         3,
		`plughost_config_reloads_total{result="rejected"}`:        float64(len(broken)),
		`plughost_config_reloads_total{result="plugins_refused"}`: 0,
		`plughost_ready`: 1,
	} {
		if got, ok := h.metric(series); !ok || got != want {
			t.Errorf("%s = %v (exported %t), want %v", series, got, ok, want)
		}
	}
}

// envdumpEnv returns the environment the envdump plugin was started with.
func envdumpEnv(t *testing.T, h *hostProc) []string {
	t.Helper()
	code, body := h.get(h.ingress + "/envdump/env")
	if code != http.StatusOK {
		t.Fatalf("GET /envdump/env = %d %s, want 200", code, body)
	}
	var env []string
	if err := json.Unmarshal([]byte(body), &env); err != nil {
		t.Fatalf("decode GET /envdump/env: %v", err)
	}
	return env
}

// TestPluginEnvBlock checks that a plugin block's env variables reach
// that plugin's process, from the config file through the supervisor, and
// that changing them restarts the plugin on reload.
func TestPluginEnvBlock(t *testing.T) {
	base := baseConfig("2s")
	block := func(gogc string) string {
		return pluginBlock("envdump", "envdump", "  env {\n    GOGC = \""+gogc+"\"\n  }")
	}
	h := startHost(t, base+block("800")+helloWith("one"))
	if env := envdumpEnv(t, h); !slices.Contains(env, "GOGC=800") {
		t.Fatalf("envdump environment = %q, want it to hold GOGC=800", env)
	}
	ps := h.plugins()
	pid1, helloPid := ps["envdump"].Pid, ps["hello"].Pid

	h.reload(base+block("400")+helloWith("one"), "config reloaded")
	waitFor(t, 10*time.Second, "envdump to restart with GOGC=400", func() bool {
		p := h.plugins()["envdump"]
		return p.State == "ready" && p.Pid != pid1
	})
	if env := envdumpEnv(t, h); !slices.Contains(env, "GOGC=400") || slices.Contains(env, "GOGC=800") {
		t.Errorf("envdump environment after the reload = %q, want GOGC=400 only", env)
	}
	if pid := h.plugins()["hello"].Pid; pid != helloPid {
		t.Errorf("hello pid after envdump's env changed = %d, want %d unchanged", pid, helloPid)
	}
}

// TestReloadHostileConfig sends SIGHUP with a config whose plugin block
// nests 100,000 '[' (200 KB), which once ended the host with a fatal
// stack overflow in the HCL parser: the reload is rejected with a
// diagnosis at that line, the running config stays, and hello keeps
// answering from the same process. validate refuses the same file, exit
// code 1, with the same diagnosis.
func TestReloadHostileConfig(t *testing.T) {
	const depth = 100000
	base := baseConfig("2s")
	h := startHost(t, base+helloWith("one"))
	pid := readyPlugin(t, h, "hello").Pid

	hostile := base + pluginBlock("hello", "hello",
		"  config {\n    greeting = "+strings.Repeat("[", depth)+strings.Repeat("]", depth)+"\n  }")
	line := strings.Count(hostile[:strings.Index(hostile, "greeting = [")], "\n") + 1
	where := fmt.Sprintf("%s:%d:", h.cfgPath, line)
	start := time.Now()
	h.reload(hostile, "config reload rejected")
	t.Logf("reload rejected in %v", time.Since(start))

	log := h.log.String()
	rejected := log[strings.LastIndex(log, "config reload rejected"):]
	if !strings.Contains(rejected, where) || !strings.Contains(rejected, "Config nested too deeply") {
		t.Errorf("rejected reload's log = %.500q, want a diagnosis %q Config nested too deeply", rejected, where)
	}
	if strings.Contains(log, strings.Repeat("[", 1000)) {
		t.Errorf("host log quotes the hostile line at length, want at most its first 1024 bytes")
	}
	select {
	case <-h.exited:
		t.Fatalf("plughost exited on the hostile reload: %v", h.exitErr)
	default:
	}
	if code, body := h.greeting(); code != http.StatusOK || !strings.Contains(body, `"greeting":"one"`) {
		t.Errorf("GET /hello/ after the rejected reload = %d %s, want 200 with greeting one", code, body)
	}
	if got := h.plugins()["hello"].Pid; got != pid {
		t.Errorf("hello pid after the rejected reload = %d, want %d unchanged", got, pid)
	}

	// The host still reloads a good file.
	h.reload(base+helloWith("two"), "config reloaded")
	waitFor(t, 10*time.Second, "GET /hello/ to answer two", func() bool {
		code, body := h.greeting()
		return code == http.StatusOK && strings.Contains(body, `"greeting":"two"`)
	})

	path := writeConfigFile(t, hostile)
	res := runCLI(t, "validate", "-config", path)
	want := fmt.Sprintf("%s:%d:", path, line)
	if res.code != 1 || !strings.Contains(res.stderr, want) || !strings.Contains(res.stderr, "Error: Config nested too deeply") {
		t.Errorf("plughost validate on the hostile file: exit code %d, stderr %.500q; want 1 and %q Error: Config nested too deeply",
			res.code, res.stderr, want)
	}
}

// TestReloadRefusedThenReverted checks that a plugin's last_error tells of
// a reload its new process refused while the old one serves on, and no
// longer does once the config asks again for what the old one runs.
func TestReloadRefusedThenReverted(t *testing.T) {
	base := baseConfig("2s")
	h := startHost(t, base+helloWith("one"))
	pid := readyPlugin(t, h, "hello").Pid

	// hello refuses an empty greeting in Configure.
	h.reload(base+helloWith(""), "plugins refused their new config")
	st := h.plugins()["hello"]
	if !strings.Contains(st.LastError, "the running process stays") || st.Pid != pid || st.State != "ready" {
		t.Fatalf("hello after a refused reload = %+v; want pid %d ready, with a last_error that the running process stays", st, pid)
	}

	h.reload(base+helloWith("one"), "config reloaded")
	if st := h.plugins()["hello"]; st.LastError != "" || st.Pid != pid || st.State != "ready" {
		t.Errorf("hello after reverting the config = %+v; want pid %d ready, with no last_error", st, pid)
	}
	if code, body := h.greeting(); code != http.StatusOK || !strings.Contains(body, `"greeting":"one"`) {
		t.Errorf("GET /hello/ = %d %s, want 200 with greeting one", code, body)
	}
}
