package dataplane

import (
	"context"
	"io"
	"sync/atomic"
	"time"
)

// A reader is one goroutine's turn at reading the connection. Handing each
// request to a worker goroutine cost the plugin a wake-up of another
// goroutine, and often of another thread, per request: most of its CPU
// per request. So a reader runs an ordinary request whose body has
// arrived whole in its own goroutine, and only a streaming request, or one
// whose body is still arriving, goes to a worker. A handler that runs in
// the reader must not hold up the other requests on the connection: when
// the watchdog finds it running for a whole tick (watchEvery), or it waits
// for credit that only a Window frame read from the connection can bring,
// the reader hands the reading to a new goroutine, which starts a reader
// of its own; once the handler returns, the goroutine that ran it serves
// as a worker.
type reader struct {
	state atomic.Int32
	// handOff starts a new reader if this one is running a handler and
	// has not handed the reading on yet. Safe to call from any
	// goroutine, any number of times.
	handOff func()
}

// The states of a reader.
const (
	reading int32 = iota // receiving frames
	running              // running a handler, still the connection's reader
	handed               // running a handler; another goroutine reads now
)

// read receives frames and dispatches them until the connection ends, and
// returns its error (nil for a clean close), or until it hands the reading
// on while it runs a handler, and then returns passed once the handler is
// done.
func (s *server) read(ctx context.Context) (passed bool, err error) {
	rd := &reader{}
	rd.handOff = func() {
		if rd.state.CompareAndSwap(running, handed) {
			s.workers.Go(func() { s.readOn(ctx) })
		}
	}
	for {
		if !s.c.Ready() {
			s.flushHeld()
		}
		f, err := s.c.Recv()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		c, err := s.dispatch(ctx, f)
		if err != nil {
			return false, err
		}
		if c == nil {
			continue
		}
		if c.streaming || c.body != nil {
			s.hand(c)
			continue
		}
		c.reader, c.hold = rd, s.c.Ready()
		rd.state.Store(running)
		s.inline.Store(rd)
		s.runs.Add(1)
		if s.watchParked.Load() && s.watchParked.CompareAndSwap(true, false) {
			select {
			case s.watchWake <- struct{}{}:
			default: // a wake-up is pending already
			}
		}
		s.handle(c)
		s.inline.CompareAndSwap(rd, nil)
		if !rd.state.CompareAndSwap(running, reading) {
			// The reader now reading may be waiting for the socket.
			s.flushHeld()
			return true, nil
		}
	}
}

// readOn is a goroutine a reader handed the reading to: it reads until the
// connection ends, and then reports why to Serve, or until it hands the
// reading on in turn, and then serves as a worker.
func (s *server) readOn(ctx context.Context) {
	passed, err := s.read(ctx)
	if !passed {
		s.readErr <- err
		return
	}
	s.worker(nil)
}

// watchEvery is the watchdog's tick: a handler running in the reader holds
// up the other requests on its connection for one to two ticks at most.
// A timer per request instead would cost a wake-up of the thread waiting
// in the network poller each time it is set.
const watchEvery = time.Millisecond

// watchIdle is how many ticks without a handler run in the reader the
// watchdog waits before it parks until the next one.
const watchIdle = 200

// watch is the connection's watchdog: each tick it hands the reading on
// from a reader that has run the same handler since the tick before. It
// returns when ctx ends.
func (s *server) watch(ctx context.Context) {
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	var (
		last     *reader
		lastRuns uint64
		idle     int
	)
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		rd, runs := s.inline.Load(), s.runs.Load()
		if rd != nil && rd == last && runs == lastRuns {
			rd.handOff()
		}
		if runs != lastRuns || rd != nil {
			idle = 0
		} else if idle++; idle >= watchIdle {
			// Park; a reader that starts a handler after the flag is
			// set either moves runs, seen here, or wakes the watchdog.
			s.watchParked.Store(true)
			if s.runs.Load() == runs {
				select {
				case <-s.watchWake:
				case <-ctx.Done():
					return
				}
				tick.Reset(watchEvery)
			}
			s.watchParked.Store(false)
			idle = 0
		}
		last, lastRuns = rd, runs
	}
}
