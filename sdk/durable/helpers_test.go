package durable_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk/durable"
)

// fakeStore is a fake durable.Store: it remembers what the committer
// asked of it. A test fails it (fail), holds its checkpoints (hold) or
// makes one due (due).
type fakeStore struct {
	mu          sync.Mutex
	err         error
	reopens     int
	pending     bool
	due         bool
	checkpoints int
	hold        chan struct{} // a checkpoint waits for it to close
	held        chan struct{} // closed by the next checkpoint as it starts
	corruptions atomic.Uint64
}

// Corruptions makes fakeStore a durable.CorruptionCounter.
func (s *fakeStore) Corruptions() uint64 { return s.corruptions.Load() }

func (s *fakeStore) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *fakeStore) Reopen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reopens++
	s.err = nil
	return nil
}

func (s *fakeStore) Pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending
}

func (s *fakeStore) CheckpointDue() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.due
}

func (s *fakeStore) CheckpointIn() time.Duration { return time.Millisecond }

func (s *fakeStore) Checkpoint() error {
	s.mu.Lock()
	hold, held := s.hold, s.held
	s.held = nil
	s.mu.Unlock()
	if held != nil {
		close(held)
	}
	if hold != nil {
		<-hold
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checkpoints++
	s.due, s.pending = false, false
	return nil
}

func (s *fakeStore) set(fn func(s *fakeStore)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(s)
}

// fakeApplier is the fake plugin rules: an operation is an int, its result
// the seq of its commit (1, 2, … in the order the applier saw them). A
// test's hook runs before each group, on the flight's goroutine: it can
// block (a stalled disk), fail or panic.
type fakeApplier struct {
	mu     sync.Mutex
	seq    uint64
	groups [][]int
	hook   func(ops []int) error
	probes atomic.Int32
}

func (a *fakeApplier) setHook(h func(ops []int) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hook = h
}

func (a *fakeApplier) apply(ctx context.Context, ops []int) ([]uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	hook := a.hook
	a.mu.Unlock()
	if hook != nil {
		if err := hook(ops); err != nil {
			return nil, err
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	res := make([]uint64, len(ops))
	for i := range ops {
		a.seq++
		res[i] = a.seq
	}
	a.groups = append(a.groups, slices.Clone(ops))
	return res, nil
}

func (a *fakeApplier) probe() error {
	a.probes.Add(1)
	a.mu.Lock()
	hook := a.hook
	a.mu.Unlock()
	if hook != nil {
		return hook(nil)
	}
	return nil
}

func (a *fakeApplier) groupSizes() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n []int
	for _, g := range a.groups {
		n = append(n, len(g))
	}
	return n
}

// outcome is what one callback received.
type outcome struct {
	res uint64
	err error
}

// fixture is a committer over a fake store and applier. Every callback
// is counted: the test fails unless each submitted operation's callback
// ran exactly once by the time the committer has been closed.
type fixture struct {
	c     *durable.Committer[int, uint64]
	store *fakeStore
	app   *fakeApplier
	reg   *prometheus.Registry

	mu        sync.Mutex
	calls     map[int]int // callbacks per op
	announced []uint64
	settled   [][]int
	next      int
}

func newFixture(t *testing.T, opts durable.Options[int, uint64]) *fixture {
	t.Helper()
	return newFixtureProbing(t, opts, true)
}

// newFixtureProbing is newFixture, with a prober (the applier's probe)
// only if probing.
func newFixtureProbing(t *testing.T, opts durable.Options[int, uint64], probing bool) *fixture {
	t.Helper()
	f := &fixture{store: &fakeStore{}, app: &fakeApplier{}, reg: prometheus.NewRegistry(), calls: map[int]int{}}
	opts.Store = f.store
	opts.Apply = f.app.apply
	if probing {
		opts.Probe = f.app.probe
	}
	opts.Registerer = f.reg
	opts.Metrics = durable.Names{Prefix: "fake"}
	// A test's own Announce runs first, so that it can hold an
	// announcement: the results count as announced once it returns.
	hold := opts.Announce
	opts.Announce = func(rs []uint64) {
		if hold != nil {
			hold(rs)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.announced = append(f.announced, rs...)
	}
	opts.Settled = func(ops []int) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.settled = append(f.settled, slices.Clone(ops))
	}
	var err error
	f.c, err = durable.New(opts)
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.c.Close(ctx)
		f.mu.Lock()
		defer f.mu.Unlock()
		for op, n := range f.calls {
			if n != 1 {
				t.Errorf("op %d's callback ran %d times, want exactly once", op, n)
			}
		}
	})
	return f
}

// submit queues a new operation and returns it and the channel its
// outcome arrives on.
func (f *fixture) submit(t *testing.T) (int, <-chan outcome, error) {
	t.Helper()
	f.mu.Lock()
	f.next++
	op := f.next
	f.mu.Unlock()
	ch := make(chan outcome, 1)
	err := f.c.Submit(op, func(r uint64, err error) {
		f.mu.Lock()
		f.calls[op]++
		f.mu.Unlock()
		ch <- outcome{r, err}
	})
	if err == nil {
		f.mu.Lock()
		if _, ok := f.calls[op]; !ok {
			f.calls[op] += 0
		}
		f.mu.Unlock()
	}
	return op, ch, err
}

func (f *fixture) mustSubmit(t *testing.T) <-chan outcome {
	t.Helper()
	_, ch, err := f.submit(t)
	if err != nil {
		t.Fatalf("Submit() = %v", err)
	}
	return ch
}

func (f *fixture) announcedSeqs() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.announced)
}

func (f *fixture) settledGroups() [][]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.settled)
}

func wait(t *testing.T, ch <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(20 * time.Second):
		t.Fatal("no result within 20s")
		return outcome{}
	}
}

// waitUntil polls cond every 5ms for up to 20s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 20s waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll
	}
}

// metric returns the value of a counter or gauge, or the sample count of
// a histogram, with the given labels.
func (f *fixture) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	fams, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		if fam.GetName() != name {
			continue
		}
	next:
		for _, m := range fam.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

// gate is a fake fault set: Inject blocks until Open or ctx ends, and
// entered receives a value each time one blocks.
type gate struct {
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 64), open: make(chan struct{})}
}

func (g *gate) Inject(ctx context.Context, _ string) error {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) Open() { g.once.Do(func() { close(g.open) }) }

func (g *gate) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("no commit reached the fault point within 20s")
	}
}

// stall returns a hook that blocks the groups holding op until release
// is called (at the end of the test at the latest), and a channel that
// receives a value when one blocks.
func stall(t *testing.T, op int) (hook func([]int) error, entered <-chan struct{}, release func()) {
	in := make(chan struct{}, 1)
	held := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	t.Cleanup(release)
	return func(ops []int) error {
		if slices.Contains(ops, op) {
			select {
			case in <- struct{}{}:
			default:
			}
			<-held
		}
		return nil
	}, in, release
}
