package drr

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recJob records how it left: Run appends its name to a shared log;
// Cancel records the reason.
type recJob struct {
	name    string
	log     *[]string
	mu      *sync.Mutex
	hold    chan struct{} // Run waits on it when non-nil
	left    atomic.Int32
	reason  atomic.Value
	ran     chan struct{}
	started chan struct{}
}

func newJob(name string, log *[]string, mu *sync.Mutex) *recJob {
	return &recJob{name: name, log: log, mu: mu, ran: make(chan struct{}), started: make(chan struct{})}
}

func (j *recJob) Run(ctx context.Context) {
	close(j.started)
	if j.hold != nil {
		select {
		case <-j.hold:
		case <-ctx.Done():
		}
	}
	j.mu.Lock()
	*j.log = append(*j.log, j.name)
	j.mu.Unlock()
	j.left.Add(1)
	close(j.ran)
}

func (j *recJob) Cancel(err error) {
	j.reason.Store(err)
	j.left.Add(1)
	close(j.ran)
}

// blocked returns a scheduler whose one worker is held by a job until the
// returned func is called.
func blocked(t *testing.T, opts Options) (*Scheduler, func()) {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var log []string
	holder := newJob("holder", &log, &mu)
	holder.hold = make(chan struct{})
	if err := s.Submit(opts.Tenants[0].Name, 1, holder); err != nil {
		t.Fatal(err)
	}
	<-holder.started
	t.Cleanup(func() { s.Close(context.Background()) })
	return s, func() { close(holder.hold) }
}

func TestDeficitRoundRobin(t *testing.T) {
	tests := []struct {
		name   string
		quanta [2]int
		costs  [2]int
		want   string
	}{
		// B displaces A's first job from the full scheduler queue; then
		// the round alternates.
		{"equal", [2]int{1, 1}, [2]int{1, 1}, "b0 a1 b1 a2 b2 a3 b3 a4 b4"},
		{"a twice b's quantum", [2]int{2, 1}, [2]int{1, 1}, "b0 a1 a2 b1 a3 a4 b2 b3 b4"},
		{"b's jobs cost 2", [2]int{1, 1}, [2]int{1, 2}, "b0 a1 a2 b1 a3 a4 b2 b3 b4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, release := blocked(t, Options{
				Tenants:   []Tenant{{"a", tt.quanta[0], 10}, {"b", tt.quanta[1], 10}},
				Workers:   1,
				IntakeCap: 100,
				SchedCap:  1,
			})
			var mu sync.Mutex
			var log []string
			var jobs []*recJob
			for i, tenant := range []string{"a", "b"} {
				for n := range 5 {
					j := newJob(fmt.Sprintf("%s%d", tenant, n), &log, &mu)
					jobs = append(jobs, j)
					if err := s.Submit(tenant, tt.costs[i], j); err != nil {
						t.Fatal(err)
					}
				}
			}
			release()
			for _, j := range jobs {
				<-j.ran
			}
			if r, _ := jobs[0].reason.Load().(error); !errors.Is(r, ErrDropped) {
				t.Errorf("a0 left with %v, want ErrDropped", r)
			}
			if got := strings.Join(log, " "); got != tt.want {
				t.Errorf("run order = %q, want %q", got, tt.want)
			}
			if st := s.Stats(); st.Dropped != 1 {
				t.Errorf("Stats().Dropped = %d, want 1", st.Dropped)
			}
		})
	}
}

func TestOverflowPolicies(t *testing.T) {
	s, release := blocked(t, Options{
		Tenants:   []Tenant{{"a", 1, 2}, {"b", 1, 5}},
		Workers:   1,
		IntakeCap: 3,
		SchedCap:  1,
	})
	defer release()
	var mu sync.Mutex
	var log []string
	submit := func(tenant string) error { return s.Submit(tenant, 1, newJob(tenant, &log, &mu)) }
	// a: one in the scheduler queue, two in its own (max_queue 2).
	for range 3 {
		if err := submit("a"); err != nil {
			t.Fatalf("Submit(a) = %v, want nil", err)
		}
	}
	if err := submit("a"); !errors.Is(err, ErrTenantBusy) {
		t.Fatalf("Submit(a) over max_queue = %v, want ErrTenantBusy", err)
	}
	// b displaces a's job from the scheduler queue, then queues one.
	if err := submit("b"); err != nil {
		t.Fatalf("Submit(b) while a is over its max_queue = %v, want nil", err)
	}
	if err := submit("b"); err != nil {
		t.Fatalf("Submit(b) = %v, want nil", err)
	}
	// The tenant queues now hold 3 jobs: the intake is full.
	if err := submit("b"); !errors.Is(err, ErrBusy) {
		t.Fatalf("Submit(b) with the intake full = %v, want ErrBusy", err)
	}
	if err := submit("c"); !errors.Is(err, ErrUnknownTenant) {
		t.Fatalf("Submit(c) = %v, want ErrUnknownTenant", err)
	}
	st := s.Stats()
	if st.Intake != 3 || st.Sched != 1 || st.Dropped != 1 || st.BusyIntake != 1 || st.BusyTenant != 1 {
		t.Errorf("Stats() = %+v, want intake 3, sched 1, dropped 1, busy 1 and 1", st)
	}
}

