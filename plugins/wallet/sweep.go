package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/sdk/breaker"
)

// Sweeping of expired idempotency records: every sweepInterval, while the
// ledger has expired records, submit sweeps of at most sweepBatch keys to
// the committer, one after another, until none is left.
const (
	sweepInterval = 10 * time.Second
	sweepBatch    = 4096
)

// errSweepDeferred wraps a sweep the committer did not take: its breaker
// was open, its queue full, or it was closing. The next tick tries again.
var errSweepDeferred = errors.New("idempotency sweep deferred")

// sweep runs sweepExpired every interval until ctx ends. It is a client
// of the committer like a request handler: its sweeps are operations of
// their own kind, committed in groups under the commit timeout and the
// breaker, and it holds no lock of the ledger's.
func sweep(ctx context.Context, l *ledger.Ledger, cm *committer, interval time.Duration, logger hclog.Logger) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := sweepExpired(ctx, l, cm)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errSweepDeferred):
			logger.Debug("idempotency sweep deferred; trying again at the next tick", "swept", n, "error", err)
		case err != nil:
			logger.Warn("sweeping idempotency records failed; trying again at the next tick", "swept", n, "error", err)
		case n > 0:
			logger.Debug("swept expired idempotency records", "swept", n)
		}
	}
}

// sweepExpired submits sweeps of up to sweepBatch records to cm, waiting
// for each, while the ledger has expired records, and returns how many
// it deleted. It queues nothing when no record has expired, nor while the
// breaker is open: a sweep only reclaims space, and may wait. A sweep the
// committer refuses is an error wrapping errSweepDeferred; one whose
// group failed, the committer's error.
func sweepExpired(ctx context.Context, l *ledger.Ledger, cm *committer) (int, error) {
	type outcome struct {
		res ledger.Result
		err error
	}
	swept := 0
	for {
		due, err := l.Expired()
		if err != nil || !due {
			return swept, err
		}
		// Submit would refuse it too, but count the refusal as a
		// client's in upstream_fail_total.
		if cm.BreakerState() == breaker.StateOpen {
			return swept, fmt.Errorf("%w: the ledger's circuit breaker is open", errSweepDeferred)
		}
		done := make(chan outcome, 1)
		op := ledger.Op{Kind: ledger.KindSweep, Limit: sweepBatch}
		if err := cm.Submit(op, func(res ledger.Result, err error) { done <- outcome{res, err} }); err != nil {
			return swept, fmt.Errorf("%w: %w", errSweepDeferred, err)
		}
		var o outcome
		select {
		case o = <-done:
		case <-ctx.Done():
			// The committer still answers the sweep, into done.
			return swept, ctx.Err()
		}
		if o.err != nil {
			return swept, o.err
		}
		swept += o.res.Swept
		if o.res.Swept < sweepBatch {
			return swept, nil
		}
	}
}
