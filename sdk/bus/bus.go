package bus

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrLagged is returned by Next once a CutOff bus has cut the consumer
// off and the events its buffer held are read: it missed what came after.
var ErrLagged = errors.New("bus: consumer lagged a whole buffer behind")

// ErrDraining is returned by Next once Options.Drain is closed.
var ErrDraining = errors.New("bus: draining")

// Policy is what a bus does with a consumer whose buffer is full when an
// event comes.
type Policy int

const (
	// CutOff unsubscribes the consumer: its Next returns ErrLagged after
	// the events its buffer holds.
	CutOff Policy = iota
	// DropOldest drops the consumer's oldest buffered event to take the
	// new one, and counts it in the consumer's Missed.
	DropOldest
)

// String returns "cut_off" or "drop_oldest".
func (p Policy) String() string {
	switch p {
	case CutOff:
		return "cut_off"
	case DropOldest:
		return "drop_oldest"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// LaggedName is the name of the bus's metric, a counter with the label
// consumer, by the plugin guide's rule for the metrics the design names.
const LaggedName = "bus_lagged_total"

// OtherConsumer is the consumer label of every name not in
// Options.Consumers. It cannot be listed there.
const OtherConsumer = "other"

// MaxConsumers is the most names Options.Consumers takes: the most series
// of the metric but one.
const MaxConsumers = 64

// consumerRE is what a consumer's name may be.
var consumerRE = regexp.MustCompile(ConsumerPattern)

// ConsumerPattern is the regular expression a consumer's name matches
// (ValidConsumer), for messages that say so.
const ConsumerPattern = `^[a-z0-9_-]{1,32}$`

// ValidConsumer reports whether name may name a consumer: 1 to 32 of
// a-z, 0-9, _ and -.
func ValidConsumer(name string) bool {
	return consumerRE.MatchString(name)
}

// Consumer returns the name a stream's request gives its consumer in the
// query parameter consumer, "anonymous" if none, and whether it is
// ValidConsumer: a plugin answers 400 if not.
func Consumer(r *http.Request) (name string, ok bool) {
	name = r.URL.Query().Get("consumer")
	if name == "" {
		name = "anonymous"
	}
	return name, ValidConsumer(name)
}

// CheckConsumers checks the operator's list of consumer names, the
// values the metric's consumer label may take besides OtherConsumer:
// each must be ValidConsumer and not OtherConsumer, and there may be at
// most MaxConsumers different names. The error's message names the first
// offender; a plugin returns it as a config error on its own attribute.
func CheckConsumers(names []string) error {
	seen := make(map[string]bool, len(names))
	for i, name := range names {
		if !ValidConsumer(name) || name == OtherConsumer {
			return fmt.Errorf("names must match %s and not be %q, got %q at index %d", ConsumerPattern, OtherConsumer, name, i)
		}
		seen[name] = true
	}
	if len(seen) > MaxConsumers {
		return fmt.Errorf("at most %d names, got %d", MaxConsumers, len(seen))
	}
	return nil
}

// Options configures a Bus.
type Options struct {
	// Policy is what a full buffer does; the zero value is CutOff.
	Policy Policy
	// Consumers are the names the metric's consumer label takes as they
	// are; every other name counts as OtherConsumer. See CheckConsumers.
	Consumers []string
	// Drain, if not nil, ends every consumer's Next with ErrDraining once
	// closed: a plugin passes Runtime.Context().Done(), or a channel its
	// Drain hook closes, since a drain does not cancel a stream's request.
	Drain <-chan struct{}
	// Registerer, if not nil, receives bus_lagged_total{consumer}, with
	// OtherConsumer and each of Consumers at 0. New fails if the family
	// is already registered there.
	Registerer prometheus.Registerer
	// Help is the metric's help text; a plugin names its routes and its
	// config attribute in it. Empty, it says what the policy counts.
	Help string
}

// Bus is a bounded broadcast of events of type T to its subscribed
// consumers. It is safe for concurrent use. Create one with New.
type Bus[T any] struct {
	policy Policy
	drain  <-chan struct{}
	named  map[string]bool
	lagged *prometheus.CounterVec

	// mu guards subs and every consumer's buffer, and orders the events,
	// as published, in every buffer; it is never held across a wait.
	mu   sync.Mutex
	subs map[*Sub[T]]struct{}
}

// New returns a bus with no consumers. It returns an error if
// Options.Consumers fails CheckConsumers or the metric cannot be
// registered.
func New[T any](opts Options) (*Bus[T], error) {
	if opts.Policy != CutOff && opts.Policy != DropOldest {
		return nil, fmt.Errorf("new bus: unknown policy %v", opts.Policy)
	}
	if err := CheckConsumers(opts.Consumers); err != nil {
		return nil, fmt.Errorf("new bus: consumers: %w", err)
	}
	help := opts.Help
	if help == "" {
		help = "Stream consumers cut off because they fell a whole buffer behind, by consumer: a name the operator lists, or other."
		if opts.Policy == DropOldest {
			help = "Events dropped, oldest first, from the buffer of a stream consumer that fell behind, by consumer: a name the operator lists, or other."
		}
	}
	b := &Bus[T]{
		policy: opts.Policy,
		drain:  opts.Drain,
		named:  make(map[string]bool, len(opts.Consumers)),
		lagged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: LaggedName, Help: help}, []string{"consumer"}),
		subs:   map[*Sub[T]]struct{}{},
	}
	b.lagged.WithLabelValues(OtherConsumer)
	for _, name := range opts.Consumers {
		b.named[name] = true
		b.lagged.WithLabelValues(name)
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(b.lagged); err != nil {
			return nil, fmt.Errorf("register %s: %w", LaggedName, err)
		}
	}
	return b, nil
}

