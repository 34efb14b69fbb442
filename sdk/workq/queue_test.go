package workq_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/plughost/plughost/sdk/workq"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newQueue returns a queue named "jobs" whose metrics go to a fresh registry.
func newQueue(t *testing.T, capacity int) (*workq.Queue[int], *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	q, err := workq.New[int](workq.Options{
		Name:        "jobs",
		Capacity:    capacity,
		Registerer:  reg,
		ConstLabels: prometheus.Labels{"shard": "a"},
	})
	if err != nil {
		t.Fatalf("workq.New(jobs, %d) = %v, want nil error", capacity, err)
	}
	t.Cleanup(q.Close)
	return q, reg
}

// checkMetrics compares every metric in reg with the wanted values.
func checkMetrics(t *testing.T, reg prometheus.Gatherer, depth, capacity, rejected int) {
	t.Helper()
	want := fmt.Sprintf(`
# HELP queue_capacity Most items a bounded queue holds, by queue.
# TYPE queue_capacity gauge
queue_capacity{queue="jobs",shard="a"} %d
# HELP queue_depth Items waiting in a bounded queue, by queue.
# TYPE queue_depth gauge
queue_depth{queue="jobs",shard="a"} %d
# HELP queue_dropped_total Items a bounded queue did not deliver, by queue: refused when full, or dropped oldest for a slow reader.
# TYPE queue_dropped_total counter
queue_dropped_total{queue="jobs",shard="a"} %d
`, capacity, depth, rejected)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Errorf("metrics differ from depth=%d capacity=%d rejected=%d:\n%v", depth, capacity, rejected, err)
	}
}

func TestNewOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    workq.Options
		wantErr bool
	}{
		{"valid", workq.Options{Name: "jobs", Capacity: 1}, false},
		{"valid with registerer", workq.Options{Name: "ingress_jobs_2", Capacity: 10, Registerer: prometheus.NewRegistry()}, false},
		{"zero capacity", workq.Options{Name: "jobs"}, true},
		{"negative capacity", workq.Options{Name: "jobs", Capacity: -1}, true},
		{"empty name", workq.Options{Capacity: 1}, true},
		{"name starts with digit", workq.Options{Name: "1jobs", Capacity: 1}, true},
		{"name with dash", workq.Options{Name: "my-jobs", Capacity: 1}, true},
		{"name with colon", workq.Options{Name: "my:jobs", Capacity: 1}, true},
		{"name with space", workq.Options{Name: "my jobs", Capacity: 1}, true},
		{"const label queue", workq.Options{Name: "jobs", Capacity: 1, ConstLabels: prometheus.Labels{"queue": "other"}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := workq.New[string](tt.opts)
			if gotErr := err != nil; gotErr != tt.wantErr {
				t.Fatalf("workq.New(%+v) error = %v, want error %t", tt.opts, err, tt.wantErr)
			}
			if err == nil && q.Cap() != tt.opts.Capacity {
				t.Errorf("workq.New(%+v).Cap() = %d, want %d", tt.opts, q.Cap(), tt.opts.Capacity)
			}
		})
	}
}

func TestNewDuplicateRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := workq.Options{Name: "jobs", Capacity: 1, Registerer: reg}
	if _, err := workq.New[int](opts); err != nil {
		t.Fatalf("first workq.New(%+v) = %v, want nil error", opts, err)
	}
	_, err := workq.New[int](opts)
	var already prometheus.AlreadyRegisteredError
	if !errors.As(err, &already) {
		t.Fatalf("second workq.New(%+v) = %v, want a prometheus.AlreadyRegisteredError", opts, err)
	}

	// A failed New must not leave some of its metrics behind: a queue with
	// the same name on a registry that already has only its rejected counter
	// fails, and after that the registry still holds only that counter.
	reg = prometheus.NewRegistry()
	if err := reg.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: "queue_dropped_total", Help: "x", ConstLabels: prometheus.Labels{"queue": "jobs"}})); err != nil {
		t.Fatalf("Register(queue_dropped_total{queue=jobs}) = %v, want nil error", err)
	}
	if _, err := workq.New[int](workq.Options{Name: "jobs", Capacity: 1, Registerer: reg}); err == nil {
		t.Fatalf("workq.New(jobs) with its counter taken = nil error, want error")
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 1 {
		t.Errorf("GatherAndCount after failed New = %d, %v, want 1, nil", n, err)
	}
}

