package e2e

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromium returns the path of a Chromium binary. Without one it skips
// the test, except under CI (CI=true), where .ci/run installs it and its
// absence fails the test.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed; .ci/run installs it (apt-get install chromium)")
	}
	t.Skip("chromium is not installed (apt-get install chromium); this test loads the status page in it")
	return ""
}

// browser starts a headless Chromium with a fresh profile and returns a
// tab's context; the browser is stopped on cleanup.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1500, 420),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first Run starts the browser; it must not carry a deadline,
	// which would end the browser with it.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// within runs a with a deadline.
func within[T any](t *testing.T, ctx context.Context, d time.Duration, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("browser: %s: %v", what, err)
	}
	return v
}

// pageRow is one plugin's row as the status page shows it.
type pageRow struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	Serving  string `json:"serving"`
	Pid      string `json:"pid"`
	Restarts string `json:"restarts"`
	Uptime   string `json:"uptime"`
	Requests string `json:"requests"`
}

const rowsJS = `Array.from(document.querySelectorAll("#plugins tr.plugin")).map(r => ({
	name: r.dataset.plugin,
	state: r.querySelector(".state").textContent.trim(),
	serving: r.querySelector(".serving").textContent.trim(),
	pid: r.querySelector(".pid").textContent.trim(),
	restarts: r.querySelector(".restarts").textContent.trim(),
	uptime: r.querySelector(".uptime").textContent.trim(),
	requests: r.querySelector(".requests").textContent.trim(),
}))`

// rows reads the plugins' rows from the page now in the tab. The page
// reloads itself, so a read that meets a reload fails; it is an error,
// not a fatal one.
func rows(ctx context.Context) (map[string]pageRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	list, err := chromedp.Run(ctx, chromedp.Evaluate[[]pageRow](rowsJS))
	if err != nil {
		return nil, err
	}
	out := map[string]pageRow{}
	for _, r := range list {
		out[r.Name] = r
	}
	return out, nil
}

