package ingress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/host/supervisor"
)

// StreamLimits bound requests to streaming routes. They are part of
// Limits.
type StreamLimits struct {
	// MaxStreamsPerIP caps one client's concurrent streams, across
	// plugins, a client being an IPv4 address or an IPv6 /64 (keyOf); 0
	// means no cap.
	MaxStreamsPerIP int
	// StreamWriteTimeout cuts a stream whose client accepts no bytes for
	// this long; 0 means never.
	StreamWriteTimeout time.Duration
	// StreamMaxLifetime ends a stream this long after it began, give or
	// take up to 10% (jittered); 0 means never.
	StreamMaxLifetime time.Duration
	// StreamBuffer is the response credit a stream starts with, in bytes;
	// 0 means the data plane's default.
	StreamBuffer int64
}

// streams counts streams per plugin (surviving routing-table rebuilds,
// like the in-flight counters) and per client address.
type streams struct {
	mu     sync.Mutex
	byName map[string]*atomic.Int64
	byIP   map[netip.Addr]int
}

// streamEntry is a plugin entry's stream cap, count and metrics.
type streamEntry struct {
	open       *atomic.Int64
	max        int64
	gauge      prometheus.Gauge
	rejectMax  prometheus.Counter
	rejectIP   prometheus.Counter
	cutTimeout prometheus.Counter
	cutLife    prometheus.Counter
}

// initStreams sets up e's stream cap and metrics.
func (g *Ingress) initStreams(e *entry, name string, maxStreams int) {
	g.streams.mu.Lock()
	if g.streams.byName == nil {
		g.streams.byName = map[string]*atomic.Int64{}
	}
	c, ok := g.streams.byName[name]
	if !ok {
		c = &atomic.Int64{}
		g.streams.byName[name] = c
	}
	g.streams.mu.Unlock()
	m := g.metrics.Conns
	e.streams = &streamEntry{
		open:       c,
		max:        int64(maxStreams),
		gauge:      m.Streams.WithLabelValues(name),
		rejectMax:  m.StreamRejections.WithLabelValues(name, "max_streams"),
		rejectIP:   m.StreamRejections.WithLabelValues(name, "max_streams_per_ip"),
		cutTimeout: m.StreamsCut.WithLabelValues(name, "write_timeout"),
		cutLife:    m.StreamsCut.WithLabelValues(name, "lifetime"),
	}
}

// admitStream takes a stream slot of e's plugin and of the client's
// address, or answers 429. Streams never take the in-flight slots that
// ordinary requests need: a held stream costs its client a connection and
// the plugin a handler, not the plugin's capacity to answer. It returns
// the function that gives the slots back, or nil and the status written.
func (g *Ingress) admitStream(w http.ResponseWriter, r *http.Request, e *entry, limits *Limits) (func(), int) {
	name := e.target.Name()
	s := e.streams
	if n := s.open.Add(1); s.max > 0 && n > s.max {
		s.open.Add(-1)
		s.rejectMax.Inc()
		return nil, writeError(w, http.StatusTooManyRequests, "too_many_streams",
			fmt.Sprintf("plugin %q is at its limit of %d concurrent streams", name, s.max))
	}
	ip, perIP := netip.Addr{}, false
	if limits.MaxStreamsPerIP > 0 {
		ip, perIP = clientKey(r.RemoteAddr)
	}
	if perIP {
		g.streams.mu.Lock()
		if g.streams.byIP == nil {
			g.streams.byIP = map[netip.Addr]int{}
		}
		full := g.streams.byIP[ip] >= limits.MaxStreamsPerIP
		if !full {
			g.streams.byIP[ip]++
		}
		g.streams.mu.Unlock()
		if full {
			s.open.Add(-1)
			s.rejectIP.Inc()
			return nil, writeError(w, http.StatusTooManyRequests, "too_many_streams",
				fmt.Sprintf("this client is at its limit of %d concurrent streams", limits.MaxStreamsPerIP))
		}
	}
	s.gauge.Inc()
	return func() {
		s.open.Add(-1)
		s.gauge.Dec()
		if perIP {
			g.streams.mu.Lock()
			if g.streams.byIP[ip]--; g.streams.byIP[ip] <= 0 {
				delete(g.streams.byIP, ip)
			}
			g.streams.mu.Unlock()
		}
	}, 0
}

// stream is one stream being answered.
type stream struct {
	e            *streamEntry
	writeTimeout time.Duration
	expired      atomic.Bool // the stream reached its maximum lifetime
}

