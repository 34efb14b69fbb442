package workq

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrBusy is returned by TryEnqueue when the queue is full. The item was not
// queued; the caller may retry later or report back-pressure (for example as
// gRPC ResourceExhausted or HTTP 503).
var ErrBusy = errors.New("workq: full")

// ErrClosed is returned by TryEnqueue after Close, and by Dequeue once the
// queue is closed and drained.
var ErrClosed = errors.New("workq: closed")

// Names and help of the queue's metric families, by the plugin guide's
// rule for the metrics the design names: one family for every queue, the
// queue's name in the queue label. A plugin that registers a series of
// the same family for a buffer of its own (a ring that drops its oldest
// entries, say) uses these, since a registry refuses one family with two
// help texts.
const (
	DepthName    = "queue_depth"
	DepthHelp    = "Items waiting in a bounded queue, by queue."
	CapacityName = "queue_capacity"
	CapacityHelp = "Most items a bounded queue holds, by queue."
	DroppedName  = "queue_dropped_total"
	DroppedHelp  = "Items a bounded queue did not deliver, by queue: refused when full, or dropped oldest for a slow reader."
)

// validName matches what a queue may be called: a short snake_case
// word, like the other label values of a plugin's metrics.
var validName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// Options configures a Queue.
type Options struct {
	// Name identifies the queue: the value of its metrics' queue label,
	// and in errors. It is required and must match [a-zA-Z_][a-zA-Z0-9_]*,
	// such as "commit".
	Name string
	// Capacity is the most items the queue holds; it must be > 0.
	Capacity int
	// Registerer, if not nil, receives the queue's metrics. New fails if a
	// queue with the same Name and ConstLabels is already registered there.
	Registerer prometheus.Registerer
	// ConstLabels are added to each of the queue's metrics, for example to
	// tell apart two shards of one queue. They must not hold "queue".
	ConstLabels prometheus.Labels
}

// Queue is a bounded FIFO queue that rejects items when full. It is safe for
// concurrent use by any number of producers and consumers. Create one with
// New and call Close when no more items will come.
type Queue[T any] struct {
	items chan T

	// mu guards closed and makes Close's close(items) exclusive with the
	// non-blocking sends in TryEnqueue; it is never held while blocking.
	mu     sync.RWMutex
	closed bool

	rejected prometheus.Counter
}

// New returns an empty queue configured by opts. It returns an error if
// Capacity is not positive, Name is not a valid metric name component, or
// the metrics cannot be registered; in that case nothing stays registered.
func New[T any](opts Options) (*Queue[T], error) {
	if !validName.MatchString(opts.Name) {
		return nil, fmt.Errorf("new queue %q: name must match %s", opts.Name, validName)
	}
	if opts.Capacity <= 0 {
		return nil, fmt.Errorf("new queue %q: capacity %d must be > 0", opts.Name, opts.Capacity)
	}
	labels := prometheus.Labels{"queue": opts.Name}
	for k, v := range opts.ConstLabels {
		if k == "queue" {
			return nil, fmt.Errorf("new queue %q: const label queue is the queue's name", opts.Name)
		}
		labels[k] = v
	}
	q := &Queue[T]{
		items: make(chan T, opts.Capacity),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        DroppedName,
			Help:        DroppedHelp,
			ConstLabels: labels,
		}),
	}
	if opts.Registerer == nil {
		return q, nil
	}
	collectors := []prometheus.Collector{
		// Gauge functions read the depth at scrape time, so the gauge is
		// exact and the hot path does no extra bookkeeping.
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        DepthName,
			Help:        DepthHelp,
			ConstLabels: labels,
		}, func() float64 { return float64(len(q.items)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        CapacityName,
			Help:        CapacityHelp,
			ConstLabels: labels,
		}, func() float64 { return float64(cap(q.items)) }),
		q.rejected,
	}
	for i, c := range collectors {
		if err := opts.Registerer.Register(c); err != nil {
			for _, done := range collectors[:i] {
				opts.Registerer.Unregister(done)
			}
			return nil, fmt.Errorf("register metrics of queue %q: %w", opts.Name, err)
		}
	}
	return q, nil
}

// TryEnqueue adds v at the tail of the queue without blocking. It returns
// ErrBusy, and counts it in queue_dropped_total, when the queue is full, and ErrClosed
// after Close.
func (q *Queue[T]) TryEnqueue(v T) error {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		return ErrClosed
	}
	select {
	case q.items <- v:
		return nil
	default:
		q.rejected.Inc()
		return ErrBusy
	}
}

// Dequeue removes and returns the item at the head of the queue, waiting
// until one arrives. It returns ctx.Err() if ctx is done first (or already
// done on entry, even if items are waiting), and ErrClosed once the queue is
// closed and every item accepted before Close has been dequeued.
func (q *Queue[T]) Dequeue(ctx context.Context) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	select {
	case v, ok := <-q.items:
		if !ok {
			return zero, ErrClosed
		}
		return v, nil
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// Len returns the number of items waiting in the queue.
func (q *Queue[T]) Len() int {
	return len(q.items)
}

// Cap returns the most items the queue holds, as set by Options.Capacity.
func (q *Queue[T]) Cap() int {
	return cap(q.items)
}

// Close stops the queue from accepting items: later TryEnqueue calls return
// ErrClosed. Items already queued stay available to Dequeue, which returns
// ErrClosed once they are drained. Close does not unregister the metrics.
// Calling Close more than once is safe.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.items)
	}
}
