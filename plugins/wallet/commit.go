package main

import (
	"errors"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/sdk/durable"
)

// commitFaultPoint is the fault point that runs right before each commit.
const commitFaultPoint = "ledger.commit"

// committer is the SDK's group committer over the wallet's ledger.
type committer = durable.Committer[ledger.Op, ledger.Result]

// commitOptions configure a committer beyond the wallet's rules, which
// newCommitter sets.
type commitOptions = durable.Options[ledger.Op, ledger.Result]

// newCommitter starts the SDK's group committer over l with the wallet's
// rules: what a commit is (ledger.Apply, ledger.Probe), which groups say
// something of the disk (wrote), what is announced (the receipts, to
// announce, when a group has any), and the names and labels of its
// metrics, which the wallet has exported since before the kit. opts
// supplies the rest; its Store, Apply, Probe, Wrote, Announce, labels,
// Metrics and FaultPoint are set here.
func newCommitter(l *ledger.Ledger, announce func([]*ledger.Receipt), opts commitOptions) (*committer, error) {
	opts.Store = l
	opts.Apply = l.Apply
	opts.Probe = l.Probe
	opts.Wrote = wrote
	opts.Announce = nil
	if announce != nil {
		opts.Announce = func(results []ledger.Result) {
			if rs := receiptsOf(results); len(rs) > 0 {
				announce(rs)
			}
		}
	}
	opts.Kind = func(op ledger.Op) string { return op.Kind.String() }
	opts.Result = resultLabel
	opts.Kinds = nil
	for _, k := range ledger.Kinds {
		opts.Kinds = append(opts.Kinds, k.String())
	}
	// The sweeper's operations have a kind of their own, so that they
	// are never counted as a client's.
	opts.Kinds = append(opts.Kinds, ledger.KindSweep.String())
	opts.Results = results
	opts.Metrics = durable.Names{Prefix: "wallet", Service: "ledger", Queue: "commit"}
	opts.FaultPoint = commitFaultPoint
	return durable.New(opts)
}

func receiptsOf(results []ledger.Result) []*ledger.Receipt {
	var rs []*ledger.Receipt
	for _, r := range results {
		if r.Receipt != nil {
			rs = append(rs, r.Receipt)
		}
	}
	return rs
}

// wrote reports whether a committed group wrote anything: a receipt, a
// new idempotency record or a sweep's deletions. A group of replays,
// unrecorded refusals and sweeps that found nothing says nothing of the
// disk, and must not close a half-open breaker.
func wrote(results []ledger.Result) bool {
	for _, r := range results {
		if r.Receipt != nil || (r.Record != nil && !r.Replayed) || r.Swept > 0 {
			return true
		}
	}
	return false
}

// Values of the result label of wallet_commits_total that the wallet's
// rules give a committed operation; the kit adds failed and aborted.
const (
	resultCommitted         = durable.ResultCommitted
	resultReplayed          = "replayed"
	resultInsufficientFunds = "insufficient_funds"
	resultNonceMismatch     = "nonce_mismatch"
	resultSupplyOverflow    = "supply_overflow"
	resultInvalid           = "invalid"
	// resultSwept: a sweep of the sweeper's (kind "sweep") committed,
	// whether or not it found records to delete.
	resultSwept = "swept"
)

var results = []string{
	resultCommitted, resultReplayed, resultInsufficientFunds, resultNonceMismatch,
	resultSupplyOverflow, resultInvalid, resultSwept, durable.ResultFailed, durable.ResultAborted,
}

// resultLabel names the outcome of one operation of a committed group.
func resultLabel(r ledger.Result) string {
	switch {
	case r.Sweep:
		return resultSwept
	case r.Replayed:
		return resultReplayed
	case r.Err == nil:
		return resultCommitted
	case errors.Is(r.Err, ledger.ErrInsufficientFunds):
		return resultInsufficientFunds
	case errors.Is(r.Err, ledger.ErrNonceMismatch):
		return resultNonceMismatch
	case errors.Is(r.Err, ledger.ErrSupplyOverflow):
		return resultSupplyOverflow
	default:
		return resultInvalid
	}
}
