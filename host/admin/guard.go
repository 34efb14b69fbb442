package admin

import (
	"crypto/subtle"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/time/rate"

	"github.com/plughost/plughost/host/internal/clientkey"
)

// Wrong admin tokens are limited per client (clientOf), as Grafana and
// Jenkins limit failed logins: each address has guessBurst wrong tokens,
// refilled one per guessEvery, and once they are spent its requests that
// carry a token, right or wrong, get 429 with Retry-After without the
// token being compared. A right token costs nothing, so an operator who
// mistypes once is not held up; a script trying tokens gets ten a minute,
// however many it sends at once.
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

// clientOf returns the client r came from, as its allowance is kept:
// clientkey.Of its address (an IPv6 address's /64), as max_conns_per_ip
// counts clients, or the whole RemoteAddr when it holds no IP address.
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	return clientkey.Of(ip).String()
}

// allowance returns the limiter of r's address. g.mu is held.
func (g *guard) allowance(r *http.Request) *rate.Limiter {
	key := clientOf(r)
	if l := g.m[key]; l != nil {
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

// check compares got with want, if r's address has a wrong token left:
// it takes one first, under the lock, so that requests at once cannot
// all be compared on the last one, and gives it back if got is right.
// It returns whether got is want, and how long the address must wait
// when it had none left (got then unread).
func (g *guard) check(r *http.Request, got, want []byte) (ok bool, wait time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	l := g.allowance(r)
	res := l.ReserveN(now, 1)
	if d := res.DelayFrom(now); !res.OK() || d > 0 {
		res.CancelAt(now)
		return false, max(d, time.Nanosecond)
	}
	if subtle.ConstantTimeCompare(got, want) == 1 {
		res.CancelAt(now) // a right token costs nothing
		return true, 0
	}
	return false, 0
}

// Refused tokens are logged with the client's address, at most
// refusalLogBurst lines at once and one per refusalLogEvery after that,
// for every client together: a flood of guesses from many addresses, or
// a client retrying while locked out, cannot flood the log. The next line
// logged says how many were left out ("suppressed").
const (
	refusalLogBurst = 20
	refusalLogEvery = time.Second
)

// refusalLog logs refused tokens, rate-limited.
type refusalLog struct {
	logger     hclog.Logger
	now        func() time.Time
	limit      *rate.Limiter
	suppressed atomic.Uint64
}

func newRefusalLog(logger hclog.Logger, now func() time.Time) *refusalLog {
	return &refusalLog{logger: logger, now: now, limit: rate.NewLimiter(rate.Every(refusalLogEvery), refusalLogBurst)}
}

// warn logs msg with r's address and args, unless the limit is spent.
// It never logs the token: callers pass none.
func (l *refusalLog) warn(msg string, r *http.Request, args ...any) {
	if !l.limit.AllowN(l.now(), 1) {
		l.suppressed.Add(1)
		return
	}
	args = append([]any{"remote", r.RemoteAddr}, args...)
	if n := l.suppressed.Swap(0); n > 0 {
		args = append(args, "suppressed", n)
	}
	l.logger.Warn(msg, args...)
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
