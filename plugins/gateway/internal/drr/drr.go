// Package drr is the gateway's fair scheduler: one bounded queue per
// tenant, a deficit round-robin that moves their jobs, in fair order, to a
// scheduler queue as workers become idle, and a pool of workers that run
// the jobs from it. A job waits in its tenant's queue until a worker is
// free to take it, so the round-robin, not the order of arrival, decides
// which tenant's job runs next. Options.SchedCap lets up to that many jobs
// more be dispatched ahead of busy workers; they wait there in the order
// they were dispatched.
// A few reserved workers (Options.Reserved) run only the job of a tenant
// with nothing running and nothing waiting, when no regular worker is idle:
// that job skips the queues and starts at once, so a light tenant does not
// wait one service time behind a heavy tenant's running jobs. These are
// akin to the seats that Kubernetes' API Priority and Fairness guarantees
// each priority level.
//
// The lifecycle is New → Submit (from any goroutine) → Close. There is no
// scheduler goroutine: Submit and the workers move jobs under one mutex, so
// a job is dispatched as soon as a worker is idle (or the scheduler queue
// has room beyond the idle workers' jobs). A job waits until a worker
// takes it, in its tenant's queue or in the scheduler queue, and the
// bounds count it wherever it waits. Each bound has a named overflow
// policy:
//
//   - intake (the jobs waiting, of all tenants, Options.IntakeCap): Submit
//     fails with ErrBusy;
//   - one tenant's waiting jobs (Tenant.MaxQueue): Submit fails with
//     ErrTenantBusy for that tenant only;
//   - the scheduler queue (Options.SchedCap, beyond the jobs the idle
//     workers will take): when it is full and a tenant with nothing in it
//     submits, the tenant's job goes in and the oldest job there is
//     dropped: its Cancel gets ErrDropped. With SchedCap 0 nothing waits
//     there for a busy worker, and nothing is dropped.
//
// Every job leaves exactly once: Run on a worker (regular or reserved), or
// Cancel. The package
// must not block a submitter, hold its mutex while a job runs or is
// cancelled, or leave a goroutine running after Close returns.
package drr

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Errors of Submit, and the reasons a Job's Cancel is given.
var (
	// ErrBusy means IntakeCap jobs wait, in the tenant queues and the
	// scheduler queue together.
	ErrBusy = errors.New("drr: intake full")
	// ErrTenantBusy means MaxQueue of the tenant's jobs wait, in its
	// queue and in the scheduler queue together.
	ErrTenantBusy = errors.New("drr: tenant queue full")
	// ErrDropped is given to the oldest job of a full scheduler queue
	// when another tenant's job displaces it.
	ErrDropped = errors.New("drr: dropped from the full scheduler queue")
	// ErrClosed is returned by Submit after Close began, and given to the
	// jobs still queued then.
	ErrClosed = errors.New("drr: closed")
	// ErrUnknownTenant is returned by Submit for a tenant not in Options.
	ErrUnknownTenant = errors.New("drr: unknown tenant")
)

// Job is one unit of work.
type Job interface {
	// Run runs the job on a worker. ctx is cancelled when Close gives
	// up waiting for the workers; Run must return soon after.
	Run(ctx context.Context)
	// Cancel is called instead of Run when the job leaves a queue
	// without running, with the reason. It must not block.
	Cancel(err error)
}

// Tenant is one tenant's share.
type Tenant struct {
	Name string
	// Quantum is the cost the tenant may dispatch per round, at least 1.
	Quantum int
	// MaxQueue is how many of its jobs may wait, in its queue and in the
	// scheduler queue together, at least 1.
	MaxQueue int
}

// Options configures a Scheduler.
type Options struct {
	Tenants   []Tenant
	Workers   int // at least 1
	IntakeCap int // jobs waiting, of all tenants, at least 1
	// SchedCap is how many jobs may be dispatched ahead of busy workers,
	// besides the jobs the idle workers will take, at least 0. With 0 a
	// job leaves its tenant's queue only when a worker is idle to take
	// it, so the round-robin orders every waiting job.
	SchedCap int
	// Reserved is how many workers, besides Workers, run only a job of a
	// tenant that has nothing running, in the scheduler queue or in its
	// own queue, when no regular worker is idle. 0 turns them off.
	Reserved int
}

