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
// returned func is called, or the test's cleanup aborts it.
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
	t.Cleanup(func() {
		// A test that failed may leave jobs held: the deadline aborts them.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.Close(ctx)
	})
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
	// a: one in the scheduler queue, one in its own: max_queue 2 counts
	// both.
	for range 2 {
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
	// 3 jobs wait, 2 in the tenant queues and 1 in the scheduler queue:
	// the intake is full.
	if err := submit("b"); !errors.Is(err, ErrBusy) {
		t.Fatalf("Submit(b) with the intake full = %v, want ErrBusy", err)
	}
	if err := submit("c"); !errors.Is(err, ErrUnknownTenant) {
		t.Fatalf("Submit(c) = %v, want ErrUnknownTenant", err)
	}
	st := s.Stats()
	if st.Intake != 2 || st.Sched != 1 || st.Dropped != 1 || st.BusyIntake != 1 || st.BusyTenant != 1 {
		t.Errorf("Stats() = %+v, want intake 2, sched 1, dropped 1, busy 1 and 1", st)
	}
	for tenant, want := range map[string]int{"a": 1, "b": 2} {
		if got, _ := s.Queued(tenant); got != want {
			t.Errorf("Queued(%s) = %d, want %d", tenant, got, want)
		}
	}
	if got := s.Load(); got != 1 {
		t.Errorf("Load() = %v with the intake full, want 1", got)
	}
}

// busy returns a scheduler whose workers are all held, each by a job of
// tenant, and a func that releases the held job of one worker at a time.
func busy(t *testing.T, opts Options, tenant string) (*Scheduler, func()) {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.Close(ctx)
	})
	var mu sync.Mutex
	var log []string
	var held []*recJob
	for i := range opts.Workers {
		j := newJob(fmt.Sprintf("holder%d", i), &log, &mu)
		j.hold = make(chan struct{})
		if err := s.Submit(tenant, 1, j); err != nil {
			t.Fatal(err)
		}
		held = append(held, j)
	}
	t.Cleanup(func() { // before Close: it need not wait for its deadline
		for _, j := range held {
			close(j.hold)
		}
	})
	for _, j := range held {
		if !startedWithin(j, 10*time.Second) {
			t.Fatalf("%s did not start on an idle worker", j.name)
		}
	}
	return s, func() {
		close(held[0].hold)
		held = held[1:]
	}
}

// TestMaxQueueCountsEveryWaitingJob holds every worker and fills the heavy
// tenant's share: its MaxQueue counts its jobs wherever they wait, in its
// queue or dispatched ahead of the workers, and so do Queued and Load,
// which drive the gateway's shedding. The light tenant is still accepted.
func TestMaxQueueCountsEveryWaitingJob(t *testing.T) {
	for _, schedCap := range []int{0, 512} {
		t.Run(fmt.Sprintf("SchedCap %d", schedCap), func(t *testing.T) {
			s, _ := busy(t, Options{
				Tenants:   []Tenant{{"heavy", 1, 4}, {"light", 1, 4}},
				Workers:   3,
				IntakeCap: 512,
				SchedCap:  schedCap,
			}, "heavy")
			var mu sync.Mutex
			var log []string
			for i := range 4 {
				if err := s.Submit("heavy", 1, newJob(fmt.Sprint("h", i), &log, &mu)); err != nil {
					t.Fatalf("Submit(heavy) #%d = %v, want nil", i+1, err)
				}
			}
			if err := s.Submit("heavy", 1, newJob("h4", &log, &mu)); !errors.Is(err, ErrTenantBusy) {
				t.Fatalf("Submit(heavy) with 4 jobs waiting, MaxQueue 4 = %v, want ErrTenantBusy", err)
			}
			if err := s.Submit("light", 1, newJob("l0", &log, &mu)); err != nil {
				t.Fatalf("Submit(light) beside the full heavy tenant = %v, want nil", err)
			}
			if got, share := s.Queued("heavy"); got != 4 || share != 256 {
				t.Errorf("Queued(heavy) = %d, %d; want 4 waiting and a share of 256", got, share)
			}
			if got, want := s.Load(), 5.0/512; got != want {
				t.Errorf("Load() = %v, want %v: 5 jobs wait", got, want)
			}
			if st := s.Stats(); st.BusyTenant != 1 || st.Intake+st.Sched != 5 {
				t.Errorf("Stats() = %+v, want 1 refused for the tenant and 5 waiting", st)
			}
		})
	}
}

