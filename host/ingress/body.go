package ingress

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/route"
	"github.com/plughost/plughost/sdk/wire"
)

// Bounds of the discard after an early answer, as nginx's lingering
// close (lingering_timeout, lingering_time): a client that sends its
// whole body before it reads (and most do, net/http's client among them
// when the body is large) sees a connection reset instead of the answer
// when the host closes with its body still arriving, because the reset
// throws away what the client's kernel had received. The discard goes on
// while the body keeps arriving, with no gap over lingerTimeout, so that
// a slow or busy client still reads the answer; lingerTime and
// lingerBytes keep an attacker from holding the connection open with an
// endless body. Variables, not constants, so that tests can shorten them.
var (
	lingerTimeout       = 5 * time.Second
	lingerTime          = 30 * time.Second
	lingerBytes   int64 = 64 << 20
)

// firstPiece is the size of a body's first piece when it may be larger.
// A body arrives in pieces that double from firstPiece up to
// wire.PieceBytes, each allocated and charged to the plugin's budget as
// the one before it fills: what a body holds follows what its client has
// sent (at most twice that, plus firstPiece, and never more than one
// piece beyond it), not the length it claims. The pieces go to the data
// plane as they are, so no buffer is copied or left behind as garbage.
const firstPiece = 4 << 10

// bodyLimit returns the request body limit of a route that declares
// routeMax (sdk.MaxBody; 0 for none) in a plugin whose block sets
// pluginMax (0 for none), under the host-wide hostMax. The most specific
// setting applies, as nginx's client_max_body_size in a location does
// over the server's, except that the plugin block, the operator's word,
// caps what the plugin's author declared for a route.
func bodyLimit(routeMax, pluginMax, hostMax int64) int64 {
	switch {
	case routeMax > 0 && pluginMax > 0:
		return min(routeMax, pluginMax)
	case routeMax > 0:
		return routeMax
	case pluginMax > 0:
		return pluginMax
	}
	return hostMax
}

// bodyBound returns the most that a plugin's request bodies may hold in
// the host (its bodyBudget) while one body of limit bytes arrives:
// maxInflight bodies of pluginMax, its plugin's limit, the figure the
// operator sizes memory by, and at least one body at limit, so that a
// route whose own limit is larger (sdk.MaxBody) takes a body at it. A
// route's larger limit so adds at most one body to the plugin's bound,
// rather than multiplying it by maxInflight. 0 (no bound) when
// maxInflight is.
func bodyBound(maxInflight, pluginMax, limit int64) int64 {
	if maxInflight <= 0 {
		return 0
	}
	return max(maxInflight*pluginMax, limit)
}

// logBodyLimits logs at info, once for each plugin and set of limits,
// the body limit of each of the plugin's routes that declares its own,
// and whether its block's max_body_bytes (pluginMax) caps it: the
// operator sees which routes take more, or less, than the rest without
// reading the plugin's code.
func (g *Ingress) logBodyLimits(name string, m *pluginv1.DescribeResponse, t *route.Table, pluginMax int64) {
	var b strings.Builder
	for _, r := range t.Routes() {
		if r.MaxBody > 0 {
			fmt.Fprintf(&b, "%s=%d;", r, bodyLimit(r.MaxBody, pluginMax, 0))
		}
	}
	summary := b.String()
	g.mu.Lock()
	if g.bodyLogs == nil {
		g.bodyLogs = map[string]string{}
	}
	same := g.bodyLogs[name] == summary
	g.bodyLogs[name] = summary
	g.mu.Unlock()
	if same {
		return
	}
	for _, r := range t.Routes() {
		if r.MaxBody <= 0 {
			continue
		}
		limit := bodyLimit(r.MaxBody, pluginMax, 0)
		if limit < r.MaxBody {
			g.logger.Info("route body limit capped by the plugin block's max_body_bytes", "plugin", name,
				"version", m.GetVersion(), "route", r.String(), "declared", r.MaxBody, "max_body_bytes", limit)
			continue
		}
		g.logger.Info("route has its own body limit", "plugin", name, "version", m.GetVersion(),
			"route", r.String(), "max_body_bytes", limit)
	}
}

