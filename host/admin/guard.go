package admin

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Wrong admin tokens are limited per client address, as Grafana and
// Jenkins limit failed logins: each address has guessBurst wrong tokens,
// refilled one per guessEvery, and once they are spent its requests that
// carry a token, right or wrong, get 429 with Retry-After without the
// token being compared. A right token costs nothing, so an operator who
// mistypes once is not held up; a script trying tokens gets ten a minute.
const (
	guessBurst = 10
	guessEvery = 6 * time.Second
	// maxGuessers bounds the addresses remembered. When it is reached,
	// those whose allowance is whole again are forgotten; if none is,
	// the newcomers share one allowance.
	maxGuessers = 4096
)

// guard holds the wrong-token allowances.
type guard struct {
	now func() time.Time

	mu       sync.Mutex
	m        map[string]*rate.Limiter
	overflow *rate.Limiter // shared by addresses past maxGuessers
}

func newGuard(now func() time.Time) *guard {
	return &guard{now: now, m: map[string]*rate.Limiter{}, overflow: newAllowance()}
}

func newAllowance() *rate.Limiter { return rate.NewLimiter(rate.Every(guessEvery), guessBurst) }

// clientOf returns the address r came from, without its port.
func clientOf(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// allowance returns the limiter of r's address, or nil if it has none
// yet and add is false. g.mu is held.
func (g *guard) allowance(r *http.Request, add bool) *rate.Limiter {
	key := clientOf(r)
	if l := g.m[key]; l != nil || !add {
		return l
	}
	if len(g.m) >= maxGuessers {
		now := g.now()
		for k, l := range g.m {
			if l.TokensAt(now) >= guessBurst {
				delete(g.m, k)
			}
		}
		if len(g.m) >= maxGuessers {
			return g.overflow
		}
	}
	l := newAllowance()
	g.m[key] = l
	return l
}

// wait returns how long r's address must wait before its next token is
// compared: 0 if it may try now.
func (g *guard) wait(r *http.Request) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.allowance(r, false)
	if l == nil && len(g.m) >= maxGuessers {
		l = g.overflow
	}
	if l == nil {
		return 0
	}
	if t := l.TokensAt(g.now()); t < 1 {
		return time.Duration((1 - t) * float64(guessEvery))
	}
	return 0
}

// failed spends one of r's address's wrong tokens.
func (g *guard) failed(r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.allowance(r, true).AllowN(g.now(), 1)
}

// retryAfter sets Retry-After to wait in whole seconds, rounded up, and
// returns them.
func retryAfter(w http.ResponseWriter, wait time.Duration) int {
	secs := max(int(math.Ceil(wait.Seconds())), 1)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	return secs
}

// tooManyGuesses is what a client out of wrong tokens is told.
func tooManyGuesses(secs int) string {
	return fmt.Sprintf("too many wrong admin tokens from this address; try again in %d s", secs)
}
