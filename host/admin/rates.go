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

// between returns the plugin's rates over its readings, oldest first,
// which span span; a nil reading is a sample without the plugin. A
// counter that went down from one reading to the next was reset (a
// reload removed the plugin's series and made them anew) and counts
// from zero there, as Prometheus's rate() does: the increase is the sum
// of each step's rise, so a counter that restarted and climbed past its
// old value between two samples in the window is still seen to reset.
// Each series is taken alone: requests, 5xx answers, the histogram's
// count and each of its buckets.
func between(readings []*reading, span time.Duration) rates {
	orZero := func(r *reading) *reading {
		if r == nil {
			return &reading{}
		}
		return r
	}
	cur := orZero(readings[len(readings)-1])
	delta := make([]bucket, len(cur.buckets))
	for i, b := range cur.buckets {
		delta[i].upper = b.upper
	}
	var requests, errors float64
	var n uint64
	prev := orZero(readings[0])
	for _, r := range readings[1:] {
		r = orZero(r)
		requests += rise(prev.requests, r.requests)
		errors += rise(prev.errors, r.errors)
		n += rise(prev.count, r.count)
		for i := range delta {
			if i >= len(r.buckets) || r.buckets[i].upper != delta[i].upper {
				continue
			}
			var was uint64 // a bucket the previous reading lacks is new
			if i < len(prev.buckets) && prev.buckets[i].upper == delta[i].upper {
				was = prev.buckets[i].count
			}
			delta[i].count += rise(was, r.buckets[i].count)
		}
		prev = r
	}
	secs := span.Seconds()
	out := rates{requests: requests / secs, errors: errors / secs}
	if n == 0 {
		return out
	}
	q := quantile(0.99, delta, n)
	out.p99 = &q
	return out
}

// rise is how much a counter rose from was to now: all of now when it
// went down, as it was reset to zero in between.
func rise[T float64 | uint64](was, now T) T {
	if now < was {
		return now
	}
	return now - was
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

// since returns a sample taken now and the kept samples at most a
// window older, oldest first, for rates over the last window; ok is
// false when there is none older than now.
func (s *sampler) since() (cur sample, window []sample, ok bool) {
	cur = read(s.g, s.now())
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, smp := range s.ring {
		if age := cur.at.Sub(smp.at); age > 0 && age <= s.window {
			window = append(window, smp)
		}
	}
	return cur, window, len(window) > 0
}

// Close stops the sampling goroutine and waits for it.
func (s *sampler) Close() {
	s.cancel()
	s.wg.Wait()
}
