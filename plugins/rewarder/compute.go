package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/plughost/plughost/sdk/store"
)

// legsPerPart is the wallet's limit of legs in one batch.
const legsPerPart = 1024

// errStale is an op refused because the epoch moved on meanwhile.
var errStale = errors.New("the epoch is not in the state this write expects")

// computeLoop is one compute worker: it takes epochs from the work queue
// until the drain begins.
func (r *running) computeLoop(ctx context.Context) {
	for {
		id, err := r.work.Dequeue(ctx)
		if err != nil {
			return
		}
		if r.stopping() {
			r.release(id) // stays queued in the store: the next process computes it
			r.m.canceled[kindCompute].Inc()
			continue
		}
		r.guard(id, func() { r.computeEpoch(ctx, id) })
	}
}

// guard runs fn, which works on epoch id; if fn panics, the epoch stops
// being active (the rescanner offers it again) before the panic goes on
// to the supervisor.
func (r *running) guard(id string, fn func()) {
	defer func() {
		if v := recover(); v != nil {
			r.release(id)
			panic(v)
		}
	}()
	fn()
}

// computeEpoch computes a queued epoch: the rewards, the conservation
// check, the artifacts, then in one group the outbox of settlement parts
// with the state computed. A check that fails quarantines the epoch.
func (r *running) computeEpoch(ctx context.Context, id string) {
	var e epoch
	var in sealed
	err := r.db.View(func(s *store.Snapshot) error {
		var ok bool
		var err error
		if e, ok, err = getEpoch(s, id); err != nil || !ok {
			return errors.Join(err, errStale)
		}
		if e.State != stateQueued && e.State != stateComputing {
			return errStale
		}
		in, err = getInputs(s, id, e.InputsHash)
		return err
	})
	if err != nil {
		r.release(id)
		if !errors.Is(err, errStale) {
			r.log.Error("read an epoch to compute", "epoch", id, "error", err)
		}
		return
	}
	if e.State == stateQueued {
		if err := r.transition(ctx, id, stateQueued, func(e *epoch) { e.State = stateComputing }); err != nil {
			r.release(id)
			return
		}
	}
	start := r.now()
	payouts, err := compute(in.PoolAmount, in.Contributions, r.s.computeWorkers)
	var q *quarantineError
	if errors.As(err, &q) {
		r.quarantine(ctx, id, q.reason, q.detail)
		r.release(id)
		return
	}
	runJSON, commitment := artifacts(id, e.InputsHash, Inputs{PoolAccount: in.PoolAccount, PoolAmount: in.PoolAmount}, payouts)
	res := result{id: id, runJSON: runJSON, commitment: commitment, start: start}
	for _, p := range payouts {
		res.total += p.Amount
		if p.Amount > 0 { // the wallet refuses legs of 0
			res.legs = append(res.legs, Leg{To: p.Account, Amount: p.Amount})
		}
	}
	r.sendResult(ctx, res)
}

// transition applies fn to the epoch if it is in state from.
func (r *running) transition(ctx context.Context, id, from string, fn func(*epoch)) error {
	var out epoch
	err := r.commit(ctx, func(tx *store.Tx) error {
		e, ok, err := getEpoch(tx, id)
		if err != nil || !ok || e.State != from {
			return errors.Join(err, errStale)
		}
		fn(&e)
		out = e
		return putEpoch(tx, e)
	})
	if err == nil {
		r.m.epochs.WithLabelValues(out.State).Inc()
		r.emit(out)
	}
	return err
}

// quarantine stores the epoch as quarantined with reason: nothing more
// is paid until the operator asks for a retry.
func (r *running) quarantine(ctx context.Context, id, reason, detail string) {
	var out epoch
	err := r.commit(ctx, func(tx *store.Tx) error {
		e, ok, err := getEpoch(tx, id)
		if err != nil || !ok {
			return errors.Join(err, errStale)
		}
		e.State = stateQuarantined
		e.Reason = reason
		out = e
		return putEpoch(tx, e)
	})
	if err != nil {
		r.log.Error("quarantine an epoch", "epoch", id, "reason", reason, "error", err)
		return
	}
	r.log.Warn("epoch quarantined", "epoch", id, "reason", reason, "detail", detail)
	r.m.quarantine.WithLabelValues(reason).Inc()
	r.m.epochs.WithLabelValues(stateQuarantined).Inc()
	r.emit(out)
}

// writeArtifacts writes run.json and commitment into the epoch's
// directory under artifact_dir, each atomically.
func (r *running) writeArtifacts(id string, runJSON []byte, commitment string) error {
	dir := filepath.Join(r.s.artifactDir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := syncDir(r.s.artifactDir); err != nil {
		return err
	}
	if err := writeAtomic(dir, "run.json", runJSON); err != nil {
		return err
	}
	return writeAtomic(dir, "commitment", []byte(commitment+"\n"))
}

// writeAtomic writes data to dir/name: a temporary file, fsync, rename,
// fsync of the directory.
func writeAtomic(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, "."+name+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", name, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
