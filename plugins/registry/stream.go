package main

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// event is one committed entry as the stream sends it.
type event struct {
	Version uint64 `json:"version"`
	Hash    string `json:"hash"`
}

// otherConsumer is bus_lagged_total's consumer label for every name not
// in stream_consumers: the label's values are the operator's, never the
// clients', so a client cannot add series.
const otherConsumer = "other"

// maxConsumers is the most names stream_consumers takes.
const maxConsumers = 64

// consumerLabel is consumer's label in bus_lagged_total.
func (s settings) consumerLabel(consumer string) string {
	if s.streamConsumers[consumer] {
		return consumer
	}
	return otherConsumer
}

// subscriber is one stream consumer: a bounded buffer of events, and
// lagged, closed when an event found the buffer full. A lagged consumer
// has missed events and must re-read the head. label is its consumer
// label in bus_lagged_total.
type subscriber struct {
	ch     chan event
	lagged chan struct{}
	label  string
}

// bus fans committed entries out to the stream consumers without ever
// blocking the committer: a full buffer cuts its consumer off (the
// seed's broadcast lag). The mutex guards only the set, and is never held
// across a blocking send.
type bus struct {
	mu    sync.Mutex
	subs  map[*subscriber]struct{}
	onLag *prometheus.CounterVec // bus_lagged_total{consumer}; nil in tests that leave it out
}

func (b *bus) subscribe(size int, label string) *subscriber {
	s := &subscriber{ch: make(chan event, size), lagged: make(chan struct{}), label: label}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.subs == nil {
		b.subs = make(map[*subscriber]struct{})
	}
	b.subs[s] = struct{}{}
	return s
}

func (b *bus) unsubscribe(s *subscriber) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.subs, s)
}

// publish offers ev to every consumer; one whose buffer is full is cut
// off and counted.
func (b *bus) publish(ev event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		select {
		case s.ch <- ev:
		default:
			delete(b.subs, s)
			close(s.lagged)
			if b.onLag != nil {
				b.onLag.WithLabelValues(s.label).Inc()
			}
		}
	}
}
