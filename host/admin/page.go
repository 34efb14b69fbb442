package admin

import (
	"bytes"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"fmt"
	"html/template"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/plughost/plughost/host/supervisor"
	"github.com/plughost/plughost/sdk"
)

// The status page: GET / with every plugin, a login form when the admin
// token is set, and restart and upgrade buttons. It is rendered on the
// server and refreshes itself with a meta refresh, so it needs no script
// and nothing from another origin.
//
// With a token, the page needs a session: POST /login with the token in
// a form, or GET /?token=TOKEN, which is then redirected to / so that the
// token stays out of the browser's history, starts one, held in an
// HttpOnly, SameSite=Strict cookie. The buttons post forms; besides the
// session, http.CrossOriginProtection refuses any POST a browser marks
// as coming from another origin.

// SessionCookie is the name of the cookie that holds a status page
// session. The ingress hides it from plugins (ingress.HideCookie).
const SessionCookie = "plughost_admin"

const (
	cookieName = SessionCookie
	// sessionTTL is how long a session lasts from its login.
	sessionTTL = 12 * time.Hour
	// maxSessions bounds the sessions kept; a login past it ends the
	// one closest to expiring.
	maxSessions = 64
	// refreshSeconds is how often the page reloads itself.
	refreshSeconds = 5
)

//go:embed page.html
var pageFS embed.FS

var pageTemplate = template.Must(template.New("page.html").ParseFS(pageFS, "page.html"))

// session is one logged-in browser.
type session struct {
	expires time.Time
	// flash is the outcome of the last button pressed, shown once.
	flash string
	// gen is the sessions' generation its login was checked in.
	gen uint64
}

// sessions holds the status page's sessions, by cookie value.
type sessions struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[string]*session
	// gen counts endAll: a session started from a login checked before
	// the last one is not valid (generation, start).
	gen uint64
}

func newSessions(now func() time.Time) *sessions {
	return &sessions{now: now, m: map[string]*session{}}
}

// generation returns the sessions' generation, which a login takes before
// it checks the token, and gives start.
func (ss *sessions) generation() uint64 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.gen
}

// start makes a session of generation gen showing flash next and returns
// its cookie value. A gen older than the sessions' makes a session that
// is never valid: its login was checked against a token replaced since.
func (ss *sessions) start(flash string, gen uint64) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	id := base64.RawURLEncoding.EncodeToString(b)
	now := ss.now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var first string
	for k, s := range ss.m {
		if !now.Before(s.expires) {
			delete(ss.m, k)
		} else if first == "" || s.expires.Before(ss.m[first].expires) {
			first = k
		}
	}
	if len(ss.m) >= maxSessions {
		delete(ss.m, first)
	}
	ss.m[id] = &session{expires: now.Add(sessionTTL), flash: flash, gen: gen}
	return id
}

// valid reports whether r carries a live session's cookie; with flash
// set, it also takes the session's flash message.
func (ss *sessions) valid(r *http.Request, flash *string) bool {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return false
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.m[c.Value]
	if !ok || !ss.now().Before(s.expires) || s.gen != ss.gen {
		delete(ss.m, c.Value)
		return false
	}
	if flash != nil {
		*flash, s.flash = s.flash, ""
	}
	return true
}

// setFlash sets the message r's session shows next.
func (ss *sessions) setFlash(r *http.Request, msg string) {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s, ok := ss.m[c.Value]; ok {
		s.flash = msg
	}
}

// endAll ends every session.
func (ss *sessions) endAll() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	clear(ss.m)
	ss.gen++
}

// end ends r's session, if any.
func (ss *sessions) end(r *http.Request) {
	if c, err := r.Cookie(cookieName); err == nil {
		ss.mu.Lock()
		delete(ss.m, c.Value)
		ss.mu.Unlock()
	}
}

// crossOrigin returns the protection of every state-changing admin
// route against requests a browser makes for another origin's page: a
// form post to the listener's address from a site the operator has open
// is refused 403, while scripts, which send neither Origin nor
// Sec-Fetch-Site, pass.
func (s *Server) crossOrigin() *http.CrossOriginProtection {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.logger.Warn("admin post from another origin refused", "path", r.URL.Path, "remote", r.RemoteAddr)
		sdk.WriteError(w, http.StatusForbidden, "cross_origin", "cross-origin request refused")
	}))
	return cop
}