func TestTryEnqueueFull(t *testing.T) {
	q, reg := newQueue(t, 2)
	checkMetrics(t, reg, 0, 2, 0)

	for i := range 2 {
		if err := q.TryEnqueue(i); err != nil {
			t.Fatalf("TryEnqueue(%d) = %v, want nil", i, err)
		}
	}
	checkMetrics(t, reg, 2, 2, 0)

	for i := range 3 {
		if err := q.TryEnqueue(100 + i); !errors.Is(err, workq.ErrBusy) {
			t.Fatalf("TryEnqueue(%d) on full queue = %v, want %v", 100+i, err, workq.ErrBusy)
		}
	}
	if got := q.Len(); got != 2 {
		t.Errorf("Len() = %d, want 2", got)
	}
	checkMetrics(t, reg, 2, 2, 3)

	// Taking one item frees one slot, and only one.
	if v, err := q.Dequeue(t.Context()); v != 0 || err != nil {
		t.Fatalf("Dequeue() = %d, %v, want 0, nil", v, err)
	}
	checkMetrics(t, reg, 1, 2, 3)
	if err := q.TryEnqueue(2); err != nil {
		t.Fatalf("TryEnqueue(2) after Dequeue = %v, want nil", err)
	}
	if err := q.TryEnqueue(3); !errors.Is(err, workq.ErrBusy) {
		t.Fatalf("TryEnqueue(3) = %v, want %v", err, workq.ErrBusy)
	}
	checkMetrics(t, reg, 2, 2, 4)
}

func TestFIFO(t *testing.T) {
	q, _ := newQueue(t, 5)
	for i := range 5 {
		if err := q.TryEnqueue(i); err != nil {
			t.Fatalf("TryEnqueue(%d) = %v, want nil", i, err)
		}
	}
	for want := range 5 {
		if got, err := q.Dequeue(t.Context()); got != want || err != nil {
			t.Fatalf("Dequeue() = %d, %v, want %d, nil", got, err, want)
		}
	}
}

func TestClose(t *testing.T) {
	q, reg := newQueue(t, 3)
	for i := range 2 {
		if err := q.TryEnqueue(i); err != nil {
			t.Fatalf("TryEnqueue(%d) = %v, want nil", i, err)
		}
	}
	q.Close()
	q.Close() // a second Close is harmless

	if err := q.TryEnqueue(9); !errors.Is(err, workq.ErrClosed) {
		t.Errorf("TryEnqueue(9) after Close = %v, want %v", err, workq.ErrClosed)
	}
	// Items accepted before Close are still delivered, in order, then ErrClosed.
	steps := []struct {
		want    int
		wantErr error
	}{{0, nil}, {1, nil}, {0, workq.ErrClosed}, {0, workq.ErrClosed}}
	for i, s := range steps {
		got, err := q.Dequeue(t.Context())
		if got != s.want || !errors.Is(err, s.wantErr) {
			t.Errorf("Dequeue() #%d after Close = %d, %v, want %d, %v", i, got, err, s.want, s.wantErr)
		}
	}
	// Closed-queue refusals are not overflow, so they are not counted.
	checkMetrics(t, reg, 0, 3, 0)
}

func TestCloseWakesDequeue(t *testing.T) {
	q, _ := newQueue(t, 1)
	errc := make(chan error, 1)
	go func() {
		_, err := q.Dequeue(t.Context())
		errc <- err
	}()
	q.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, workq.ErrClosed) {
			t.Errorf("Dequeue() on closed empty queue = %v, want %v", err, workq.ErrClosed)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Dequeue() still blocked 10s after Close")
	}
}