func TestCloseAbortsAtDeadline(t *testing.T) {
	s, err := New(Options{Tenants: []Tenant{{"a", 1, 10}}, Workers: 2, IntakeCap: 10, SchedCap: 1})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var log []string
	var jobs []*recJob
	for i := range 5 {
		j := newJob(fmt.Sprint(i), &log, &mu)
		j.hold = make(chan struct{}) // never released: only the abort ends them
		jobs = append(jobs, j)
		if err := s.Submit("a", 1, j); err != nil {
			t.Fatal(err)
		}
	}
	<-jobs[0].started
	<-jobs[1].started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if got := s.Close(ctx); got != 2 {
		t.Errorf("Close aborted %d jobs, want the 2 running", got)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v past a 50ms deadline", d)
	}
	for i, j := range jobs {
		select {
		case <-j.ran:
		case <-time.After(10 * time.Second):
			t.Fatalf("job %d never left", i)
		}
		if n := j.left.Load(); n != 1 {
			t.Errorf("job %d left %d times, want once", i, n)
		}
	}
	if st := s.Stats(); st.Aborted != 2 || st.CanceledOnClose != 3 {
		t.Errorf("Stats() = %+v, want 2 aborted and 3 cancelled", st)
	}
	if err := s.Submit("a", 1, newJob("late", &log, &mu)); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit after Close = %v, want ErrClosed", err)
	}
}

// TestStress submits from many goroutines, with random tenants, costs and
// run times, while Close races them. Every accepted job must leave exactly
// once, nothing may deadlock, and no goroutine may be left (goleak).
func TestStress(t *testing.T) {
	for round := range 20 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(round), 19))
			tenants := []Tenant{{"a", 1 + rng.IntN(3), 1 + rng.IntN(8)}, {"b", 1, 1 + rng.IntN(8)}, {"c", 2, 4}}
			s, err := New(Options{Tenants: tenants, Workers: 1 + rng.IntN(4), IntakeCap: 1 + rng.IntN(16), SchedCap: 1 + rng.IntN(4)})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var log []string
			var accepted sync.Map
			var wg sync.WaitGroup
			for p := range 8 {
				wg.Add(1)
				seed := rng.Uint64()
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(seed, uint64(p)))
					for i := range 200 {
						j := newJob(fmt.Sprintf("%d/%d", p, i), &log, &mu)
						if r.IntN(4) == 0 {
							j.hold = make(chan struct{})
							d := time.Duration(r.IntN(200)) * time.Microsecond
							time.AfterFunc(d, func() { close(j.hold) })
						}
						err := s.Submit(tenants[r.IntN(3)].Name, 1+r.IntN(3), j)
						switch {
						case err == nil:
							accepted.Store(j, true)
						case errors.Is(err, ErrClosed):
							return
						case !errors.Is(err, ErrBusy) && !errors.Is(err, ErrTenantBusy):
							t.Errorf("Submit = %v", err)
						}
					}
				}()
			}
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(2000))*time.Microsecond)
			s.Close(ctx)
			cancel()
			wg.Wait()
			accepted.Range(func(k, _ any) bool {
				j := k.(*recJob)
				select {
				case <-j.ran:
				case <-time.After(10 * time.Second):
					t.Errorf("job %s never left", j.name)
					return false
				}
				if n := j.left.Load(); n != 1 {
					t.Errorf("job %s left %d times, want once", j.name, n)
				}
				return true
			})
		})
	}
}