// pageRoutes registers the status page's routes on mux.
func (s *Server) pageRoutes(mux *http.ServeMux, cop *http.CrossOriginProtection) {
	mux.HandleFunc("GET /{$}", s.servePage)
	mux.Handle("POST /login", cop.Handler(http.HandlerFunc(s.login)))
	mux.Handle("POST /logout", cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.sessions.end(r)
		http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
		http.Redirect(w, r, "/", http.StatusSeeOther)
	})))
	mux.Handle("POST /plugins/{name}/restart", cop.Handler(s.action("restart", restart)))
	mux.Handle("POST /plugins/{name}/upgrade", cop.Handler(s.action("upgrade", upgrade)))
}

// checkToken reports whether got, from the login form or ?token=, is the
// admin token. If not, it has answered with the login form: 401, or 429
// once r's address has spent its wrong tokens (guard).
func (s *Server) checkToken(w http.ResponseWriter, r *http.Request, got string) bool {
	ok, wait := s.guard.check(r, []byte(got), []byte(s.tokenNow()))
	if wait > 0 {
		s.refused.warn("status page login refused: too many wrong tokens", r)
		w.Header().Set("WWW-Authenticate", `Bearer realm="plughost admin"`)
		msg := tooManyGuesses(retryAfter(w, wait))
		s.render(w, http.StatusTooManyRequests, pageData{Message: strings.ToUpper(msg[:1]) + msg[1:] + "."})
		return false
	}
	if !ok {
		s.refused.warn("status page login refused", r)
		s.renderLogin(w, "That is not the admin token.")
		return false
	}
	return true
}

// fromOtherSite reports whether a browser marked r as made for another
// site's page, or for a page of a sibling subdomain or port
// (Sec-Fetch-Site cross-site or same-site). The operator's own requests,
// typed or bookmarked (none) or from the page itself (same-origin), and
// those of clients that send no Sec-Fetch-Site, are not.
func fromOtherSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return true
	}
	return false
}

// servePage serves the status page, or the login form with 401.
func (s *Server) servePage(w http.ResponseWriter, r *http.Request) {
	var flash string
	switch {
	case s.tokenNow() == "":
		s.sessions.valid(r, &flash) // a session without a token only carries the flash
	case r.URL.Query().Has("token"):
		if fromOtherSite(r) {
			// Any page can make a browser fetch /?token=x (an <img>,
			// a link): were it checked, its wrong tokens would spend
			// the operator's allowance and lock them out.
			s.logger.Warn("status page token from another site not checked", "remote", r.RemoteAddr)
			s.renderLogin(w, "A token in a link from another site is not checked: log in here.")
			return
		}
		gen := s.sessions.generation()
		if !s.checkToken(w, r, r.URL.Query().Get("token")) {
			return
		}
		s.newSession(w, r, gen)
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	case !s.sessions.valid(r, &flash):
		s.renderLogin(w, "")
		return
	}
	o := s.overview()
	s.render(w, http.StatusOK, pageData{
		Authed: true, Logout: s.tokenNow() != "", Flash: flash, Refresh: refreshSeconds,
		Time: o.Time.UTC().Format(time.RFC3339), Window: windowText(o.WindowSeconds), Rows: rows(o),
	})
}

// login checks the token posted by the login form.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	if s.tokenNow() == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	// Only the login form's own encoding holds a token: a body of
	// another type (multipart, JSON) parses as a form without one, and
	// must not be taken, and charged, as a wrong token.
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err := r.ParseForm(); err != nil || mt != "application/x-www-form-urlencoded" || !r.PostForm.Has("token") {
		s.render(w, http.StatusBadRequest, pageData{Message: "The login form could not be read."})
		return
	}
	gen := s.sessions.generation()
	if !s.checkToken(w, r, r.PostForm.Get("token")) {
		return
	}
	s.newSession(w, r, gen)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// newSession starts a session of generation gen, taken before the
// token was checked, and sets its cookie on w.
func (s *Server) newSession(w http.ResponseWriter, r *http.Request, gen uint64) {
	setSession(w, s.sessions.start("", gen))
	s.logger.Info("status page login", "remote", r.RemoteAddr)
}

