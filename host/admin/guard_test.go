package admin_test

import (
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fromAddr returns a client of p's server whose connections come from
// the loopback address local, so that tests can be two clients.
func (p *page) fromAddr(local string) *http.Client {
	c := *p.srv.Client()
	tr := p.srv.Client().Transport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}).DialContext
	c.Transport = tr
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

// api sends GET /v1/plugins with auth (if not empty) from client c.
func (p *page) api(t *testing.T, c *http.Client, auth string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", p.srv.URL+"/v1/plugins", nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return roundTrip(t, c, req)
}

// roundTrip sends req with c and reads the whole answer.
func roundTrip(t *testing.T, c *http.Client, req *http.Request) response {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

// TestWrongTokensLimited checks that an address gets ten wrong admin
// tokens, then 429 with Retry-After for any token until one more is
// due, on the API and the login form alike; that a right token and no
// token cost nothing; and that other addresses are not held up.
func TestWrongTokensLimited(t *testing.T) {
	p := newPage(t, pageToken, nil)
	right, wrong := "Bearer "+pageToken, "Bearer guess"
	one, two := p.fromAddr("127.0.0.1"), p.fromAddr("127.0.0.2")
	for i := range 20 {
		if r := p.api(t, one, ""); r.code != http.StatusUnauthorized {
			t.Fatalf("request %d without a token = %d, want 401", i, r.code)
		}
	}
	if r := p.api(t, one, right); r.code != http.StatusOK {
		t.Fatalf("the right token after requests without one = %d, want 200", r.code)
	}
	for i := range 9 {
		if r := p.api(t, one, wrong); r.code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d = %d, want 401", i+1, r.code)
		}
	}
	if r := p.send(t, "POST", "/login", url.Values{"token": {"guess"}}, nil); r.code != http.StatusUnauthorized {
		t.Fatalf("the tenth wrong token, on the login form = %d, want 401", r.code)
	}
	r := p.api(t, one, right)
	if r.code != http.StatusTooManyRequests || r.header.Get("Retry-After") != "6" || r.errorCode() != "too_many_attempts" {
		t.Fatalf("the right token after ten wrong ones = %d (Retry-After %q, code %q), want 429 with Retry-After 6 and too_many_attempts",
			r.code, r.header.Get("Retry-After"), r.errorCode())
	}
	r = p.send(t, "POST", "/login", url.Values{"token": {pageToken}}, nil)
	if r.code != http.StatusTooManyRequests || !strings.Contains(r.body, "try again in 6 s") || !strings.Contains(r.body, `name="token"`) {
		t.Fatalf("the login form after ten wrong tokens = %d, want 429 with the form and the wait: %s", r.code, r.body)
	}
	if r := p.send(t, "GET", "/?token="+pageToken, nil, nil); r.code != http.StatusTooManyRequests {
		t.Fatalf("GET /?token= after ten wrong tokens = %d, want 429", r.code)
	}
	if r := p.api(t, two, right); r.code != http.StatusOK {
		t.Fatalf("the right token from another address = %d, want 200", r.code)
	}
	p.clock.add(6 * time.Second)
	if r := p.api(t, one, right); r.code != http.StatusOK {
		t.Fatalf("the right token once one more is due = %d, want 200", r.code)
	}
	if r := p.api(t, one, wrong); r.code != http.StatusUnauthorized {
		t.Fatalf("the wrong token once one more is due = %d, want 401", r.code)
	}
	if r := p.api(t, one, right); r.code != http.StatusTooManyRequests {
		t.Fatalf("the right token after it = %d, want 429", r.code)
	}
	if !strings.Contains(p.log.String(), "too many wrong tokens") || strings.Contains(p.log.String(), pageToken) {
		t.Errorf("the log should say the login was refused for too many wrong tokens, without the token:\n%s", p.log)
	}
}

// TestWrongTokensLimitedAtOnce checks that wrong tokens sent at once are
// compared no more often than one after another would be.
func TestWrongTokensLimitedAtOnce(t *testing.T) {
	p := newPage(t, pageToken, nil)
	c := p.fromAddr("127.0.0.1")
	const n = 50
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { codes <- p.api(t, c, "Bearer guess").code })
	}
	wg.Wait()
	close(codes)
	counts := map[int]int{}
	for code := range codes {
		counts[code]++
	}
	if counts[http.StatusUnauthorized] != 10 || counts[http.StatusTooManyRequests] != n-10 {
		t.Errorf("%d wrong tokens at once answered %v, want 10 × 401 and the rest 429", n, counts)
	}
}

