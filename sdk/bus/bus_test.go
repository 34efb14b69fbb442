package bus_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/plughost/plughost/sdk/bus"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newBus returns a bus of ints whose metric goes to a fresh registry.
func newBus(t *testing.T, opts bus.Options) (*bus.Bus[int], *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	b, err := bus.New[int](opts)
	if err != nil {
		t.Fatalf("bus.New(%+v) = %v, want nil error", opts, err)
	}
	return b, reg
}

// lagged returns bus_lagged_total's series in reg, by consumer.
func lagged(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != bus.LaggedName {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	return got
}

// drain reads what sub's buffer holds without waiting, and the events
// missed before them.
func drain(t *testing.T, sub *bus.Sub[int]) (evs []int, missed uint64) {
	t.Helper()
	for sub.Len() > 0 {
		v, err := sub.Next(t.Context())
		if err != nil {
			t.Fatalf("Next() with %d events waiting = %v", sub.Len(), err)
		}
		evs, missed = append(evs, v), missed+sub.Missed()
	}
	return evs, missed
}

// TestCutOff: a consumer whose buffer of 2 is full when the third event
// comes is cut off: it reads the 2 it had, then ErrLagged, and is
// counted once; a consumer with room gets every event, before and after.
func TestCutOff(t *testing.T) {
	b, reg := newBus(t, bus.Options{Policy: bus.CutOff, Consumers: []string{"slow"}})
	slow, fast := b.Subscribe("slow", 2), b.Subscribe("fast", 8)
	defer slow.Close()
	defer fast.Close()
	for v := 1; v <= 3; v++ {
		b.Publish(v)
	}
	if !slow.Lagged() || slow.Len() != 2 {
		t.Fatalf("a consumer with a buffer of 2: lagged %v holding %d after the third event, want lagged holding 2", slow.Lagged(), slow.Len())
	}
	if n := b.Len(); n != 1 {
		t.Errorf("Len() after the cut = %d, want 1", n)
	}
	b.Publish(4)
	var got []int
	for {
		ev, err := slow.Next(t.Context())
		if errors.Is(err, bus.ErrLagged) {
			break
		}
		if err != nil {
			t.Fatalf("slow.Next() = %v, want an event or ErrLagged", err)
		}
		got = append(got, ev)
	}
	if fmt.Sprint(got) != "[1 2]" {
		t.Errorf("cut-off consumer read %v before ErrLagged, want [1 2]", got)
	}
	if evs, _ := drain(t, fast); fmt.Sprint(evs) != "[1 2 3 4]" {
		t.Errorf("fast consumer holds %v, want [1 2 3 4]", evs)
	}
	if got, want := lagged(t, reg), map[string]float64{"slow": 1, bus.OtherConsumer: 0}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("bus_lagged_total = %v, want %v", got, want)
	}
	if _, err := slow.Next(t.Context()); !errors.Is(err, bus.ErrLagged) {
		t.Errorf("slow.Next() once empty = %v, want ErrLagged again", err)
	}
}

// TestDropOldest: a consumer that does not read keeps its newest events,
// told how many it missed once; every dropped event is counted, and it
// stays subscribed.
func TestDropOldest(t *testing.T) {
	b, reg := newBus(t, bus.Options{Policy: bus.DropOldest, Consumers: []string{"ops"}})
	slow, stranger, roomy := b.Subscribe("ops", 2), b.Subscribe("someone", 1), b.Subscribe("ops", 8)
	for _, s := range []*bus.Sub[int]{slow, stranger, roomy} {
		defer s.Close()
	}
	for v := 1; v <= 5; v++ {
		b.Publish(v)
	}
	for _, tt := range []struct {
		name   string
		sub    *bus.Sub[int]
		want   string
		missed uint64
	}{
		{"slow", slow, "[4 5]", 3},
		{"stranger", stranger, "[5]", 4},
		{"roomy", roomy, "[1 2 3 4 5]", 0},
	} {
		if evs, missed := drain(t, tt.sub); fmt.Sprint(evs) != tt.want || missed != tt.missed {
			t.Errorf("%s holds %v having missed %d, want %s having missed %d", tt.name, evs, missed, tt.want, tt.missed)
		}
	}
	if got, want := lagged(t, reg), map[string]float64{"ops": 3, bus.OtherConsumer: 4}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("bus_lagged_total = %v, want %v", got, want)
	}
	b.Publish(6)
	if ev, err := slow.Next(t.Context()); ev != 6 || err != nil || slow.Missed() != 0 {
		t.Errorf("slow.Next() after its lag = %d, %v having missed %d, want 6, nil having missed 0", ev, err, slow.Missed())
	}
}

// TestLabel: the consumer label takes a name only when the operator lists
// it; every other name, however many clients choose, counts under one
// "other" series, under either policy.
func TestLabel(t *testing.T) {
	for _, p := range []bus.Policy{bus.CutOff, bus.DropOldest} {
		t.Run(p.String(), func(t *testing.T) {
			b, reg := newBus(t, bus.Options{Policy: p, Consumers: []string{"indexer"}})
			for _, name := range []string{"indexer", "client-1", "client-2", "anonymous"} {
				defer b.Subscribe(name, 1).Close()
			}
			b.Publish(1)
			b.Publish(2) // each buffer of 1 is full: all four lag
			want := map[string]float64{"indexer": 1, bus.OtherConsumer: 3}
			if got := lagged(t, reg); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("bus_lagged_total = %v, want %v", got, want)
			}
			if n, err := testutil.GatherAndCount(reg, bus.LaggedName); n != 2 || err != nil {
				t.Errorf("bus_lagged_total has %d series (%v), want 2 (indexer, other)", n, err)
			}
		})
	}
}