// clientShareDivisor sets the most one client address may hold of a
// plugin's body budget: 1/clientShareDivisor of it, and at least one
// body at the limit of its route (clientShare), as Envoy pairs a per-connection
// buffer limit with an overall one. A client alone may take a quarter
// of the memory; filling it takes at least four addresses.
const clientShareDivisor = 4

// clientShare is the most one client address may hold of a budget of
// bound bytes for bodies of at most maxBody; 0 (no cap) when bound is.
func clientShare(bound, maxBody int64) int64 {
	if bound <= 0 {
		return 0
	}
	return max(maxBody, bound/clientShareDivisor)
}

// errBodyBudget is the error of a body that would take a plugin's
// request bodies past their share of memory (bodyBudget).
var errBodyBudget = errors.New("request bodies to this plugin hold their memory limit")

// errClientShare is the error of a body that would take its client
// address's bodies past their share of the plugin's budget (clientShare).
var errClientShare = errors.New("this client's request bodies hold their share of the plugin's memory limit")

// bodyBudget counts the bytes that one plugin's request bodies hold in
// the host, from their first byte until their request ends, in all and
// by client address, so that bodies still arriving, which hold no
// in-flight slot, are bounded too, and one client cannot take them all.
// Its zero value is empty.
type bodyBudget struct {
	mu       sync.Mutex
	used     int64
	byClient map[netip.Addr]int64
}

// bodyCharge is what one body holds of its plugin's budget. Call release
// when its request ends.
type bodyCharge struct {
	b      *bodyBudget
	client netip.Addr
	keyed  bool // the client's address is known: its share applies
	gauge  prometheus.Gauge
	n      int64
}

// newCharge returns an empty charge against b for a request from
// remoteAddr, whose bytes gauge counts too.
func (b *bodyBudget) newCharge(remoteAddr string, gauge prometheus.Gauge) *bodyCharge {
	client, keyed := clientKey(remoteAddr)
	return &bodyCharge{b: b, client: client, keyed: keyed, gauge: gauge}
}

// take charges n more bytes, within bound for the plugin (none when
// bound <= 0) and share for the client (none when share <= 0), and
// fails with errBodyBudget or errClientShare when they do not fit.
func (c *bodyCharge) take(n, bound, share int64) error {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if bound > 0 && b.used+n > bound {
		return errBodyBudget
	}
	if c.keyed {
		if share > 0 && b.byClient[c.client]+n > share {
			return errClientShare
		}
		if b.byClient == nil {
			b.byClient = map[netip.Addr]int64{}
		}
		b.byClient[c.client] += n
	}
	b.used += n
	c.n += n
	c.gauge.Add(float64(n))
	return nil
}

// release gives back everything c took.
func (c *bodyCharge) release() {
	if c.n == 0 {
		return
	}
	b := c.b
	b.mu.Lock()
	b.used -= c.n
	if c.keyed {
		if b.byClient[c.client] -= c.n; b.byClient[c.client] <= 0 {
			delete(b.byClient, c.client)
		}
	}
	b.mu.Unlock()
	c.gauge.Sub(float64(c.n))
	c.n = 0
}