// TestIdleWorkersTakeABurst: jobs dispatched to idle workers wait for no
// one, so a burst as large as the idle workers is taken whatever the
// tenant's MaxQueue and the intake, and counts as no load, before the
// workers have woken to take it.
func TestIdleWorkersTakeABurst(t *testing.T) {
	s, err := New(Options{Tenants: []Tenant{{"a", 1, 1}, {"b", 1, 1}}, Workers: 4, IntakeCap: 1})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var log []string
	var jobs []*recJob
	t.Cleanup(func() {
		for _, j := range jobs {
			close(j.hold)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.Close(ctx)
	})
	// Under the lock, so that no worker takes a job between the Submits.
	s.mu.Lock()
	for i := range 4 {
		j := newJob(fmt.Sprint("a", i), &log, &mu)
		j.hold = make(chan struct{})
		jobs = append(jobs, j)
		if got := s.waitingLocked(s.flows["a"]); got != 0 {
			t.Errorf("before job %d, tenant a has %d waiting, want 0: its jobs went to idle workers", i, got)
		}
		if s.queued+s.aheadLocked() != 0 {
			t.Errorf("before job %d, %d jobs wait for a busy worker, want 0", i, s.queued+s.aheadLocked())
		}
		s.mu.Unlock()
		if err := s.Submit("a", 1, j); err != nil {
			t.Fatalf("Submit #%d with %d idle workers = %v, want nil", i+1, 4-i, err)
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	for _, j := range jobs {
		if !startedWithin(j, 10*time.Second) {
			t.Fatalf("%s did not start on an idle worker", j.name)
		}
	}
	if err := s.Submit("a", 1, newJob("a4", &log, &mu)); err != nil {
		t.Fatalf("Submit with every worker busy, nothing waiting = %v, want nil: it waits", err)
	}
	if err := s.Submit("a", 1, newJob("a5", &log, &mu)); !errors.Is(err, ErrBusy) && !errors.Is(err, ErrTenantBusy) {
		t.Fatalf("Submit with one job waiting, MaxQueue 1 = %v, want a refusal", err)
	}
}

// TestRoundRobinOrdersBacklog holds every worker at the gateway's default
// SchedCap, 0: the heavy tenant's backlog and the light tenant's jobs wait
// in their queues, and as one worker frees up the round-robin alternates
// them, rather than running them in the order they came.
func TestRoundRobinOrdersBacklog(t *testing.T) {
	s, release := busy(t, Options{
		Tenants:   []Tenant{{"heavy", 1, 64}, {"light", 1, 64}},
		Workers:   3,
		IntakeCap: 512,
	}, "heavy")
	var mu sync.Mutex
	var log []string
	var jobs []*recJob
	submit := func(name, tenant string) {
		t.Helper()
		j := newJob(name, &log, &mu)
		jobs = append(jobs, j)
		if err := s.Submit(tenant, 1, j); err != nil {
			t.Fatalf("Submit(%s) = %v, want nil", tenant, err)
		}
	}
	for i := range 6 {
		submit(fmt.Sprint("h", i), "heavy")
	}
	submit("l0", "light")
	submit("l1", "light")
	if st := s.Stats(); st.Intake != 8 || st.Sched != 0 {
		t.Errorf("Stats() with every worker busy = %+v, want 8 in the tenant queues and none in the scheduler queue", st)
	}
	// One worker runs the backlog, the others stay held: the order is
	// the round-robin's.
	release()
	for _, j := range jobs {
		awaitLeft(t, j)
	}
	mu.Lock()
	defer mu.Unlock()
	if got, want := strings.Join(log, " "), "h0 l0 h1 l1 h2 h3 h4 h5"; got != want {
		t.Errorf("run order = %q, want %q: light's jobs alternate with heavy's backlog", got, want)
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

// TestStress submits from many goroutines, with random tenants, costs,
// run times and reserved workers, while Close races them. Every accepted job must leave exactly
// once, nothing may deadlock, and no goroutine may be left (goleak).
func TestStress(t *testing.T) {
	var reservedJobs atomic.Int64 // over all rounds: the reserved path must be raced too
	t.Cleanup(func() {
		if reservedJobs.Load() == 0 {
			t.Error("no round handed a job to a reserved worker: the stress misses that path")
		}
	})
	for round := range 20 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(round), 19))
			tenants := []Tenant{{"a", 1 + rng.IntN(3), 1 + rng.IntN(8)}, {"b", 1, 1 + rng.IntN(8)}, {"c", 2, 4}}
			s, err := New(Options{Tenants: tenants, Workers: 1 + rng.IntN(4), IntakeCap: 1 + rng.IntN(16), SchedCap: rng.IntN(4), Reserved: rng.IntN(3)})
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
			reservedJobs.Add(s.Stats().Reserved)
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

// awaitLeft waits for j to leave the scheduler, failing the test after
// 10 s rather than hanging it.
func awaitLeft(t *testing.T, j *recJob) {
	t.Helper()
	select {
	case <-j.ran:
	case <-time.After(10 * time.Second):
		t.Fatalf("job %s never left", j.name)
	}
}

// startedWithin reports whether j's Run begins within d.
func startedWithin(j *recJob, d time.Duration) bool {
	select {
	case <-j.started:
		return true
	case <-time.After(d):
		return false
	}
}

// TestReservedWorker holds the one regular worker with tenant a's job.
// b, with nothing running or waiting, starts at once on a reserved
// worker; b's second job waits in the scheduler queue, though a reserved
// worker is free, since b has a job running; c starts on the other
// reserved worker; d, arriving with both busy, displaces the oldest job
// of the scheduler queue as without a reserve.
func TestReservedWorker(t *testing.T) {
	s, release := blocked(t, Options{
		Tenants:   []Tenant{{"a", 1, 10}, {"b", 1, 10}, {"c", 1, 10}, {"d", 1, 10}},
		Workers:   1,
		Reserved:  2,
		IntakeCap: 100,
		SchedCap:  1,
	})
	var mu sync.Mutex
	var log []string
	submit := func(tenant string, hold bool) *recJob {
		t.Helper()
		j := newJob(tenant, &log, &mu)
		if hold {
			j.hold = make(chan struct{})
		}
		if err := s.Submit(tenant, 1, j); err != nil {
			t.Fatalf("Submit(%s) = %v, want nil", tenant, err)
		}
		return j
	}
	b1 := submit("b", true)
	if !startedWithin(b1, 10*time.Second) {
		t.Fatal("b's first job did not start while the regular worker was held: want it on a reserved worker")
	}
	b2 := submit("b", false)
	// Submit hands a job to a reserved worker before it returns.
	if st := s.Stats(); st.Reserved != 1 || st.Sched != 1 {
		t.Fatalf("Stats() after b's second job = %+v, want it in the scheduler queue and 1 reserved: b has a job running", st)
	}
	c1 := submit("c", true)
	if !startedWithin(c1, 10*time.Second) {
		t.Fatal("c's job did not start with a reserved worker free: want it on that worker")
	}
	if st := s.Stats(); st.Reserved != 2 || st.Sched != 1 || st.Intake != 0 {
		t.Errorf("Stats() = %+v, want 2 reserved, 1 in the scheduler queue, none in the intake", st)
	}
	d1 := submit("d", false)
	awaitLeft(t, b2)
	if r, _ := b2.reason.Load().(error); !errors.Is(r, ErrDropped) {
		t.Errorf("b2 left with %v, want ErrDropped: with the reserve busy, d displaces it", r)
	}
	close(b1.hold)
	close(c1.hold)
	release()
	for _, j := range []*recJob{b1, c1, d1} {
		awaitLeft(t, j)
		if r, _ := j.reason.Load().(error); r != nil {
			t.Errorf("%s left with %v, want it run", j.name, r)
		}
	}
	if st := s.Stats(); st.Reserved != 2 || st.Spawned != 3 || st.ReserveFull != 1 {
		t.Errorf("Stats() = %+v, want 2 reserved, 3 workers spawned and d's job counted as finding the reserve full", st)
	}
}

// TestReserveWaitsForIdleWorker: with a regular worker idle, a tenant
// with nothing running goes to it, not to the reserved worker.
func TestReserveWaitsForIdleWorker(t *testing.T) {
	s, release := blocked(t, Options{
		Tenants:   []Tenant{{"a", 1, 10}, {"b", 1, 10}},
		Workers:   2,
		Reserved:  1,
		IntakeCap: 100,
		SchedCap:  1,
	})
	defer release()
	var mu sync.Mutex
	var log []string
	b1 := newJob("b1", &log, &mu)
	b1.hold = make(chan struct{})
	defer close(b1.hold)
	if err := s.Submit("b", 1, b1); err != nil {
		t.Fatal(err)
	}
	if !startedWithin(b1, 10*time.Second) {
		t.Fatal("b's job did not start with a regular worker idle")
	}
	if st := s.Stats(); st.Reserved != 0 {
		t.Errorf("Stats().Reserved = %d with a regular worker idle, want 0", st.Reserved)
	}
}

// TestCloseAbortsReservedJob: a job that runs on a reserved worker at the
// deadline is aborted and counted, like one on a regular worker.
func TestCloseAbortsReservedJob(t *testing.T) {
	s, err := New(Options{Tenants: []Tenant{{"a", 1, 10}, {"b", 1, 10}}, Workers: 1, Reserved: 1, IntakeCap: 10, SchedCap: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after a failure: a second Close only waits
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.Close(ctx)
	})
	var mu sync.Mutex
	var log []string
	var jobs []*recJob
	for _, tenant := range []string{"a", "b"} {
		j := newJob(tenant, &log, &mu)
		j.hold = make(chan struct{}) // never released: only the abort ends them
		jobs = append(jobs, j)
		if err := s.Submit(tenant, 1, j); err != nil {
			t.Fatal(err)
		}
		if !startedWithin(j, 10*time.Second) {
			t.Fatalf("%s's job did not start: want a's on the regular worker, b's on the reserved one", tenant)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if got := s.Close(ctx); got != 2 {
		t.Errorf("Close aborted %d jobs, want 2: the regular and the reserved one", got)
	}
	for _, j := range jobs {
		awaitLeft(t, j)
		if n := j.left.Load(); n != 1 {
			t.Errorf("job %s left %d times, want once", j.name, n)
		}
	}
	if st := s.Stats(); st.Aborted != 2 || st.Reserved != 1 || st.CanceledOnClose != 0 {
		t.Errorf("Stats() = %+v, want 2 aborted, 1 reserved, none cancelled", st)
	}
}