func TestCheckConsumers(t *testing.T) {
	many := make([]string, bus.MaxConsumers+1)
	for i := range many {
		many[i] = fmt.Sprint("c", i)
	}
	for _, tt := range []struct {
		name  string
		names []string
		want  string // in the error; "" for nil
	}{
		{"none", nil, ""},
		{"some", []string{"indexer", "mirror_2", "a-b"}, ""},
		{"at most", many[:bus.MaxConsumers], ""},
		{"repeats count once", append(many[:bus.MaxConsumers:bus.MaxConsumers], "c0"), ""},
		{"capital", []string{"indexer", "Mirror"}, `"Mirror" at index 1`},
		{"other", []string{bus.OtherConsumer}, `not be "other"`},
		{"empty", []string{""}, `"" at index 0`},
		{"33 bytes", []string{strings.Repeat("a", 33)}, "at index 0"},
		{"too many", many, fmt.Sprintf("at most %d names, got %d", bus.MaxConsumers, bus.MaxConsumers+1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := bus.CheckConsumers(tt.names)
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CheckConsumers(%q) = %v, want %q", tt.names, err, tt.want)
			}
			if _, nerr := bus.New[int](bus.Options{Consumers: tt.names}); (nerr == nil) != (err == nil) {
				t.Errorf("New with Consumers %q = %v, want what CheckConsumers says (%v)", tt.names, nerr, err)
			}
		})
	}
}

func TestConsumer(t *testing.T) {
	for _, tt := range []struct {
		query, want string
		ok          bool
	}{
		{"", "anonymous", true},
		{"?consumer=", "anonymous", true},
		{"?consumer=ops-1_a", "ops-1_a", true},
		{"?consumer=Bad!", "Bad!", false},
		{"?consumer=" + strings.Repeat("a", 33), strings.Repeat("a", 33), false},
	} {
		r := httptest.NewRequest("GET", "/events"+tt.query, nil)
		if name, ok := bus.Consumer(r); name != tt.want || ok != tt.ok {
			t.Errorf("Consumer(%q) = %q, %v, want %q, %v", tt.query, name, ok, tt.want, tt.ok)
		}
	}
}

func TestNewRefuses(t *testing.T) {
	if _, err := bus.New[int](bus.Options{Policy: bus.Policy(7)}); err == nil {
		t.Error("New with Policy(7) = nil error, want one")
	}
	reg := prometheus.NewRegistry()
	if _, err := bus.New[int](bus.Options{Registerer: reg}); err != nil {
		t.Fatalf("first New = %v", err)
	}
	if _, err := bus.New[int](bus.Options{Registerer: reg}); err == nil {
		t.Error("second New on one registry = nil error, want the registration's")
	}
}

// TestNextEnds: Next ends with the request's context and with the
// plugin's drain, even while events wait in the buffer.
func TestNextEnds(t *testing.T) {
	drained := make(chan struct{})
	b, _ := newBus(t, bus.Options{Policy: bus.DropOldest, Drain: drained})
	sub := b.Subscribe("c", 4)
	defer sub.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := sub.Next(ctx)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Next after cancel = %v, want context.Canceled", err)
	}
	b.Publish(1)
	close(drained)
	if _, err := sub.Next(t.Context()); !errors.Is(err, bus.ErrDraining) {
		t.Errorf("Next with an event waiting once drained = %v, want ErrDraining", err)
	}
}

// TestPublishNeverBlocks: publishers, subscribers coming and going, and
// consumers that never read, all at once under -race: every Publish
// returns, and a consumer with room for them all gets the events of one
// publisher in order.
func TestPublishNeverBlocks(t *testing.T) {
	for _, p := range []bus.Policy{bus.CutOff, bus.DropOldest} {
		t.Run(p.String(), func(t *testing.T) {
			b, reg := newBus(t, bus.Options{Policy: p})
			const n = 20000
			stuck, roomy := b.Subscribe("stuck", 3), b.Subscribe("roomy", n+201)
			defer stuck.Close()
			defer roomy.Close()
			var wg sync.WaitGroup
			wg.Go(func() {
				for v := 1; v <= n; v++ {
					b.Publish(v)
				}
			})
			wg.Go(func() {
				for range 200 {
					s := b.Subscribe("churn", 1)
					b.Publish(-1)
					s.Close()
				}
			})
			done := make(chan struct{})
			go func() {
				wg.Wait()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("publishing outlasted 10s beside a consumer that never reads")
			}
			var last int
			evs, _ := drain(t, roomy)
			for _, v := range evs {
				if v > 0 && v != last+1 {
					t.Fatalf("roomy consumer got %d after %d, want every event in order", v, last)
				}
				last = max(last, v)
			}
			if last != n {
				t.Errorf("roomy consumer's last event = %d, want %d", last, n)
			}
			if got := lagged(t, reg)[bus.OtherConsumer]; got == 0 {
				t.Errorf("bus_lagged_total{consumer=other} = 0 after %d events to a buffer of 3, want > 0", n)
			}
			if p == bus.DropOldest {
				evs, _ := drain(t, stuck)
				if len(evs) != 3 || evs[2] != n && evs[2] != -1 {
					t.Errorf("stuck consumer holds %v, want 3 of the newest events", evs)
				}
			}
		})
	}
}
