package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// TestAdminRefusesUnknownHost rebinds a name to the admin listener, as a
// DNS rebinding page would: the browser sends the rebound name as Host
// and as Origin, so the origin check alone lets its requests through.
// Without a token (the default config), the listener must still refuse
// them, while its IP address, localhost and a name in admin.hosts work.
func TestAdminRefusesUnknownHost(t *testing.T) {
	cfg := strings.Replace(baseConfig("2s"), "admin {\n", "admin {\n  hosts = [\"Admin.Example.Internal\"]\n", 1)
	h := startHost(t, cfg+faultsOn+pluginBlock("faulty", "faulty", ""))
	u, err := url.Parse(h.admin)
	if err != nil {
		t.Fatal(err)
	}
	port := u.Port()
	send := func(t *testing.T, method, path, host, body string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, h.admin+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Origin", "http://"+host)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	rebound := "rebind.attacker.example:" + port
	for _, tt := range []struct{ method, path, body string }{
		{"POST", "/v1/plugins/faulty/faults", `{"faults":[{"point":"serve","error":"boom"}]}`},
		{"POST", "/v1/plugins/faulty/restart", ""},
		{"GET", "/v1/plugins", ""},
		{"GET", "/", ""},
		{"POST", "/plugins/faulty/restart", ""},
		{"GET", "/metrics", ""},
	} {
		resp, body := send(t, tt.method, tt.path, rebound, tt.body)
		checkJSONError(t, tt.method+" "+tt.path+" for "+rebound, resp, body, http.StatusMisdirectedRequest, "unknown_host")
	}
	if r := h.plugins()["faulty"].Restarts; r != 0 {
		t.Errorf("faulty restarts after refused restarts = %d, want 0", r)
	}
	for _, host := range []string{u.Host, "localhost:" + port, "LOCALHOST", "[::1]:" + port, "admin.example.internal:" + port} {
		if resp, body := send(t, "GET", "/v1/plugins", host, ""); resp.StatusCode != http.StatusOK {
			t.Errorf("GET /v1/plugins for Host %q = %d %s, want 200", host, resp.StatusCode, body)
		}
	}
}

// TestAdminNonCanonicalTargets sends targets that net/http's ServeMux
// and Server would answer themselves, with an HTML redirect or an empty
// 200, through the host binary: each must be the admin listener's JSON
// 404, without a Location.
func TestAdminNonCanonicalTargets(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("hello", "hello", ""))
	addr := strings.TrimPrefix(h.admin, "http://")
	for _, line := range []string{
		"GET /v1 HTTP/1.1",
		"GET /v1/plugins/../%3Cimg%20src=x%3E HTTP/1.1",
		"GET /v1/./plugins HTTP/1.1",
		"GET //v1/plugins HTTP/1.1",
		"POST /v1/plugins/hello/../hello/restart HTTP/1.1",
		"OPTIONS * HTTP/1.1",
	} {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, line+"\r\nHost: "+addr+"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = conn.Close()
		checkJSONError(t, line, resp, body, http.StatusNotFound, "not_found")
		if loc := resp.Header.Get("Location"); loc != "" {
			t.Errorf("%s: Location %q, want none", line, loc)
		}
	}
	if r := h.plugins()["hello"].Restarts; r != 0 {
		t.Errorf("hello restarts after a non-canonical restart = %d, want 0", r)
	}
}

// TestReloadWarnsOfUnusableTokenFile: a reload that finds the admin
// token file open to other users, which run would refuse, warns with the
// diagnostic at token_file, and the host keeps the token it started with.
func TestReloadWarnsOfUnusableTokenFile(t *testing.T) {
	const token = "reload-t0ken"
	cfg, tokenFile := tokenConfig(t, "2s", token)
	h := startHost(t, cfg)
	if err := os.Chmod(tokenFile, 0o644); err != nil {
		t.Fatal(err)
	}
	h.reload(cfg, "config reloaded")
	line := 1 + strings.Count(cfg[:strings.Index(cfg, "token_file")], "\n")
	log := h.log.String()
	for _, want := range []string{"admin token file unusable", "Admin token file open to other users", fmt.Sprintf("%s:%d", h.cfgPath, line)} {
		if !strings.Contains(log, want) {
			t.Errorf("the log after a reload with a 0644 token file has no %q:\n%s", want, log)
		}
	}
	if code, body := do(t, "GET", h.admin+"/v1/plugins", nil, http.Header{"Authorization": {"Bearer " + token}}); code != http.StatusOK {
		t.Errorf("GET /v1/plugins with the token after the reload = %d %s, want 200", code, body)
	}
}

// TestReloadRotatesToken: a reload that finds another token in the admin
// token file applies it at once: the old token gets 401, the new one is
// served, and the status page's sessions have ended.
func TestReloadRotatesToken(t *testing.T) {
	const oldToken, newToken = "old-t0ken", "new-t0ken"
	cfg, tokenFile := tokenConfig(t, "2s", oldToken)
	h := startHost(t, cfg)
	noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(h.admin + "/?token=" + oldToken)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || len(cookies) == 0 {
		t.Fatalf("GET /?token= = %d with cookies %v, want 303 and a session", resp.StatusCode, cookies)
	}
	page := func() int {
		t.Helper()
		req, _ := http.NewRequest("GET", h.admin+"/", nil)
		for _, c := range cookies {
			req.AddCookie(c)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := page(); code != http.StatusOK {
		t.Fatalf("GET / with the session = %d, want 200", code)
	}
	api := func(token string) int {
		t.Helper()
		code, _ := do(t, "GET", h.admin+"/v1/plugins", nil, http.Header{"Authorization": {"Bearer " + token}})
		return code
	}

	if err := os.WriteFile(tokenFile, []byte(newToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.reload(cfg, "config reloaded")
	if !strings.Contains(h.log.String(), "admin token changed") {
		t.Errorf("the log after the reload does not say the token changed:\n%s", h.log.String())
	}
	if code := api(oldToken); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/plugins with the old token after the reload = %d, want 401", code)
	}
	if code := api(newToken); code != http.StatusOK {
		t.Errorf("GET /v1/plugins with the new token after the reload = %d, want 200", code)
	}
	if code := page(); code != http.StatusUnauthorized {
		t.Errorf("GET / with the session started under the old token = %d, want 401: the sessions end", code)
	}
	// The same token again changes nothing.
	h.reload(cfg, "config reloaded")
	if n := strings.Count(h.log.String(), "admin token changed"); n != 1 {
		t.Errorf("the log says %d times that the token changed, want once", n)
	}
}