// receiveBody reads r's body, at most limit bytes, in pieces (see
// firstPiece) charged to charge within bound and share (see take), and
// returns them. The caller releases charge when the request ends. The
// read fails with an *http.MaxBytesError past limit, with errBodyBudget
// or errClientShare when there is no room, and with an error that
// matches os.ErrDeadlineExceeded when the body has not arrived by the
// connection's read deadline.
func receiveBody(w http.ResponseWriter, r *http.Request, limit int64, charge *bodyCharge, bound, share int64) ([][]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		// Most requests have no body.
		return nil, nil
	}
	want := r.ContentLength // net/http stops the body there
	if want < 0 || want > limit {
		want = limit
	}
	src := http.MaxBytesReader(w, cutBody{r.Body}, limit)
	var (
		pieces [][]byte // nil for a body that turns out empty
		got    int64
	)
	for {
		size := min(int64(wire.PieceBytes), max(firstPiece, got), want-got)
		if size <= 0 {
			// All that may come has come: only the end, or a chunked
			// body past the limit, can follow.
			var one [1]byte
			n, err := src.Read(one[:])
			switch {
			case err == io.EOF:
				return pieces, nil
			case err != nil:
				return nil, err
			case n > 0:
				return nil, &http.MaxBytesError{Limit: limit}
			}
			continue
		}
		if err := charge.take(size, bound, share); err != nil {
			return nil, err
		}
		piece := make([]byte, size)
		n, err := io.ReadFull(src, piece)
		got += int64(n)
		if n > 0 {
			if pieces == nil {
				// Room for the pieces of a body up to 32 KiB (4, 4,
				// 8 and 16 KiB), rather than a list per doubling.
				pieces = make([][]byte, 0, 4)
			}
			pieces = append(pieces, piece[:n])
		}
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return pieces, nil
		case err != nil:
			return nil, err
		}
	}
}

// errBodyCut is a request body that ended before its Content-Length, or
// before its last chunk: the client closed its side mid-body.
var errBodyCut = errors.New("the body ended before its declared length or its last chunk")

// cutBody is a request body whose own io.ErrUnexpectedEOF (net/http's, for
// a body cut short) reads as errBodyCut, apart from io.ReadFull's, which
// only says the body is shorter than the piece receiveBody asked for.
type cutBody struct{ io.ReadCloser }

func (b cutBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.ErrUnexpectedEOF {
		err = errBodyCut
	}
	return n, err
}

// trackedBody is a request body that records how its reads ended, so that
// the ingress knows whether body bytes may still be arriving after it
// answered.
type trackedBody struct {
	io.ReadCloser
	done bool // the body ended, or broke: nothing left worth reading
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done = true
	}
	return n, err
}

// withBody is the trackedBody and the earlyAnswer of a request with a
// body, allocated together.
type withBody struct {
	body trackedBody
	w    earlyAnswer
}

// earlyAnswer is the ResponseWriter of a request with a body. An error
// answer written before the body was read to its end closes the
// connection (Connection: close): net/http then sends it at once, where
// it would otherwise first read up to 256 KiB of the body, which a slow
// client may take its whole read deadline to send; linger then reads what
// is left, bounded.
type earlyAnswer struct {
	http.ResponseWriter
	body  *trackedBody
	wrote bool
}

func (w *earlyAnswer) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		if code >= 400 && !w.body.done {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *earlyAnswer) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap is for http.ResponseController.
func (w *earlyAnswer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// lingerBufs holds the buffers linger discards into: anyone can make the
// host linger (a 404 with a body), and each would otherwise allocate one.
var lingerBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// linger sends the answer written so far and then reads and discards
// what is left of body while it keeps arriving (no gap over
// lingerTimeout), for at most lingerTime and lingerBytes, so that a
// client still sending receives the answer rather than a reset. net/http
// closes the connection afterwards unless the body ended.
func linger(w http.ResponseWriter, body io.Reader) {
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	end := time.Now().Add(lingerTime)
	bp := lingerBufs.Get().(*[32 << 10]byte)
	defer lingerBufs.Put(bp)
	buf := bp[:]
	for left := lingerBytes; left > 0; {
		deadline := time.Now().Add(lingerTimeout)
		if deadline.After(end) {
			deadline = end
		}
		_ = rc.SetReadDeadline(deadline)
		n, err := body.Read(buf[:min(int64(len(buf)), left)])
		left -= int64(n)
		if err != nil {
			return
		}
	}
}
