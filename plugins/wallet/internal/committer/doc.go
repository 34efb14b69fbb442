// Package committer turns ledger operations submitted by request handlers
// into group commits: many operations per write-ahead log record and
// fdatasync (ledger.Apply), and checkpoints of the log into the bbolt file.
//
// The lifecycle is New (which starts the committer goroutines, the
// checkpointer and the prober) → Submit from any goroutine → Close, which stops intake,
// lets the queued operations commit until its context ends, aborts the
// rest and waits for every goroutine, except one stalled on the disk
// once its context has ended (ErrStalled).
//
// The pipeline, in order:
//
//  1. Submit refuses at once while the circuit breaker is open
//     (ErrUnavailable) and when the bounded queue is full (ErrBusy): the
//     overflow policy is reject, never wait.
//  2. Committer goroutines take turns (leader/follower): the one holding
//     the turn waits for an operation, takes up to MaxBatch−1 more that
//     are already queued, without waiting, commits them as one group,
//     announces the receipts and passes the turn on; then it answers the
//     group's callers while the next holder commits. Operations that
//     arrive during one commit and its fdatasync form the next group,
//     which is where the group sizes come from.
//  3. Each commit attempt gets CommitTimeout. The fault point
//     "ledger.commit" runs right before ledger.Apply, under that
//     deadline, so an operator can rehearse stalls and failures there.
//     A commit that times out fails its group at once (ErrUnavailable),
//     so callers learn within about CommitTimeout; other failures are
//     retried with jittered exponential backoff, up to Tries attempts.
//     ledger.Apply runs on a goroutine of its own (a flight): one still
//     running at the timeout (a stalled log write or fdatasync) is
//     abandoned, its callers answered ErrOutcomeUnknown, and the breaker
//     tripped; no other group is applied until it returns, and then its
//     receipts are announced first. Every attempt goes through the
//     circuit breaker, which opens on failures in a row or at a rolling
//     failure rate and half-opens with probes after a cool-down. While
//     it is half-open and nothing is queued, the prober goroutine queues
//     a probe of its own (ledger.Probe), so that it closes without a
//     client's write.
//  4. Committed receipts are announced in seq order (Options.Announce),
//     then each operation's callback gets its result, after the turn has
//     been passed on.
//  5. The checkpointer goroutine checkpoints the ledger when
//     ledger.CheckpointDue says so: a committer kicks it after each
//     group, and a timer wakes it while the ledger is quiet with groups
//     in its log. The committers go on committing meanwhile, waiting
//     only while the checkpoint switches the log to its next generation.
//     A failed checkpoint is logged and counted (wallet_checkpoints_total);
//     the groups stay in the log.
//
// The package owns its queue, its goroutines and its breaker. It must not
// hold a lock across the ledger call or a callback, block in Submit, or
// call a callback more than once.
package committer