// Stats are the scheduler's counters and gauges, read atomically.
type Stats struct {
	Intake, Sched          int64 // jobs waiting in the tenant queues, and in the scheduler queue
	Dropped                int64 // jobs dropped from the scheduler queue
	Spawned                int64 // worker goroutines started, regular and reserved
	Reserved               int64 // jobs handed to a reserved worker
	ReserveFull            int64 // jobs queued that a free reserved worker would have started
	Aborted                int64 // jobs running when Close gave up waiting
	CanceledOnClose        int64 // jobs still queued when Close began
	BusyIntake, BusyTenant int64 // Submits refused with ErrBusy and ErrTenantBusy
}

// Scheduler schedules jobs. Call Close once.
type Scheduler struct {
	mu       sync.Mutex
	cond     *sync.Cond // signalled when ring gains a job or closed is set
	rcond    *sync.Cond // signalled when seats gains a job or closed is set
	flows    map[string]*flow
	active   []*flow // flows with queued jobs, in round-robin order
	cur      int     // index in active of the flow whose turn it is
	queued   int     // jobs in all flows
	ring     deque   // the scheduler queue: jobs for the idle workers, then up to schedCap more
	idle     int     // regular workers not running a job
	seats    deque   // jobs handed to a reserved worker, not yet taken
	free     int     // reserved workers neither running a job nor handed one
	closed   bool
	intake   int
	schedCap int

	wg      sync.WaitGroup
	abort   context.CancelFunc
	abortCx context.Context
	running atomic.Int64

	intakeDepth, schedDepth, waiting    atomic.Int64
	dropped, spawned, aborted, canceled atomic.Int64
	busyIntake, busyTenant, reserved    atomic.Int64
	reserveFull                         atomic.Int64
	reserveCap                          int
}

// flow is one tenant's queue and its DRR state.
type flow struct {
	Tenant
	q       deque
	deficit int
	turn    bool // its quantum was added for the current visit
	inRing  int  // its jobs in the scheduler queue
	running int  // its jobs taken by a worker (or handed to one) and not yet returned
}

// item is a queued job.
type item struct {
	job  Job
	cost int
	flow *flow
}

// New starts the workers. It fails on an invalid Options.
func New(opts Options) (*Scheduler, error) {
	if opts.Workers < 1 || opts.IntakeCap < 1 || opts.SchedCap < 0 || opts.Reserved < 0 {
		return nil, fmt.Errorf("drr: workers and intake capacity must be at least 1, scheduler capacity and reserved workers at least 0, got %d, %d, %d, %d",
			opts.Workers, opts.IntakeCap, opts.SchedCap, opts.Reserved)
	}
	s := &Scheduler{flows: map[string]*flow{}, intake: opts.IntakeCap, schedCap: opts.SchedCap, idle: opts.Workers, free: opts.Reserved, reserveCap: opts.Reserved}
	for _, t := range opts.Tenants {
		if t.Quantum < 1 || t.MaxQueue < 1 {
			return nil, fmt.Errorf("drr: tenant %q: quantum and max queue must be at least 1", t.Name)
		}
		if s.flows[t.Name] != nil {
			return nil, fmt.Errorf("drr: tenant %q twice", t.Name)
		}
		s.flows[t.Name] = &flow{Tenant: t}
	}
	s.cond = sync.NewCond(&s.mu)
	s.rcond = sync.NewCond(&s.mu)
	s.abortCx, s.abort = context.WithCancel(context.Background())
	for range opts.Workers {
		s.wg.Add(1)
		s.spawned.Add(1)
		go s.work(s.take)
	}
	for range opts.Reserved {
		s.wg.Add(1)
		s.spawned.Add(1)
		go s.work(s.takeSeat)
	}
	return s, nil
}

