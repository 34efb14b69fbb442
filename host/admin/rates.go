package admin

import (
	"context"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The host metrics the status page reads, by name (host/metrics).
const (
	requestsName = "plughost_http_requests_total"
	durationName = "plughost_http_request_duration_seconds"
	inflightName = "plughost_inflight_requests"
	heldName     = "plughost_held_requests"
)

// sample is what the host's registry said of every plugin at one time.
type sample struct {
	at      time.Time
	plugins map[string]*reading
}

// reading is one plugin's share of a sample.
type reading struct {
	requests float64 // answered, every code
	errors   float64 // answered with a 5xx code
	count    uint64  // in the duration histogram
	buckets  []bucket
	inflight float64
	held     float64
}

// bucket is one cumulative bucket of the duration histogram.
type bucket struct {
	upper float64
	count uint64
}

// read gathers g into a sample taken at at. Families the host does not
// have are left out: a registry without them gives empty readings.
func read(g prometheus.Gatherer, at time.Time) sample {
	s := sample{at: at, plugins: map[string]*reading{}}
	fams, _ := g.Gather() // what could be gathered is still right
	get := func(m *dto.Metric) *reading {
		var name string
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "plugin" {
				name = lp.GetValue()
			}
		}
		r := s.plugins[name]
		if r == nil {
			r = &reading{}
			s.plugins[name] = r
		}
		return r
	}
	for _, mf := range fams {
		switch mf.GetName() {
		case requestsName:
			for _, m := range mf.GetMetric() {
				r := get(m)
				v := m.GetCounter().GetValue()
				r.requests += v
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "code" && strings.HasPrefix(lp.GetValue(), "5") {
						r.errors += v
					}
				}
			}
		case durationName:
			for _, m := range mf.GetMetric() {
				r := get(m)
				h := m.GetHistogram()
				r.count = h.GetSampleCount()
				r.buckets = r.buckets[:0]
				for _, b := range h.GetBucket() {
					r.buckets = append(r.buckets, bucket{upper: b.GetUpperBound(), count: b.GetCumulativeCount()})
				}
			}
		case inflightName:
			for _, m := range mf.GetMetric() {
				get(m).inflight = m.GetGauge().GetValue()
			}
		case heldName:
			for _, m := range mf.GetMetric() {
				get(m).held = m.GetGauge().GetValue()
			}
		}
	}
	return s
}

// rates is a plugin's traffic between two samples.
type rates struct {
	requests float64  // per second
	errors   float64  // 5xx answers per second
	p99      *float64 // seconds; nil when no request ended in between
}

// between returns the plugin's rates from old to cur. A counter that went
// down was reset (the plugin's series were removed and made anew by a
// reload), and counts from zero, as Prometheus's rate() does.
func between(old, cur *reading, span time.Duration) rates {
	if old == nil || cur.count < old.count || cur.requests < old.requests {
		old = &reading{}
	}
	secs := span.Seconds()
	out := rates{
		requests: (cur.requests - old.requests) / secs,
		errors:   max(cur.errors-old.errors, 0) / secs,
	}
	n := cur.count - old.count
	if n == 0 {
		return out
	}
	delta := make([]bucket, len(cur.buckets))
	for i, b := range cur.buckets {
		delta[i] = b
		if i < len(old.buckets) && old.buckets[i].upper == b.upper {
			delta[i].count -= min(old.buckets[i].count, b.count)
		}
	}
	q := quantile(0.99, delta, n)
	out.p99 = &q
	return out
}

// quantile estimates the q-quantile of n observations from cumulative
// buckets, interpolating linearly within a bucket as Prometheus's
// histogram_quantile does. Observations above the last bound are placed
// at that bound.
func quantile(q float64, buckets []bucket, n uint64) float64 {
	rank := q * float64(n)
	lower, below := 0.0, uint64(0)
	for _, b := range buckets {
		if math.IsInf(b.upper, 1) {
			break
		}
		if float64(b.count) >= rank {
			if b.count == below {
				return b.upper
			}
			return lower + (b.upper-lower)*(rank-float64(below))/float64(b.count-below)
		}
		lower, below = b.upper, b.count
	}
	return lower
}

// sampler keeps a ring of samples of the host's registry, taken every
// interval by a goroutine that Close stops, so that the status page can
// show rates over the last window.
type sampler struct {
	g      prometheus.Gatherer
	now    func() time.Time
	window time.Duration

	mu   sync.Mutex
	ring []sample // oldest first; at most cap(ring)

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// newSampler takes a first sample and starts sampling every interval.
func newSampler(g prometheus.Gatherer, now func() time.Time, every, window time.Duration) *sampler {
	ctx, cancel := context.WithCancel(context.Background())
	// One sample older than the window is kept, so that a full window
	// is always covered once the host has run that long.
	n := int(window/every) + 2
	s := &sampler{g: g, now: now, window: window, ring: make([]sample, 0, n), cancel: cancel}
	s.take()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.take()
			}
		}
	}()
	return s
}

// take adds a sample to the ring, dropping the oldest when it is full.
func (s *sampler) take() {
	smp := read(s.g, s.now())
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ring) == cap(s.ring) {
		copy(s.ring, s.ring[1:])
		s.ring = s.ring[:len(s.ring)-1]
	}
	s.ring = append(s.ring, smp)
}

// since returns a sample taken now and the oldest kept sample at most a
// window older, for rates over the last window; ok is false when there
// is none older than now.
func (s *sampler) since() (cur, old sample, ok bool) {
	cur = read(s.g, s.now())
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, smp := range s.ring {
		if age := cur.at.Sub(smp.at); age > 0 && age <= s.window {
			return cur, smp, true
		}
	}
	return cur, sample{}, false
}

// Close stops the sampling goroutine and waits for it.
func (s *sampler) Close() {
	s.cancel()
	s.wg.Wait()
}
