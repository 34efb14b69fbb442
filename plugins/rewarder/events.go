package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// stateEvent is one epoch state change as GET /v1/events sends it: seq
// counts the events of this process from 1 (the event's id), so that a
// consumer sees the gaps a lag leaves.
type stateEvent struct {
	Seq        uint64 `json:"seq"`
	Epoch      string `json:"epoch"`
	State      string `json:"state"`
	Reason     string `json:"reason,omitempty"`
	Generation int    `json:"generation"`
}

// otherConsumer is bus_lagged_total's consumer label for every name not
// in event_consumers: the label's values are the operator's, never the
// clients', so a client cannot add series.
const otherConsumer = "other"

// maxConsumers is the most names event_consumers takes.
const maxConsumers = 64

var consumerRE = regexp.MustCompile(`^[a-z0-9_-]{1,32}$`)

// consumerLabel is consumer's label in bus_lagged_total.
func (s settings) consumerLabel(consumer string) string {
	if s.eventConsumers[consumer] {
		return consumer
	}
	return otherConsumer
}

// subscriber is one events consumer: a buffer of events bounded by
// events_buffer, and missed, the events dropped from it, oldest first,
// since the consumer last heard of it. label is its consumer label in
// bus_lagged_total.
type subscriber struct {
	ch     chan stateEvent
	missed atomic.Uint64
	label  string
}

// bus broadcasts epoch state changes (the seed's events broadcast)
// without ever blocking the goroutine that stored them: a consumer whose
// buffer is full loses its oldest event, counted in bus_lagged_total and
// told to the consumer, and stays subscribed. The mutex guards the set
// and orders the sequence numbers; it is held only around non-blocking
// channel operations.
type bus struct {
	mu    sync.Mutex
	seq   uint64
	subs  map[*subscriber]struct{}
	onLag *prometheus.CounterVec // bus_lagged_total{consumer}
}

func (b *bus) subscribe(size int, label string) *subscriber {
	s := &subscriber{ch: make(chan stateEvent, size), label: label}
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

// publish numbers ev and offers it to every consumer; a full buffer
// drops its oldest event to take it.
func (b *bus) publish(ev stateEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	ev.Seq = b.seq
	for s := range b.subs {
		for {
			select {
			case s.ch <- ev:
			default:
				select {
				case <-s.ch:
					s.missed.Add(1)
					if b.onLag != nil {
						b.onLag.WithLabelValues(s.label).Inc()
					}
				default: // the consumer took one meanwhile
				}
				continue
			}
			break
		}
	}
}

// emit publishes epoch e's state, once stored.
func (r *running) emit(e epoch) {
	r.bus.publish(stateEvent{Epoch: e.Epoch, State: e.State, Reason: e.Reason, Generation: e.Generation})
}

// events streams epoch state changes as server-sent events (event
// "state", id its seq, data the stateEvent) from the moment it is
// subscribed; nothing is replayed, and a consumer reads the manifests it
// needs. A consumer events_buffer behind loses the oldest events: it gets
// event "lagged" with {"missed": n} before the next one, and goes on. The
// stream ends when the drain begins.
func (rw *rewarder) events(w http.ResponseWriter, req *http.Request, r *running) {
	consumer := req.URL.Query().Get("consumer")
	if consumer == "" {
		consumer = "anonymous"
	}
	if !consumerRE.MatchString(consumer) {
		writeField(w, "consumer", "must match "+consumerRE.String())
		return
	}
	sub := r.bus.subscribe(r.s.eventsBuffer, r.s.consumerLabel(consumer))
	defer r.bus.unsubscribe(sub)
	f, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	flush := func() {
		if f != nil {
			f.Flush()
		}
	}
	flush()
	for {
		select {
		case <-req.Context().Done():
			return
		case <-r.stop:
			return
		case ev := <-sub.ch:
			if n := sub.missed.Swap(0); n > 0 {
				r.log.Warn("events consumer lagged: oldest events dropped", "consumer", consumer, "missed", n, "events_buffer", r.s.eventsBuffer)
				if _, err := fmt.Fprintf(w, "event: lagged\ndata: {\"missed\":%d}\n\n", n); err != nil {
					return
				}
			}
			b, _ := json.Marshal(ev)
			if _, err := fmt.Fprintf(w, "event: state\nid: %d\ndata: %s\n\n", ev.Seq, b); err != nil {
				return
			}
			flush()
		}
	}
}