// Submit queues job for tenant at cost (at least 1), or hands it to a
// reserved worker. It never blocks; it fails with ErrBusy, ErrTenantBusy,
// ErrClosed or ErrUnknownTenant, and then the job is not the scheduler's.
func (s *Scheduler) Submit(tenant string, cost int, job Job) error {
	cost = max(cost, 1)
	s.mu.Lock()
	f := s.flows[tenant]
	// quiet says the tenant has nothing running or waiting, and every
	// regular worker is busy or has a job of the ring to take.
	quiet := f != nil && f.running == 0 && f.inRing == 0 && f.q.len() == 0 && s.ring.len() >= s.idle
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case f == nil:
		s.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownTenant, tenant)
	case quiet && s.free > 0:
		// Rather than wait for a regular worker, the job starts on a
		// reserved worker. It never waits in a queue, so no queue bound
		// applies to it.
		s.free--
		f.running++
		s.seats.push(item{job: job, cost: cost, flow: f})
		s.rcond.Signal()
		s.mu.Unlock()
		s.reserved.Add(1)
		return nil
	case s.queued+s.aheadLocked() >= s.intake:
		s.mu.Unlock()
		s.busyIntake.Add(1)
		return ErrBusy
	case s.waitingLocked(f) >= f.MaxQueue:
		s.mu.Unlock()
		s.busyTenant.Add(1)
		return ErrTenantBusy
	}
	if quiet && s.reserveCap > 0 {
		s.reserveFull.Add(1)
	}
	f.q.push(item{job: job, cost: cost, flow: f})
	s.queued++
	if f.q.len() == 1 {
		s.active = append(s.active, f)
	}
	var dropped *item
	if s.schedCap > 0 && s.ring.len() >= s.idle+s.schedCap && f.inRing == 0 {
		// A tenant with nothing dispatched displaces the oldest job
		// dispatched ahead of the workers, rather than wait behind a
		// full queue of other tenants' jobs.
		old := s.ring.pop()
		old.flow.inRing--
		dropped = &old
		s.moveLocked(f, f.q.pop())
	}
	s.pumpLocked()
	s.publishLocked()
	s.mu.Unlock()
	if dropped != nil {
		s.dropped.Add(1)
		dropped.job.Cancel(ErrDropped)
	}
	return nil
}

// aheadLocked is how many jobs of the scheduler queue wait for a busy
// worker: those beyond the ones the idle workers are about to take, which
// do not wait and count against no bound.
func (s *Scheduler) aheadLocked() int { return max(0, s.ring.len()-s.idle) }

// waitingLocked is how many of f's jobs wait: those in its queue, and
// those of the scheduler queue that wait for a busy worker, of which at
// most aheadLocked are f's.
func (s *Scheduler) waitingLocked(f *flow) int { return f.q.len() + min(f.inRing, s.aheadLocked()) }

// moveLocked moves it, just taken from f's queue, to the scheduler queue.
func (s *Scheduler) moveLocked(f *flow, it item) {
	f.deficit -= it.cost
	s.queued--
	if f.q.len() == 0 {
		s.removeActiveLocked(f)
	}
	f.inRing++
	s.ring.push(it)
	s.cond.Signal()
}

// removeActiveLocked takes f, whose queue is empty, out of the round.
func (s *Scheduler) removeActiveLocked(f *flow) {
	for i, a := range s.active {
		if a != f {
			continue
		}
		s.active = append(s.active[:i], s.active[i+1:]...)
		if i < s.cur {
			s.cur--
		}
		if s.cur >= len(s.active) {
			s.cur = 0
		}
		f.deficit, f.turn = 0, false
		return
	}
}

// pumpLocked dispatches in deficit round-robin order while the scheduler
// queue holds fewer jobs than the idle workers will take plus schedCap.
func (s *Scheduler) pumpLocked() {
	for s.queued > 0 && s.ring.len() < s.idle+s.schedCap {
		f := s.active[s.cur]
		if !f.turn {
			f.deficit += f.Quantum
			f.turn = true
		}
		if head := f.q.front(); head.cost <= f.deficit {
			s.moveLocked(f, f.q.pop())
			continue
		}
		f.turn = false
		s.cur = (s.cur + 1) % len(s.active)
	}
}

// publishLocked updates the depth gauges.
func (s *Scheduler) publishLocked() {
	s.intakeDepth.Store(int64(s.queued))
	s.schedDepth.Store(int64(s.ring.len()))
	s.waiting.Store(int64(s.queued + s.aheadLocked()))
}

// take is a regular worker's: it accounts for prev, the job it ran
// last (nil at first), and waits for the next job of the scheduler queue;
// false once closed.
func (s *Scheduler) take(prev *flow) (item, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev != nil {
		prev.running--
		s.idle++
		// The worker is free: the round-robin chooses its next job.
		s.pumpLocked()
	}
	for s.ring.len() == 0 && !s.closed {
		s.cond.Wait()
	}
	if s.closed {
		return item{}, false
	}
	it := s.ring.pop()
	it.flow.inRing--
	it.flow.running++
	s.idle--
	s.running.Add(1) // under mu, so that a Close that follows counts it
	s.publishLocked()
	return it, true
}

