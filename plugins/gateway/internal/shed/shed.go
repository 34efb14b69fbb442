// Package shed is the gateway's graded load shedding, after Envoy's
// overload manager: from the load of its queues it keeps a level, and the
// level says which requests to refuse.
//
//	Level 0: nothing is shed.
//	Level 1 (load ≥ 0.5): writes of tenants over their fair share.
//	Level 2 (load ≥ 0.75): every write.
//	Level 3 (load ≥ 0.9): reads too.
//
// The level rises as soon as the load reaches a threshold. It falls one
// step at a time, and only once the load has stayed below the step's
// threshold minus the hysteresis margin for Hold: a load that hovers at a
// threshold does not make it flap. Exempt traffic is never the shedder's
// business; the caller does not ask.
//
// It keeps no goroutine: Update is called with each request's load, and
// by the health check. It must not block.
package shed

import (
	"fmt"
	"sync"
	"time"
)

// Levels.
const (
	None = iota
	OverShareWrites
	Writes
	All
)

// enter is the load at which each level starts; enter[0] is unused.
var enter = [...]float64{0, 0.5, 0.75, 0.9}

// Margin is how far below a level's threshold the load must stay to
// leave it.
const Margin = 0.25

// Shedder keeps the level. The zero Shedder is not usable; use New.
type Shedder struct {
	hold time.Duration

	mu         sync.Mutex
	level      int
	belowSince time.Time // when the load went below the current level's exit, or zero
}

// New returns a Shedder at level None that steps down after hold.
func New(hold time.Duration) *Shedder { return &Shedder{hold: hold} }

// Update records load (0 to 1) at now and returns the level.
func (s *Shedder) Update(now time.Time, load float64) int {
	target := None
	for l := All; l > None; l-- {
		if load >= enter[l] {
			target = l
			break
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case target >= s.level:
		if target > s.level {
			s.level = target
		}
		s.belowSince = time.Time{}
	case load >= enter[s.level]-Margin:
		s.belowSince = time.Time{}
	case s.belowSince.IsZero():
		s.belowSince = now
	case now.Sub(s.belowSince) >= s.hold:
		s.level--
		s.belowSince = now // the next step down needs its own hold
		if s.level > None && load >= enter[s.level]-Margin {
			s.belowSince = time.Time{}
		}
	}
	return s.level
}

// Level returns the level without recording a load.
func (s *Shedder) Level() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.level
}

// Shed reports whether a request is refused at level: write says it
// changes state, overShare that its tenant holds more than its fair
// share of the queues.
func Shed(level int, write, overShare bool) bool {
	switch level {
	case OverShareWrites:
		return write && overShare
	case Writes:
		return write
	case All:
		return true
	}
	return false
}

// Describe says what level sheds, for health reasons and logs.
func Describe(level int) string {
	switch level {
	case OverShareWrites:
		return "shedding writes of tenants over their share"
	case Writes:
		return "shedding all writes"
	case All:
		return "shedding all requests but exempt routes"
	}
	return fmt.Sprintf("level %d", level)
}