// Label returns consumer's value of the metric's consumer label:
// consumer if Options.Consumers lists it, else OtherConsumer.
func (b *Bus[T]) Label(consumer string) string {
	if b.named[consumer] {
		return consumer
	}
	return OtherConsumer
}

// Subscribe adds a consumer with room for buffer events (at least 1) and
// returns it; it gets every event published from now on. consumer is its
// name, labelled by Label. Call Sub.Close when done.
func (b *Bus[T]) Subscribe(consumer string, buffer int) *Sub[T] {
	s := &Sub[T]{
		bus:   b,
		buf:   make([]T, max(buffer, 1)),
		ready: make(chan struct{}, 1),
		count: b.lagged.WithLabelValues(b.Label(consumer)),
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.subs[s] = struct{}{}
	return s
}

// Publish offers ev to every consumer without blocking; a consumer whose
// buffer is full is dealt with by the policy and counted.
func (b *Bus[T]) Publish(ev T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		if s.n == len(s.buf) {
			s.count.Inc()
			if b.policy == CutOff {
				delete(b.subs, s)
				s.cut = true
				s.signal()
				continue
			}
			var zero T
			s.buf[s.head] = zero
			s.head = (s.head + 1) % len(s.buf)
			s.n--
			s.missed++
		}
		s.buf[(s.head+s.n)%len(s.buf)] = ev
		s.n++
		s.signal()
	}
}

// Len returns the number of consumers subscribed.
func (b *Bus[T]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// Sub is one consumer of a bus. Next and Missed are for the one goroutine
// that serves the consumer; the other methods may be called from any.
type Sub[T any] struct {
	bus   *Bus[T]
	ready chan struct{} // holds a token when the buffer or cut may have changed
	count prometheus.Counter

	// The bus's mutex guards these: the buffer is a ring of n events
	// from head, so that an event taken and the events dropped before it
	// are counted together.
	buf     []T
	head, n int
	missed  uint64 // dropped since the last event taken
	cut     bool   // cut off by a CutOff bus

	lastMissed uint64 // dropped just before the event Next last returned
}

// signal wakes Next; the bus's mutex is held.
func (s *Sub[T]) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Next returns the consumer's next event, waiting for one. It returns
// ErrLagged once a CutOff bus has cut the consumer off and its buffer is
// empty, ErrDraining once Options.Drain is closed, and ctx.Err() once ctx
// is done; those two end it even while events are waiting.
func (s *Sub[T]) Next(ctx context.Context) (T, error) {
	var zero T
	for {
		// A stream ends when asked to, however many events are waiting.
		select {
		case <-s.bus.drain:
			return zero, ErrDraining
		case <-ctx.Done():
			return zero, ctx.Err()
		default:
		}
		s.bus.mu.Lock()
		if s.n > 0 {
			ev := s.buf[s.head]
			s.buf[s.head] = zero
			s.head = (s.head + 1) % len(s.buf)
			s.n--
			s.lastMissed, s.missed = s.missed, 0
			s.bus.mu.Unlock()
			return ev, nil
		}
		cut := s.cut
		s.bus.mu.Unlock()
		if cut {
			// The cut came after what the buffer held.
			return zero, ErrLagged
		}
		select {
		case <-s.ready:
		case <-s.bus.drain:
			return zero, ErrDraining
		case <-ctx.Done():
			return zero, ctx.Err()
		}
	}
}

// Missed returns how many events a DropOldest bus dropped from the
// consumer's buffer just before the event Next last returned: all of
// them older than it, and newer than the event before.
func (s *Sub[T]) Missed() uint64 { return s.lastMissed }

// Len returns the number of events waiting in the consumer's buffer.
func (s *Sub[T]) Len() int {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	return s.n
}

// Lagged reports whether a CutOff bus has cut the consumer off. Its
// buffer may still hold events for Next.
func (s *Sub[T]) Lagged() bool {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	return s.cut
}

// Close unsubscribes the consumer. It is safe to call more than once and
// after the bus has cut the consumer off.
func (s *Sub[T]) Close() {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	delete(s.bus.subs, s)
}
