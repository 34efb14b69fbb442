package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// store holds the custom greetings by name. It is bounded: once it holds
// limit names, new names are refused with errFull (existing ones may still
// change). drain closes it before saving a snapshot.
type store struct {
	limit    int
	cooldown time.Duration

	mu     sync.Mutex
	byName map[string]entry
	closed bool
}

type entry struct {
	greeting string
	set      time.Time // zero for a greeting loaded from disk
}

// newStore returns a store holding saved. saved may hold more than limit
// names, if the operator lowered max_greetings: none is dropped.
func newStore(limit int, cooldown time.Duration, saved map[string]string) *store {
	s := &store{limit: limit, cooldown: cooldown, byName: make(map[string]entry, len(saved))}
	for name, greeting := range saved {
		s.byName[name] = entry{greeting: greeting}
	}
	return s
}

// get returns name's custom greeting.
func (s *store) get(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byName[name]
	return e.greeting, ok
}

// set stores greeting for name at now and reports whether name is new. It
// fails with errFull for a new name when the store is full, with a
// *cooldownError when name's greeting was set less than the cooldown ago,
// and with errClosed once the store is closed.
func (s *store) set(name, greeting string, now time.Time) (created bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, errClosed
	}
	old, ok := s.byName[name]
	switch {
	case !ok && len(s.byName) >= s.limit:
		return false, errFull
	case ok && !old.set.IsZero() && now.Sub(old.set) < s.cooldown:
		return false, &cooldownError{name: name, wait: s.cooldown - now.Sub(old.set)}
	}
	s.byName[name] = entry{greeting: greeting, set: now}
	return !ok, nil
}

// len returns how many names have a custom greeting.
func (s *store) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byName)
}

// close refuses every later set with errClosed and returns the greetings
// to save.
func (s *store) close() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	out := make(map[string]string, len(s.byName))
	for name, e := range s.byName {
		out[name] = e.greeting
	}
	return out
}

// cooldownError refuses to change a greeting set less than the cooldown
// ago.
type cooldownError struct {
	name string
	wait time.Duration // until a change is allowed
}

func (e *cooldownError) Error() string {
	return fmt.Sprintf("the greeting for %q changed less than the cooldown ago; retry in %ds", e.name, e.seconds())
}

// seconds is the wait rounded up to whole seconds, for Retry-After.
func (e *cooldownError) seconds() int {
	return max(1, int(math.Ceil(e.wait.Seconds())))
}

// load reads the greetings a previous process saved at path. A missing
// file holds none.
func load(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load greetings: %w", err)
	}
	var saved map[string]string
	if err := json.Unmarshal(b, &saved); err != nil {
		return nil, fmt.Errorf("load greetings from %s: %w", path, err)
	}
	return saved, nil
}

// save writes greetings to path through a temporary file and a rename, so
// that a crash leaves the old file or the new one, never half of one.
func save(ctx context.Context, path string, greetings map[string]string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("save greetings: %w", err)
	}
	b, err := json.Marshal(greetings)
	if err != nil {
		return fmt.Errorf("save greetings: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".greetings-*.json")
	if err != nil {
		return fmt.Errorf("save greetings: %w", err)
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	_, werr := f.Write(b)
	serr := f.Sync()
	if err := errors.Join(werr, serr, f.Close()); err != nil {
		return fmt.Errorf("save greetings: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("save greetings: %w", err)
	}
	return nil
}
