package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/plughost/plughost/sdk/store"
)

// pruneBatch is the most epochs one prune op removes: an epoch of
// 200,000 recipients has about 200 outbox parts, so an op deletes a few
// thousand keys at most, and the group it commits in stays small.
const pruneBatch = 16

// prune removes what the settled epochs past retention no longer need:
// their artifacts, then, in one op through the committer per pruneBatch
// epochs, their sealed inputs and outbox, and their place in the settled
// index. Each record stays, marked pruned, so that a repeated compute
// answers the settled manifest and never pays again. The artifacts go
// first: a crash between the two leaves the epoch in the index, and the
// next pass finishes it.
func (r *running) prune(ctx context.Context) {
	if r.s.retention == 0 {
		return
	}
	cut := settledKey(r.now().Add(-r.s.retention), "")
	for !r.stopping() && ctx.Err() == nil {
		var due []string
		err := r.db.View(func(s *store.Snapshot) error {
			s.Ascend(bucketSettled, nil, cut, func(_, v []byte) bool {
				due = append(due, string(v))
				return len(due) < pruneBatch
			})
			return nil
		})
		if err != nil {
			r.log.Error("read the settled index", "error", err)
			return
		}
		var gone []string
		for _, id := range due {
			if err := os.RemoveAll(filepath.Join(r.s.artifactDir, id)); err != nil {
				r.log.Error("remove a pruned epoch's artifacts", "epoch", id, "error", err)
				continue
			}
			gone = append(gone, id)
		}
		if len(gone) == 0 {
			return
		}
		pruned := 0
		err = r.commit(ctx, func(tx *store.Tx) error {
			pruned = 0
			for _, id := range gone {
				e, ok, err := getEpoch(tx, id)
				if err != nil {
					return err
				}
				if !ok || e.State != stateSettled || e.Pruned || e.SettledAt == nil {
					continue
				}
				if err := tx.Delete(bucketInputs, []byte(id)); err != nil {
					return err
				}
				if err := tx.DeleteRange(bucketOutbox, partKey(id, 0), partKey(id, e.Settlement.Parts)); err != nil {
					return err
				}
				e.Pruned = true
				if err := putEpoch(tx, e); err != nil {
					return err
				}
				pruned++
			}
			return nil
		})
		if err != nil {
			r.log.Error("prune settled epochs", "epochs", len(gone), "error", err)
			return
		}
		r.m.pruned.Add(float64(pruned))
		if len(due) < pruneBatch || len(gone) < len(due) {
			return
		}
	}
}