// TestOtherSitesSpendNoTokens checks that tokens a browser sends for
// another site's page (an <img src=".../?token=x">, a form posted to
// /login) are neither checked nor charged, so that no website can lock
// the operator out, while the operator's own attempts are.
func TestOtherSitesSpendNoTokens(t *testing.T) {
	p := newPage(t, pageToken, nil)
	for _, site := range []string{"cross-site", "same-site"} {
		hdr := http.Header{"Sec-Fetch-Site": {site}}
		for i := range 20 {
			if r := p.send(t, "GET", "/?token=guess", nil, hdr); r.code != http.StatusUnauthorized {
				t.Fatalf("GET /?token=guess %d with Sec-Fetch-Site %s = %d, want 401", i, site, r.code)
			}
			if r := p.send(t, "POST", "/login", url.Values{"token": {"guess"}}, hdr); r.code != http.StatusForbidden {
				t.Fatalf("POST /login %d with Sec-Fetch-Site %s = %d, want 403", i, site, r.code)
			}
		}
		if r := p.send(t, "GET", "/?token="+pageToken, nil, hdr); r.code != http.StatusUnauthorized || r.header.Get("Set-Cookie") != "" {
			t.Errorf("GET /?token=TOKEN with Sec-Fetch-Site %s = %d (Set-Cookie %q), want 401 and no session", site, r.code, r.header.Get("Set-Cookie"))
		}
	}
	for _, site := range []string{"none", "same-origin", ""} {
		r := p.send(t, "GET", "/?token="+pageToken, nil, http.Header{"Sec-Fetch-Site": {site}})
		if r.code != http.StatusSeeOther {
			t.Errorf("GET /?token=TOKEN with Sec-Fetch-Site %q = %d, want 303", site, r.code)
		}
	}
	// The operator's own wrong tokens are still charged.
	for i := range 10 {
		if r := p.send(t, "GET", "/?token=guess", nil, http.Header{"Sec-Fetch-Site": {"none"}}); r.code != http.StatusUnauthorized {
			t.Fatalf("the operator's wrong token %d = %d, want 401", i, r.code)
		}
	}
	if r := p.send(t, "GET", "/?token="+pageToken, nil, nil); r.code != http.StatusTooManyRequests {
		t.Errorf("the right token after ten wrong ones = %d, want 429", r.code)
	}
}

// TestLoginUnreadableForm: a login body the form cannot hold a token in
// (multipart, JSON, a form without the field) says so and is not
// charged as a wrong token.
func TestLoginUnreadableForm(t *testing.T) {
	p := newPage(t, pageToken, nil)
	c := p.fromAddr("127.0.0.1")
	post := func(ctype, body string) response {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), "POST", p.srv.URL+"/login", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", ctype)
		return roundTrip(t, c, req)
	}
	for _, tt := range []struct{ ctype, body string }{
		{"multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\nguess\r\n--x--\r\n"},
		{"application/json", `{"token":"guess"}`},
		{"text/plain", "token=guess"},
		{"application/x-www-form-urlencoded", "password=guess"},
	} {
		for range 11 {
			r := post(tt.ctype, tt.body)
			if r.code != http.StatusBadRequest || !strings.Contains(r.body, "The login form could not be read.") {
				t.Fatalf("POST /login as %s = %d, want 400 saying the form could not be read:\n%s", tt.ctype, r.code, r.body)
			}
		}
	}
	if r := post("application/x-www-form-urlencoded", url.Values{"token": {pageToken}}.Encode()); r.code != http.StatusSeeOther {
		t.Errorf("the right token after unreadable forms = %d, want 303", r.code)
	}
}

// TestRefusedAPITokensLogged checks that the admin API logs each wrong
// Bearer token and each request refused while its address is locked
// out, with the address and never the token; that a request without a
// token is no guess and is not logged; and that the lines are limited,
// the next one after a pause saying how many were left out.
func TestRefusedAPITokensLogged(t *testing.T) {
	p := newPage(t, pageToken, nil)
	c := p.fromAddr("127.0.0.1")
	lines := func(msg string) []string {
		var out []string
		for l := range strings.Lines(p.log.String()) {
			if strings.Contains(l, msg+": remote=") {
				out = append(out, l)
			}
		}
		return out
	}
	if r := p.api(t, c, ""); r.code != http.StatusUnauthorized {
		t.Fatalf("a request without a token = %d, want 401", r.code)
	}
	if got := lines("admin api token refused"); len(got) != 0 {
		t.Errorf("a request without a token logged %q, want nothing", got)
	}
	for i := range 10 {
		if r := p.api(t, c, "Bearer guess-"+strconv.Itoa(i)); r.code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d = %d, want 401", i+1, r.code)
		}
	}
	const lockedOut = 50
	for i := range lockedOut {
		if r := p.api(t, c, "Bearer "+pageToken); r.code != http.StatusTooManyRequests {
			t.Fatalf("request %d while locked out = %d, want 429", i+1, r.code)
		}
	}
	wrong := lines("admin api token refused")
	locked := lines("admin api token refused: too many wrong tokens")
	if len(wrong) != 10 || len(locked) != 10 {
		t.Errorf("logged %d wrong tokens and %d lockouts, want 10 and 10 (the first 20 refusals; the rest left out)", len(wrong), len(locked))
	}
	for _, l := range append(wrong, locked...) {
		if !strings.Contains(l, "remote=127.0.0.1:") || !strings.Contains(l, "path=/v1/plugins") {
			t.Errorf("log line %q, want the client's address and the path", l)
		}
	}
	if strings.Contains(p.log.String(), "guess-") || strings.Contains(p.log.String(), pageToken) {
		t.Errorf("the log holds a token:\n%s", p.log)
	}

	p.clock.add(time.Second)
	if r := p.api(t, c, "Bearer "+pageToken); r.code != http.StatusTooManyRequests {
		t.Fatalf("a request a second later = %d, want 429", r.code)
	}
	locked = lines("admin api token refused: too many wrong tokens")
	if want := "suppressed=" + strconv.Itoa(lockedOut-10); len(locked) != 11 || !strings.Contains(locked[10], want) {
		t.Errorf("lockout lines after a second's pause = %q, want an 11th with %s", locked, want)
	}
}