// setSession sets the cookie of the session id on w.
func setSession(w http.ResponseWriter, id string) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: id, Path: "/", MaxAge: int(sessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode,
	})
}

// action serves a button: it asks for the action as the admin API's
// endpoint does, then sends the browser back to the page, which shows the
// outcome once. The outcome is kept in the browser's session; without a
// token there is no login, so a session is started for it. The message
// stays on the host, so no other page (another port of the same host
// can set this origin's cookies) can make the page say what it likes.
func (s *Server) action(what string, do func(Plugins, string) *apiError) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.tokenNow() != "" && !s.sessions.valid(r, nil) {
			s.renderLogin(w, "")
			return
		}
		name := r.PathValue("name")
		msg := fmt.Sprintf("%s: %s asked for.", name, what)
		if e := do(s.plugins, name); e != nil {
			msg = fmt.Sprintf("%s: %s refused: %s", name, what, e.message)
		}
		s.logger.Info("operator action from the status page", "action", what, "plugin", name, "remote", r.RemoteAddr)
		if s.tokenNow() == "" && !s.sessions.valid(r, nil) {
			setSession(w, s.sessions.start(msg, s.sessions.generation()))
		} else {
			s.sessions.setFlash(r, msg)
		}
		http.Redirect(w, r, "/", http.StatusSeeOther)
	})
}

// pageData is what page.html shows.
type pageData struct {
	Authed  bool // false: the login form
	Logout  bool // a token is set, so there is a session to end
	Message string
	Flash   string
	Refresh int
	Time    string
	Window  string
	Rows    []row
}

// row is one plugin as the page shows it.
type row struct {
	Name, Mount, State, Serving, Health, Reason, Pid, Version, Uptime string
	Restarts, InWindow, Inflight, Queued, Requests, Errors, P99       string
	LastError                                                         string
	Ready                                                             bool
}

func rows(o Overview) []row {
	out := make([]row, 0, len(o.Plugins))
	for _, p := range o.Plugins {
		ready := p.State == supervisor.StateReady && p.Health != "not_ready"
		r := row{
			Name: p.Name, Mount: p.Mount, State: string(p.State), Health: p.Health, Reason: p.HealthReason,
			Pid: "–", Version: p.Version, Uptime: "–", Serving: "no",
			Restarts: fmt.Sprint(p.Restarts), InWindow: fmt.Sprint(p.RestartsInWindow),
			Inflight: fmt.Sprint(p.Inflight), Queued: fmt.Sprint(p.Queued),
			Requests: "–", Errors: "–", P99: "–", LastError: p.LastError, Ready: ready,
		}
		if ready {
			r.Serving = "yes"
		}
		if p.Pid > 0 {
			r.Pid = fmt.Sprint(p.Pid)
			r.Uptime = seconds(p.UptimeSeconds).String()
		}
		if p.RequestRate != nil {
			r.Requests = fmt.Sprintf("%.2f/s", *p.RequestRate)
			r.Errors = fmt.Sprintf("%.2f/s", *p.ErrorRate)
		}
		if p.P99Seconds != nil {
			r.P99 = fmt.Sprintf("%.1f ms", *p.P99Seconds*1000)
		}
		out = append(out, r)
	}
	return out
}

func windowText(secs float64) string {
	if secs == 0 {
		return "no rates yet: the first samples are being taken"
	}
	return fmt.Sprintf("rates over the last %s", seconds(secs))
}

// seconds is secs as a duration, to the second.
func seconds(secs float64) time.Duration {
	return time.Duration(secs * float64(time.Second)).Round(time.Second)
}

// renderLogin answers 401 with the login form and nothing else.
func (s *Server) renderLogin(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="plughost admin"`)
	s.render(w, http.StatusUnauthorized, pageData{Message: msg})
}

// render executes the page into a buffer first, so that a template
// error is a 500 rather than half a page.
func (s *Server) render(w http.ResponseWriter, code int, d pageData) {
	var buf bytes.Buffer
	if err := s.page.Execute(&buf, d); err != nil {
		s.logger.Error("status page template failed", "error", err)
		sdk.WriteError(w, http.StatusInternalServerError, "internal", "the status page could not be rendered")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Referrer-Policy", "no-referrer") // Cache-Control and nosniff: ServeHTTP
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}
