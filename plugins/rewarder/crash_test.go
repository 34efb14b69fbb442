package main

import (
	"fmt"
	"testing"

	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/store/storetest"
)

// TestCrash runs the store's crash suite against the rewarder's layout:
// group i seals epoch e-I (inputs and record) and, for odd i, stores
// epoch e-(I-1) as computed with its outbox of two parts, as
// computeEpoch does, so that copies taken at random moments hold a
// prefix of the groups with records, sealed inputs and outboxes
// consistent with each other.
func TestCrash(t *testing.T) {
	storetest.Crash(t, storeOpts, 8,
		func(tx *store.Tx, i int) error {
			id := fmt.Sprintf("e-%d", i)
			canonical, h := seal(id, Inputs{PoolAccount: "pool", PoolAmount: uint64(10 + i), Contributions: []Contribution{{"a", 1}, {"b", 1}}})
			if err := tx.Put(bucketInputs, []byte(id), canonical); err != nil {
				return err
			}
			if err := putEpoch(tx, epoch{Epoch: id, State: stateQueued, InputsHash: h, PoolAccount: "pool", PoolAmount: uint64(10 + i)}); err != nil {
				return err
			}
			if i%2 == 0 {
				return nil
			}
			prev := fmt.Sprintf("e-%d", i-1)
			e, _, err := getEpoch(tx, prev)
			if err != nil {
				return err
			}
			for p := range 2 {
				if err := putPart(tx, prev, p, part{Key: idemKey(prev, 0, p), Legs: []Leg{{"a", 1}}}); err != nil {
					return err
				}
			}
			e.State, e.Settlement.Parts = stateComputed, 2
			return putEpoch(tx, e)
		},
		func(s *store.Snapshot, acked int) error {
			n := 0
			s.Ascend(bucketEpochs, nil, nil, func(_, _ []byte) bool { n++; return true })
			if n != acked && n != acked+1 {
				return fmt.Errorf("%d epochs, want %d acknowledged (or one more, committing)", n, acked)
			}
			for i := range n {
				id := fmt.Sprintf("e-%d", i)
				e, ok, err := getEpoch(s, id)
				if err != nil || !ok {
					return fmt.Errorf("epoch %s: %v, found %v", id, err, ok)
				}
				if _, err := getInputs(s, id, e.InputsHash); err != nil {
					return err
				}
				computed := i+1 < n && i%2 == 0
				if computed != (e.State == stateComputed) {
					return fmt.Errorf("epoch %s is %s with %d epochs stored", id, e.State, n)
				}
				for p := range e.Settlement.Parts {
					if pt, err := getPart(s, id, p); err != nil || pt.Key != idemKey(id, 0, p) {
						return fmt.Errorf("epoch %s part %d: %+v, %v", id, p, pt, err)
					}
				}
			}
			return nil
		})
}
