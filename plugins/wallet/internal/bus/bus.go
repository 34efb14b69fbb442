// Package bus broadcasts values to subscribers without ever blocking the
// publisher. Each subscriber has its own bounded ring buffer; the overflow
// policy is drop-oldest: when a slow subscriber's buffer is full, the oldest
// value is dropped, counted in the bus's lagged counter, and reported to the
// subscriber with its next Take, so that it can tell its client.
//
// The lifecycle is New → Subscribe (any number of times) → Publish from any
// goroutine → Subscription.Close. The package must not start goroutines or
// block in Publish: a subscriber waits on its own Ready channel, from a
// goroutine it owns.
package bus

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Bus fans values out to subscribers. It is safe for concurrent use.
type Bus[T any] struct {
	capacity int
	dropped  []prometheus.Counter

	// mu guards subs. Lock order: Bus.mu before Subscription.mu. Neither
	// is held across anything that blocks.
	mu   sync.Mutex
	subs map[*Subscription[T]]struct{}
}

// New returns a bus whose subscribers each buffer up to capacity values
// (at least 1). Each of dropped that is not nil counts the values dropped
// for slow subscribers: the wallet counts them both as the bus lagging and
// as its events queue dropping.
func New[T any](capacity int, dropped ...prometheus.Counter) *Bus[T] {
	return &Bus[T]{capacity: max(capacity, 1), dropped: dropped, subs: map[*Subscription[T]]struct{}{}}
}

// Subscribe returns a subscription that receives every value published
// from now on, until Close.
func (b *Bus[T]) Subscribe() *Subscription[T] {
	s := &Subscription[T]{bus: b, ready: make(chan struct{}, 1), ring: make([]T, b.capacity)}
	b.mu.Lock()
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	return s
}

// Publish appends vs, in order, to every subscription's buffer, dropping
// the oldest values of full buffers. It never blocks.
func (b *Bus[T]) Publish(vs ...T) {
	if len(vs) == 0 {
		return
	}
	var dropped uint64
	b.mu.Lock()
	for s := range b.subs {
		dropped += s.push(vs)
	}
	b.mu.Unlock()
	if dropped > 0 {
		for _, c := range b.dropped {
			if c != nil {
				c.Add(float64(dropped))
			}
		}
	}
}

// Buffered returns how many values wait in all buffers, for the depth
// gauge.
func (b *Bus[T]) Buffered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for s := range b.subs {
		s.mu.Lock()
		n += s.n
		s.mu.Unlock()
	}
	return n
}

// Subscribers returns the number of open subscriptions.
func (b *Bus[T]) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// Subscription is one subscriber's buffer. Its methods are safe for
// concurrent use, but it is meant to be read by one goroutine.
type Subscription[T any] struct {
	bus   *Bus[T]
	ready chan struct{} // holds a token while values or a lag wait

	mu     sync.Mutex // guards the fields below
	ring   []T
	head   int // index of the oldest value
	n      int // values held
	lagged uint64
}

// push appends vs and returns how many old values it dropped. The caller
// holds the bus's lock.
func (s *Subscription[T]) push(vs []T) uint64 {
	var zero T
	var dropped uint64
	s.mu.Lock()
	for _, v := range vs {
		if s.n == len(s.ring) {
			s.ring[s.head] = zero
			s.head = (s.head + 1) % len(s.ring)
			s.n--
			dropped++
		}
		s.ring[(s.head+s.n)%len(s.ring)] = v
		s.n++
	}
	s.lagged += dropped
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default: // a token is already waiting
	}
	return dropped
}

// Ready returns a channel that receives when values or a lag report wait
// for Take.
func (s *Subscription[T]) Ready() <-chan struct{} { return s.ready }

// Take appends the buffered values, oldest first, to dst and empties the
// buffer. lagged is how many values were dropped since the last Take
// because the buffer was full: they were published before the first
// returned value.
func (s *Subscription[T]) Take(dst []T) (vs []T, lagged uint64) {
	var zero T
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.n {
		j := (s.head + i) % len(s.ring)
		dst = append(dst, s.ring[j])
		s.ring[j] = zero
	}
	s.head, s.n = 0, 0
	lagged, s.lagged = s.lagged, 0
	return dst, lagged
}

// Close stops the subscription; values published later are not buffered.
// Calling Close more than once is safe.
func (s *Subscription[T]) Close() {
	s.bus.mu.Lock()
	delete(s.bus.subs, s)
	s.bus.mu.Unlock()
}