// takeSeat is a reserved worker's take: it waits for a job handed to
// the reserved workers by Submit.
func (s *Scheduler) takeSeat(prev *flow) (item, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev != nil {
		prev.running--
		s.free++
	}
	for s.seats.len() == 0 && !s.closed {
		s.rcond.Wait()
	}
	if s.closed {
		return item{}, false
	}
	s.running.Add(1)
	return s.seats.pop(), true
}

// work is one worker, regular or reserved by its take: it runs jobs until
// the scheduler closes.
func (s *Scheduler) work(take func(prev *flow) (item, bool)) {
	defer s.wg.Done()
	var prev *flow
	for {
		it, ok := take(prev)
		if !ok {
			return
		}
		it.job.Run(s.abortCx) // take counted it in running
		s.running.Add(-1)
		prev = it.flow
	}
}

// Close stops dispatching, cancels every queued job with ErrClosed, and
// waits for the running jobs until ctx is done; then it cancels their
// context, counts them as aborted, and waits for them to return. It
// returns how many were aborted. A second Close only waits for the
// workers to be gone.
func (s *Scheduler) Close(ctx context.Context) (aborted int) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait() // the first Close bounds it
		return 0
	}
	s.closed = true
	var left []item
	for s.ring.len() > 0 {
		left = append(left, s.ring.pop())
	}
	for s.seats.len() > 0 {
		left = append(left, s.seats.pop())
	}
	for _, f := range s.active {
		for f.q.len() > 0 {
			left = append(left, f.q.pop())
		}
		f.deficit, f.turn, f.inRing = 0, false, 0
	}
	s.active, s.queued, s.cur = nil, 0, 0
	s.publishLocked()
	s.cond.Broadcast()
	s.rcond.Broadcast()
	s.mu.Unlock()
	s.canceled.Add(int64(len(left)))
	for _, it := range left {
		it.job.Cancel(ErrClosed)
	}

	done := make(chan struct{})
	go func() { // owned: Close waits for it below, on both paths
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		aborted = int(s.running.Load())
		s.aborted.Add(int64(aborted))
		s.abort()
		<-done
	}
	s.abort()
	return aborted
}

// Queued returns how many of tenant's jobs wait, in its queue and in the
// scheduler queue, and the fair share of the intake: IntakeCap over the
// number of tenants.
func (s *Scheduler) Queued(tenant string) (queued, share int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.flows[tenant]; f != nil {
		queued = s.waitingLocked(f)
	}
	return queued, max(s.intake/max(len(s.flows), 1), 1)
}

// Load returns the share of the intake in use, from 0 to 1: the jobs
// waiting in the tenant queues and in the scheduler queue over IntakeCap.
func (s *Scheduler) Load() float64 {
	return float64(s.waiting.Load()) / float64(s.intake)
}

// Stats returns the current counters.
func (s *Scheduler) Stats() Stats {
	return Stats{
		Intake:          s.intakeDepth.Load(),
		Sched:           s.schedDepth.Load(),
		Dropped:         s.dropped.Load(),
		Spawned:         s.spawned.Load(),
		Reserved:        s.reserved.Load(),
		ReserveFull:     s.reserveFull.Load(),
		Aborted:         s.aborted.Load(),
		CanceledOnClose: s.canceled.Load(),
		BusyIntake:      s.busyIntake.Load(),
		BusyTenant:      s.busyTenant.Load(),
	}
}

// deque is a FIFO of items on a slice that reuses its space.
type deque struct {
	buf  []item
	head int
}

func (d *deque) len() int     { return len(d.buf) - d.head }
func (d *deque) front() item  { return d.buf[d.head] }
func (d *deque) push(it item) { d.buf = append(d.buf, it) }

func (d *deque) pop() item {
	it := d.buf[d.head]
	d.buf[d.head] = item{}
	d.head++
	if d.head == len(d.buf) {
		d.buf, d.head = d.buf[:0], 0
	} else if d.head > 64 && d.head*2 > len(d.buf) {
		n := copy(d.buf, d.buf[d.head:])
		clear(d.buf[n:])
		d.buf, d.head = d.buf[:n], 0
	}
	return it
}