func TestDequeueContext(t *testing.T) {
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	expired, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()

	tests := []struct {
		name  string
		ctx   context.Context
		items int
		want  error
	}{
		{"canceled on empty queue", canceled, 0, context.Canceled},
		{"canceled with items waiting", canceled, 1, context.Canceled},
		{"deadline on empty queue", expired, 0, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _ := newQueue(t, 1)
			for i := range tt.items {
				if err := q.TryEnqueue(i); err != nil {
					t.Fatalf("TryEnqueue(%d) = %v, want nil", i, err)
				}
			}
			if _, err := q.Dequeue(tt.ctx); !errors.Is(err, tt.want) {
				t.Errorf("Dequeue() = %v, want %v", err, tt.want)
			}
			if got := q.Len(); got != tt.items {
				t.Errorf("Len() after failed Dequeue = %d, want %d", got, tt.items)
			}
		})
	}
}

func TestDequeueCanceledWhileWaiting(t *testing.T) {
	q, _ := newQueue(t, 1)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := q.Dequeue(ctx)
		errc <- err
	}()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Dequeue() after cancel = %v, want %v", err, context.Canceled)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Dequeue() still blocked 10s after cancel")
	}
}

func TestConcurrentProducersConsumers(t *testing.T) {
	const (
		producers   = 8
		consumers   = 4
		perProducer = 2000
	)
	q, reg := newQueue(t, 16)

	// Producers never retry, so with a small capacity some items are
	// rejected; every accepted item must come out exactly once.
	accepted := make([][]int, producers)
	var pwg sync.WaitGroup
	for p := range producers {
		pwg.Go(func() {
			for i := range perProducer {
				v := p*perProducer + i
				switch err := q.TryEnqueue(v); {
				case err == nil:
					accepted[p] = append(accepted[p], v)
				case errors.Is(err, workq.ErrBusy):
					runtime.Gosched() // let consumers catch up, so more items get through
				default:
					t.Errorf("TryEnqueue(%d) = %v, want nil or %v", v, err, workq.ErrBusy)
					return
				}
			}
		})
	}

	received := make([][]int, consumers)
	var cwg sync.WaitGroup
	for c := range consumers {
		cwg.Go(func() {
			for {
				v, err := q.Dequeue(t.Context())
				if errors.Is(err, workq.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Dequeue() = %v, want nil or %v", err, workq.ErrClosed)
					return
				}
				received[c] = append(received[c], v)
			}
		})
	}

	pwg.Wait()
	q.Close()
	cwg.Wait()

	count := make(map[int]int)
	for _, r := range received {
		for _, v := range r {
			count[v]++
		}
	}
	nAccepted := 0
	for _, a := range accepted {
		nAccepted += len(a)
		for _, v := range a {
			if count[v] != 1 {
				t.Errorf("accepted item %d received %d times, want 1", v, count[v])
			}
			delete(count, v)
		}
	}
	for v, n := range count {
		t.Errorf("item %d received %d times but never accepted", v, n)
	}
	if nAccepted == 0 {
		t.Fatalf("no item accepted out of %d, want some", producers*perProducer)
	}
	checkMetrics(t, reg, 0, 16, producers*perProducer-nAccepted)
	t.Logf("accepted %d of %d items", nAccepted, producers*perProducer)
}

// TestFamiliesShared: two queues on one registry are two series of each
// family, told apart by their queue label.
func TestFamiliesShared(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, name := range []string{"commit", "events"} {
		q, err := workq.New[int](workq.Options{Name: name, Capacity: 2, Registerer: reg})
		if err != nil {
			t.Fatalf("workq.New(%s) = %v, want nil error", name, err)
		}
		t.Cleanup(q.Close)
	}
	for _, family := range []string{"queue_depth", "queue_capacity", "queue_dropped_total"} {
		if n := testutil.CollectAndCount(reg, family); n != 2 {
			t.Errorf("CollectAndCount(%s) = %d, want 2 (one per queue)", family, n)
		}
	}
}
