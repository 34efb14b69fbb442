package main

import (
	"context"
	"errors"
	"time"

	"github.com/plughost/plughost/sdk/store"
)

// resultsCapacity is the seed's results queue, from the compute workers
// to the artifact writer.
const resultsCapacity = 512

// result is a computed epoch on its way to the artifact writer: the
// artifacts' bytes and the legs its outbox is cut from.
type result struct {
	id         string
	runJSON    []byte
	commitment string
	legs       []Leg
	total      uint64
	start      time.Time
}

// beforeWrite, if set by a test, runs as the artifact writer takes a
// result.
var beforeWrite func(ctx context.Context, id string)

// sendResult hands res to the artifact writer, waiting while the results
// queue is full (the seed's blocking send), until ctx ends at the drain
// deadline: then res is dropped and counted in dropped_results_total. The
// epoch is still computing in the store, and the next process computes
// it again, to the same bytes.
func (r *running) sendResult(ctx context.Context, res result) {
	select {
	case r.results <- res:
	case <-ctx.Done():
		r.m.droppedResults.Inc()
		r.release(res.id)
	}
}

// writeLoop is the artifact writer: it stores each result until the
// results queue is closed and empty (the drain flushes it once the
// compute workers are done) or ctx ends at the drain deadline.
func (r *running) writeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case res, ok := <-r.results:
			if !ok {
				return
			}
			r.guard(res.id, func() { r.storeResult(ctx, res) })
		}
	}
}

// storeResult writes res's artifacts, then in one group the outbox of
// settlement parts with the state computed, and offers the epoch to the
// settlement emitters. A result that the drain deadline cuts short is
// dropped and counted.
func (r *running) storeResult(ctx context.Context, res result) {
	id := res.id
	if beforeWrite != nil {
		beforeWrite(ctx, id)
	}
	if ctx.Err() != nil {
		r.m.droppedResults.Inc()
		r.release(id)
		return
	}
	if err := r.writeArtifacts(id, res.runJSON, res.commitment); err != nil {
		r.log.Error("write artifacts", "epoch", id, "error", err)
		r.quarantine(ctx, id, reasonArtifact, err.Error())
		r.release(id)
		return
	}
	r.m.computeTime.Observe(r.now().Sub(res.start).Seconds())
	var parts [][]Leg
	for lo := 0; lo < len(res.legs); lo += legsPerPart {
		parts = append(parts, res.legs[lo:min(lo+legsPerPart, len(res.legs))])
	}
	var out epoch
	err := r.commit(ctx, func(tx *store.Tx) error {
		cur, ok, err := getEpoch(tx, id)
		if err != nil || !ok || cur.State != stateComputing {
			return errors.Join(err, errStale)
		}
		for i, legs := range parts {
			if err := putPart(tx, id, i, part{Key: idemKey(id, cur.Generation, i), Legs: legs}); err != nil {
				return err
			}
		}
		cur.State = stateComputed
		cur.Commitment = res.commitment
		cur.Recipients = len(res.legs)
		cur.PayoutsTotal = res.total
		cur.Settlement = settlement{Parts: len(parts)}
		out = cur
		return putEpoch(tx, cur)
	})
	if err != nil {
		r.release(id)
		switch {
		case ctx.Err() != nil:
			r.m.droppedResults.Inc()
		case !errors.Is(err, errStale):
			r.log.Error("store a computed epoch", "epoch", id, "error", err)
		}
		return
	}
	r.m.epochs.WithLabelValues(stateComputed).Inc()
	r.emit(out)
	r.offer(id)
}
