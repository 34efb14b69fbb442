package bus_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/plughost/plughost/plugins/wallet/internal/bus"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestTake(t *testing.T) {
	tests := []struct {
		name        string
		capacity    int
		publish     [][]int
		want        []int
		wantLagged  uint64
		wantCounter float64
	}{
		{"nothing", 4, nil, nil, 0, 0},
		{"fits", 4, [][]int{{1, 2}, {3}}, []int{1, 2, 3}, 0, 0},
		{"exactly full", 3, [][]int{{1, 2, 3}}, []int{1, 2, 3}, 0, 0},
		{"drops the oldest", 3, [][]int{{1, 2}, {3, 4, 5}}, []int{3, 4, 5}, 2, 2},
		{"one publish larger than the buffer", 2, [][]int{{1, 2, 3, 4, 5}}, []int{4, 5}, 3, 3},
		{"capacity below 1 means 1", 0, [][]int{{1}, {2}}, []int{2}, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lagged := prometheus.NewCounter(prometheus.CounterOpts{Name: "lagged_total", Help: "x"})
			b := bus.New[int](tt.capacity, lagged)
			s := b.Subscribe()
			defer s.Close()
			for _, p := range tt.publish {
				b.Publish(p...)
			}
			if got := b.Buffered(); got != len(tt.want) {
				t.Errorf("Buffered() = %d, want %d", got, len(tt.want))
			}
			got, lag := s.Take(nil)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Take() values mismatch (-want +got):\n%s", diff)
			}
			if lag != tt.wantLagged {
				t.Errorf("Take() lagged = %d, want %d", lag, tt.wantLagged)
			}
			if c := testutil.ToFloat64(lagged); c != tt.wantCounter {
				t.Errorf("lagged counter = %v, want %v", c, tt.wantCounter)
			}
			// A second Take finds nothing and no lag.
			if got, lag := s.Take(nil); len(got) != 0 || lag != 0 {
				t.Errorf("second Take() = %v, %d, want nothing", got, lag)
			}
		})
	}
}

func TestSubscribersAreIndependent(t *testing.T) {
	b := bus.New[int](2, nil)
	fast, slow := b.Subscribe(), b.Subscribe()
	defer fast.Close()
	defer slow.Close()
	var got []int
	for i := range 5 {
		b.Publish(i)
		got, _ = fast.Take(got)
	}
	if diff := cmp.Diff([]int{0, 1, 2, 3, 4}, got); diff != "" {
		t.Errorf("fast subscriber mismatch (-want +got):\n%s", diff)
	}
	vs, lag := slow.Take(nil)
	if diff := cmp.Diff([]int{3, 4}, vs); diff != "" || lag != 3 {
		t.Errorf("slow subscriber Take() = %v, %d, want [3 4], 3 (-want +got):\n%s", vs, lag, diff)
	}
}

func TestCloseStopsDelivery(t *testing.T) {
	b := bus.New[int](4, nil)
	s := b.Subscribe()
	s.Close()
	s.Close()
	b.Publish(1)
	if got, _ := s.Take(nil); len(got) != 0 || b.Subscribers() != 0 {
		t.Errorf("after Close: Take() = %v, Subscribers() = %d, want nothing", got, b.Subscribers())
	}
}

func TestReadyWakesReader(t *testing.T) {
	b := bus.New[int](1024, nil)
	s := b.Subscribe()
	defer s.Close()
	const n = 10000
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range n {
			b.Publish(i)
		}
	})
	var got []int
	var lagged uint64
	deadline := time.After(20 * time.Second)
	for len(got)+int(lagged) < n {
		select {
		case <-s.Ready():
			var lag uint64
			got, lag = s.Take(got)
			lagged += lag
		case <-deadline:
			t.Fatalf("received %d values and %d lag reports of %d", len(got), lagged, n)
		}
	}
	wg.Wait()
	// Whatever was received is in publish order, and nothing is lost
	// without being reported.
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("values out of order: %d after %d", got[i], got[i-1])
		}
	}
	if len(got)+int(lagged) != n {
		t.Errorf("received %d + lagged %d, want %d", len(got), lagged, n)
	}
}
