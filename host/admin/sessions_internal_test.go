package admin

import (
	"net/http"
	"testing"
	"time"
)

// TestSessionFromARotatedLogin: a login checked before a token rotation
// (endAll) and started after it makes no valid session, while one checked
// after the rotation does.
func TestSessionFromARotatedLogin(t *testing.T) {
	ss := newSessions(time.Now)
	withCookie := func(id string) *http.Request {
		r, _ := http.NewRequest("GET", "/", nil)
		r.AddCookie(&http.Cookie{Name: cookieName, Value: id})
		return r
	}
	before := ss.generation() // the login checks the old token here
	ss.endAll()               // SetToken: the new token, every session ended
	if id := ss.start("", before); ss.valid(withCookie(id), nil) {
		t.Errorf("a session from a login checked before the rotation is valid, want not")
	}
	if id := ss.start("", ss.generation()); !ss.valid(withCookie(id), nil) {
		t.Errorf("a session from a login checked after the rotation is not valid, want valid")
	}
}
