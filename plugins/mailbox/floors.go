package main

import "sync"

// maxFloors bounds the topics floors remembers; past it, it forgets them
// all, and receives scan from their topics' first keys until they learn
// them again.
const maxFloors = 1 << 16

// floors remembers, per topic, a time (unix ms) below which the topic
// has no key in the visibility index, so that a receive seeks there
// instead of from the topic's first key. A receive deletes the index
// keys it takes and writes them again later in the index, so the head of
// a busy topic is a run of deleted keys until the store's next
// checkpoint; seeking from the first key, every receive would step over
// all of them.
//
// Only the committer's groups use it, one at a time. A topic it does not
// know is scanned from its first key. Every write of an index key lowers
// the topic's floor to the key's time (lower); a receive that has taken
// every key below a time raises it there (raise). A group that fails
// leaves its writes out of the store but not out of floors: the
// committer's Apply calls forget then, and the floors are learnt again.
type floors struct {
	mu sync.Mutex
	at map[string]int64
}

// get returns topic's floor, and whether there is one.
func (f *floors) get(topic string) (int64, bool) {
	if f == nil {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.at[topic]
	return at, ok
}

// lower records a key of topic at time at.
func (f *floors) lower(topic string, at int64) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur, ok := f.at[topic]; ok && at < cur {
		f.at[topic] = at
	}
}

// raise records that topic has no key below at.
func (f *floors) raise(topic string, at int64) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.at[topic]; !ok && len(f.at) >= maxFloors || f.at == nil {
		f.at = make(map[string]int64)
	}
	f.at[topic] = at
}

// forget forgets every floor.
func (f *floors) forget() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.at = nil
}