// waitRows polls the page in the tab, as it reloads itself, until cond
// holds of its rows.
func waitRows(t *testing.T, ctx context.Context, d time.Duration, what string, cond func(map[string]pageRow) bool) map[string]pageRow {
	t.Helper()
	var last map[string]pageRow
	var lastErr error
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		rs, err := rows(ctx)
		if err == nil && cond(rs) {
			return rs
		}
		if err == nil {
			last = rs
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the status page did not show %s within %v; it last showed %+v (last error %v)", what, d, last, lastErr)
	return nil
}

// TestStatusPageInBrowser loads the admin status page in a real headless
// Chromium: without the token it answers 401 and shows no plugin; after
// a login it shows every plugin ready; after a kill -9 of a plugin it
// shows, by reloading itself, the restart and the plugin ready again; its
// restart button works from the browser. The admin token is in no log.
func TestStatusPageInBrowser(t *testing.T) {
	ctx := browser(t)
	const token = "status-page-t0ken-9d1c"
	cfg, _ := tokenConfig(t, "2s", token)
	h := startHost(t, cfg+pluginBlock("hello", "hello", "")+pluginBlock("faulty", "faulty", ""))
	auth := http.Header{"Authorization": {"Bearer " + token}}
	waitFor(t, 30*time.Second, "hello and faulty to be ready", func() bool {
		ps := adminPlugins(t, h, auth)
		return ps["hello"].State == "ready" && ps["faulty"].State == "ready"
	})
	before := adminPlugins(t, h, auth)

	// Without the token: 401, a login form, no plugin.
	resp := within(t, ctx, 20*time.Second, "open the page", chromedp.NavigateResponse(h.admin+"/"))
	if resp.Status != http.StatusUnauthorized {
		t.Errorf("the page without the token answered %d, want 401", resp.Status)
	}
	text := within(t, ctx, 5*time.Second, "read the page", chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	for _, name := range []string{"hello", "faulty", strconv.Itoa(before["hello"].Pid)} {
		if strings.Contains(text, name) {
			t.Errorf("the page without the token shows %q:\n%s", name, text)
		}
	}

	// The login form.
	within(t, ctx, 20*time.Second, "log in", chromedp.Steps(
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)),
		chromedp.WaitVisible(chromedp.CSS("#plugins")),
	))
	rs := waitRows(t, ctx, 10*time.Second, "hello and faulty ready", func(rs map[string]pageRow) bool {
		return rs["hello"].State == "ready" && rs["faulty"].State == "ready"
	})
	for _, name := range []string{"hello", "faulty"} {
		if r, want := rs[name], strconv.Itoa(before[name].Pid); r.Pid != want || r.Serving != "yes" || r.Restarts != "0" {
			t.Errorf("the page shows %s as %+v, want pid %s, serving yes, 0 restarts", name, r, want)
		}
	}
	// kill -9: the page, reloading itself, shows the restart, then the
	// plugin ready with a new pid.
	old := before["hello"]
	if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 hello (pid %d): %v", old.Pid, err)
	}
	waitRows(t, ctx, 60*time.Second, "hello restarted once and ready with a new pid", func(rs map[string]pageRow) bool {
		r := rs["hello"]
		return r.Restarts == "1" && r.State == "ready" && r.Serving == "yes" && r.Pid != strconv.Itoa(old.Pid) && r.Pid != "–"
	})
	if now := adminPlugins(t, h, auth)["hello"]; now.Restarts != 1 || now.State != "ready" {
		t.Errorf("GET /v1/plugins after the kill shows hello as %+v, want ready after 1 restart", now)
	}

	// The restart button, from the browser: the cross-origin check lets
	// the page's own form through.
	within(t, ctx, 20*time.Second, "press faulty's restart button", chromedp.Steps(
		chromedp.Click(chromedp.CSS(`tr[data-plugin="faulty"] form[action$="/restart"] button`)),
		chromedp.WaitVisible(chromedp.CSS(".flash")),
	))
	flash := within(t, ctx, 5*time.Second, "read the outcome", chromedp.TextContent(chromedp.CSS(".flash")))
	if !strings.Contains(flash, "faulty: restart asked for") {
		t.Errorf("the page after the restart button says %q, want that a restart of faulty was asked for", flash)
	}
	waitRows(t, ctx, 60*time.Second, "faulty restarted once and ready", func(rs map[string]pageRow) bool {
		r := rs["faulty"]
		return r.Restarts == "1" && r.State == "ready" && r.Pid != strconv.Itoa(before["faulty"].Pid)
	})

	// Traffic shows in the request rate, read from the host's metrics.
	for range 50 {
		if resp, body := mustRequest(t, http.MethodGet, h.ingress+"/hello/", nil, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /hello/ = %d %s, want 200", resp.StatusCode, body)
		}
	}
	waitRows(t, ctx, 30*time.Second, "a request rate for hello", func(rs map[string]pageRow) bool {
		r := rs["hello"].Requests
		return strings.HasSuffix(r, "/s") && r != "0.00/s"
	})
	shot := within(t, ctx, 20*time.Second, "screenshot", chromedp.FullScreenshot(100))
	png := filepath.Join(t.ArtifactDir(), "status-page.png")
	if err := os.WriteFile(png, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the status page: %s", png)

	// ?token= logs in too, and the redirect keeps the token out of the
	// address and the history.
	within(t, ctx, 20*time.Second, "log out", chromedp.Steps(
		chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
	))
	within(t, ctx, 20*time.Second, "open the page with ?token=", chromedp.Steps(
		chromedp.Navigate(h.admin+"/?token="+token),
		chromedp.WaitVisible(chromedp.CSS("#plugins")),
	))
	if loc := within(t, ctx, 5*time.Second, "read the address", chromedp.Location()); loc != h.admin+"/" {
		t.Errorf("the address after ?token= = %q, want %q", loc, h.admin+"/")
	}
	hist := within(t, ctx, 5*time.Second, "read the history", chromedp.NavigationEntries())
	for _, e := range hist.Entries {
		if strings.Contains(e.URL, token) {
			t.Errorf("the browser's history keeps the token: %s", e.URL)
		}
	}

	if strings.Contains(h.log.String(), token) {
		t.Errorf("the host's log shows the admin token")
	}
	if !strings.Contains(h.log.String(), "status page login") {
		t.Errorf("the host's log has no status page login; the check above proves nothing:\n%s", h.log.String())
	}
}