// startStream bounds a stream's lifetime: when it is over, ctx ends,
// which tells the plugin to stop (Cancel) and ends the response. Call
// stop once the stream is answered.
func startStream(ctx context.Context, e *entry, limits *Limits) (_ context.Context, s *stream, stop func()) {
	s = &stream{e: e.streams, writeTimeout: limits.StreamWriteTimeout}
	if limits.StreamMaxLifetime <= 0 {
		return ctx, s, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	t := time.AfterFunc(jittered(limits.StreamMaxLifetime, rand.Float64()), func() {
		s.expired.Store(true)
		cancel()
	})
	return ctx, s, func() {
		t.Stop()
		cancel()
	}
}

// jittered returns d moved by up to 10% either way, by u in [0, 1): the
// streams opened together (after a restart, say) then end spread over a
// fifth of their lifetime, and their clients do not all reconnect at
// once.
func jittered(d time.Duration, u float64) time.Duration {
	return d + time.Duration((u-0.5)*0.2*float64(d))
}

// answerStream writes a plugin's streaming response, flushing each piece
// as it comes. Each write must be taken by the client within the stream
// write timeout, or the stream is cut: the connection is closed and the
// plugin told to cancel the request, so it stops producing. A stream at
// its maximum lifetime ends cleanly, so a client can reconnect.
func (g *Ingress) answerStream(ctx context.Context, w http.ResponseWriter, r *http.Request, e *entry, ep *supervisor.Endpoint, resp *dataplane.Response, s *stream) (int, bool) {
	defer resp.Close()
	if !finalStatus(resp.Status) {
		return badStatus(w, r, e, resp.Status), false
	}
	dropHopHeaders(w.Header())
	ownHopHeaders(w.Header(), r)
	code := resp.Status
	rc := http.NewResponseController(w)
	if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
		// The kernel's send buffer is the part of a stream's buffer the
		// host does not see: keep it near the plugin's window, so that a
		// client that stops reading is noticed after that much, not after
		// the megabytes the kernel would otherwise take on for it.
		if setWriteBuffer(c, int(max(resp.Window(), 4<<10))) == nil {
			// The connection closes after the stream rather than serve
			// later requests with the small buffer. Setting the size
			// back would not undo it: once set, SO_SNDBUF turns off the
			// kernel's tuning of the buffer for the socket's life, and a
			// stream is long enough that a new connection costs nothing.
			w.Header().Set("Connection", "close")
		}
	}
	// A write to a client that has stopped reading blocks in the kernel
	// whatever ctx says; when ctx ends (the client went away, the route's
	// timeout or the stream's lifetime passed) it must fail at once.
	var (
		mu    sync.Mutex
		ended bool // the stream is ending cleanly: leave its deadline alone
	)
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !ended {
			_ = rc.SetWriteDeadline(time.Now())
		}
	})
	defer func() {
		// stop does not wait for a callback already started: taking mu
		// does, and ended keeps one not yet in from touching a writer
		// that is no longer the handler's (the front reuses its own).
		stop()
		mu.Lock()
		ended = true
		mu.Unlock()
	}()
	end := func() int {
		mu.Lock()
		ended = true
		mu.Unlock()
		return s.end(rc, code)
	}
	w.WriteHeader(code)
	if !s.write(rc, w, nil) {
		return code, false
	}
	for {
		piece, err := resp.Next()
		if err == io.EOF {
			return end(), false
		}
		if err != nil {
			if s.expired.Load() {
				s.e.cutLife.Inc()
				return end(), false
			}
			if r.Context().Err() != nil {
				return code, false // the client went away
			}
			if errors.Is(err, context.DeadlineExceeded) {
				// The route's own timeout ends its stream.
				return end(), false
			}
			if ep.Aborted() {
				e.metrics.aborted.Inc()
			}
			return code, true
		}
		if ctx.Err() != nil {
			// Ended meanwhile (its timeout, its lifetime, or the client
			// gone): a write now would set a fresh deadline over the one
			// that ending it set.
			if r.Context().Err() != nil {
				return code, false
			}
			return end(), false
		}
		if !s.write(rc, w, piece) {
			return code, false
		}
	}
}

// write writes piece (nil: just the head) and flushes it, within the
// write timeout. It reports false when the client is gone or the stream
// was cut.
func (s *stream) write(rc *http.ResponseController, w http.ResponseWriter, piece []byte) bool {
	if s.writeTimeout > 0 {
		_ = rc.SetWriteDeadline(time.Now().Add(s.writeTimeout))
	}
	var err error
	if len(piece) > 0 {
		_, err = w.Write(piece)
	}
	if err == nil {
		err = rc.Flush()
	}
	if err == nil {
		return true
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s.e.cutTimeout.Inc()
	}
	return false
}

// end lets the server finish the response (its last chunk) within the
// write timeout, and returns code.
func (s *stream) end(rc *http.ResponseController, code int) int {
	if s.writeTimeout > 0 {
		_ = rc.SetWriteDeadline(time.Now().Add(s.writeTimeout))
	} else {
		_ = rc.SetWriteDeadline(time.Time{})
	}
	return code
}

// connKey is the context key of the connection a request came on, whose
// socket options a stream adjusts; HookServer records it.
type connKey struct{}
