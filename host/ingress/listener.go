package ingress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/host/internal/clientkey"
	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/sdk"
)

// ListenerOptions configure NewListener.
type ListenerOptions struct {
	// Name is the listener's label in metrics: "ingress" or "admin".
	Name string
	// MaxConns caps the connections open at once; at least 1.
	MaxConns int
	// MaxConnsPerIP caps one client's open connections, a client being
	// an IPv4 address or an IPv6 /64 (keyOf); 0 means no cap.
	MaxConnsPerIP int
	// Metrics receives the open and refused counts; nil for none.
	Metrics *metrics.Conns
	// OwnAnswers has the connections answer net/http's own answers (to a
	// head it cannot read, and its 417) with the platform's JSON error;
	// the server must be hooked with HookServer.
	OwnAnswers bool
}

// refusing bounds the connections being refused at once, each of which
// holds a descriptor and a goroutine for at most refuseLinger: beyond it,
// a refused connection is closed without an answer.
const refusing = 128

// refuseLinger bounds how long a refused connection is kept to answer it
// and read what its client sent, so that closing it does not reset the
// connection before the client has read the answer.
const refuseLinger = 500 * time.Millisecond

// refuseDrain bounds what is read and discarded from a refused
// connection within refuseLinger.
const refuseDrain = 1 << 20

// NewListener returns ln with its connections capped. A connection beyond
// a cap is accepted, answered 503 too_many_connections with Retry-After
// and Connection: close, and closed; the caller's Accept never sees it.
// Refusing this way, rather than leaving connections in the kernel's
// backlog as netutil.LimitListener does, tells the client at once that it
// may retry, and keeps the backlog from holding connections that would
// wait for minutes. Close waits for the refusals under way.
func NewListener(ln net.Listener, opts ListenerOptions) net.Listener {
	l := &listener{Listener: ln, opts: opts, perIP: map[netip.Addr]int{}, refusing: make(chan struct{}, refusing)}
	if m := opts.Metrics; m != nil {
		l.open = m.Open.WithLabelValues(opts.Name)
		l.refusedTotal = m.Refused.WithLabelValues(opts.Name, "max_conns")
		l.refusedPerIP = m.Refused.WithLabelValues(opts.Name, "max_conns_per_ip")
	} else {
		l.open = prometheus.NewGauge(prometheus.GaugeOpts{Name: "unused"})
		l.refusedTotal = prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"})
		l.refusedPerIP = l.refusedTotal
	}
	return l
}

type listener struct {
	net.Listener
	opts ListenerOptions

	open         prometheus.Gauge
	refusedTotal prometheus.Counter
	refusedPerIP prometheus.Counter

	mu    sync.Mutex
	n     int                // open connections
	perIP map[netip.Addr]int // open connections by client address, when capped

	refusing chan struct{} // a token per refusal under way
	refusals sync.WaitGroup
}

// Accept returns the next connection within the caps, refusing those
// beyond them.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := clientIP(c.RemoteAddr())
		if reason, ok := l.admit(ip); !ok {
			l.refuse(c, reason)
			continue
		}
		l.open.Inc()
		return &conn{Conn: c, l: l, ip: ip, ownAnswers: l.opts.OwnAnswers}, nil
	}
}

// admit counts a connection from ip if the caps allow it, and otherwise
// names the cap it hit.
func (l *listener) admit(ip netip.Addr) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n >= l.opts.MaxConns {
		return "max_conns", false
	}
	if l.opts.MaxConnsPerIP > 0 {
		if l.perIP[ip] >= l.opts.MaxConnsPerIP {
			return "max_conns_per_ip", false
		}
		l.perIP[ip]++
	}
	l.n++
	return "", true
}

func (l *listener) release(ip netip.Addr) {
	l.mu.Lock()
	l.n--
	if l.opts.MaxConnsPerIP > 0 {
		if l.perIP[ip]--; l.perIP[ip] <= 0 {
			delete(l.perIP, ip)
		}
	}
	l.mu.Unlock()
	l.open.Dec()
}

// refuse answers c with 503 and closes it, from a goroutine of its own
// when fewer than refusing are under way, and at once otherwise.
func (l *listener) refuse(c net.Conn, reason string) {
	limit := l.opts.MaxConns
	if reason == "max_conns_per_ip" {
		l.refusedPerIP.Inc()
		limit = l.opts.MaxConnsPerIP
	} else {
		l.refusedTotal.Inc()
	}
	select {
	case l.refusing <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	msg := fmt.Sprintf("the %s listener is at its limit of %d connections (%s)", l.opts.Name, limit, reason)
	l.refusals.Go(func() {
		defer func() { <-l.refusing }()
		answerRefused(c, msg)
	})
}

// answerRefused writes a 503 to c, then reads and discards what the
// client sends until it closes its side or refuseLinger passes, and
// closes c. Closing a socket with unread data in it resets the
// connection, and a client still sending its request would then lose the
// answer.
func answerRefused(c net.Conn, msg string) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseLinger))
	body := sdk.ErrorBody("too_many_connections", msg, nil)
	head := "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n" +
		"Connection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	if _, err := c.Write(append([]byte(head), body...)); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.CopyN(io.Discard, c, refuseDrain)
}

// Close closes the listener and waits for the refusals under way.
func (l *listener) Close() error {
	err := l.Listener.Close()
	l.refusals.Wait()
	return err
}

// clientIP returns the key of a connection's client (keyOf), the zero
// Addr when it has none (a Unix socket, in tests).
func clientIP(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		return clientkey.Of(ip)
	}
	return netip.Addr{}
}

// clientKey returns the key of a request's client, from its RemoteAddr,
// under which the per-client caps count it, and false when it has none
// (a plugin calling through the Host service, or a Unix socket).
func clientKey(remoteAddr string) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	return clientkey.Of(ap.Addr()), true
}

// conn is an admitted connection; closing it frees its slot once.
type conn struct {
	net.Conn
	l      *listener
	ip     netip.Addr
	closed atomic.Bool
	// ownAnswers is the listener's OwnAnswers; answering is whether a
	// handler answers on the connection (HookServer).
	ownAnswers bool
	answering  atomic.Bool
}

// Write writes p, but for net/http's own answers (writeOwn) while no
// handler answers on the connection, if the listener has OwnAnswers.
func (c *conn) Write(p []byte) (int, error) {
	if c.ownAnswers && !c.answering.Load() {
		return writeOwn(c.Conn, p)
	}
	return c.Conn.Write(p)
}

func (c *conn) setAnswering(on bool) { c.answering.Store(on) }

func (c *conn) Close() error {
	if !c.closed.Swap(true) {
		c.l.release(c.ip)
	}
	return c.Conn.Close()
}

// CloseWrite shuts down the sending side, as net/http does before closing
// a connection whose request it did not read whole.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errNotTCP
}

// NetConn returns the connection the listener accepted.
func (c *conn) NetConn() net.Conn { return c.Conn }

// errNotTCP is the error of setting a socket option on a connection that
// is not TCP.
var errNotTCP = errors.New("not a TCP connection")

// setWriteBuffer sets the kernel's send buffer of c's TCP connection.
func setWriteBuffer(c net.Conn, n int) error {
	for {
		switch t := c.(type) {
		case *net.TCPConn:
			return t.SetWriteBuffer(n)
		case interface{ NetConn() net.Conn }:
			c = t.NetConn()
		default:
			return errNotTCP
		}
	}
}
