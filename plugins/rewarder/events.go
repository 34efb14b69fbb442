package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk/bus"
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

// feed numbers the epoch state changes and broadcasts them (the seed's
// events broadcast) without ever blocking the goroutine that stored them:
// a consumer whose buffer is full loses its oldest event, counted in
// bus_lagged_total and told to the consumer, and stays subscribed. mu
// orders the sequence numbers as the bus delivers them; it is held only
// around Publish, which never blocks.
type feed struct {
	mu  sync.Mutex
	seq uint64
	*bus.Bus[stateEvent]
}

// newFeed returns the events' feed, its bus_lagged_total in reg.
func newFeed(s settings, reg prometheus.Registerer, drain <-chan struct{}) (*feed, error) {
	b, err := bus.New[stateEvent](bus.Options{Policy: bus.DropOldest, Consumers: s.eventConsumers, Drain: drain, Registerer: reg, Help: laggedHelp})
	if err != nil {
		return nil, err
	}
	return &feed{Bus: b}, nil
}

// laggedHelp is bus_lagged_total's help text.
const laggedHelp = "Events dropped, oldest first, from the buffer of a consumer of GET /v1/events that fell behind, by consumer: a name in event_consumers, or other."

// publish numbers ev and offers it to every consumer.
func (f *feed) publish(ev stateEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	ev.Seq = f.seq
	f.Publish(ev)
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
	consumer, ok := bus.Consumer(req)
	if !ok {
		writeField(w, "consumer", "must match "+bus.ConsumerPattern)
		return
	}
	sub := r.bus.Subscribe(consumer, r.s.eventsBuffer)
	defer sub.Close()
	sw := bus.NewWriter(w)
	for {
		ev, err := sub.Next(req.Context())
		if err != nil {
			return
		}
		if n := sub.Missed(); n > 0 {
			r.log.Warn("events consumer lagged: oldest events dropped", "consumer", consumer, "missed", n, "events_buffer", r.s.eventsBuffer)
			if sw.Event("lagged", "", fmt.Appendf(nil, `{"missed":%d}`, n)) != nil {
				return
			}
		}
		b, _ := json.Marshal(ev)
		if sw.Event("state", strconv.FormatUint(ev.Seq, 10), b) != nil {
			return
		}
		sw.Flush()
	}
}
