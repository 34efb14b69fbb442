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

// subscriber is one stream consumer: a bounded buffer of events, and
// lagged, closed when an event found the buffer full. A lagged consumer
// has missed events and must re-read the head.
type subscriber struct {
	ch       chan event
	lagged   chan struct{}
	consumer string
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

func (b *bus) subscribe(size int, consumer string) *subscriber {
	s := &subscriber{ch: make(chan event, size), lagged: make(chan struct{}), consumer: consumer}
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
				b.onLag.WithLabelValues(s.consumer).Inc()
			}
		}
	}
}
