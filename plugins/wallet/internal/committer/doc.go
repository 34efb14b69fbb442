// Package committer turns ledger operations submitted by request handlers
// into group commits: many operations per bbolt transaction and fsync.
//
// The lifecycle is New (which starts the committer goroutines) → Submit
// from any goroutine → Close, which stops intake, lets the queued
// operations commit until its context ends, aborts the rest and waits for
// every goroutine.
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
//     arrive during one transaction and its fsync form the next group,
//     which is where the group sizes come from.
//  3. Each commit attempt gets CommitTimeout. The fault point
//     "ledger.commit" runs right before the bbolt transaction, under that
//     deadline, so an operator can rehearse stalls and failures there.
//     A commit that times out fails its group at once (ErrUnavailable),
//     so callers learn within about CommitTimeout; other failures are
//     retried with jittered exponential backoff, up to Tries attempts.
//     Every attempt goes through the circuit breaker, which opens after
//     consecutive failures and half-opens with probes after a cool-down.
//  4. Committed receipts are announced in seq order (Options.Announce),
//     then each operation's callback gets its result, after the turn has
//     been passed on.
//
// The package owns its queue, its goroutines and its breaker. It must not
// hold a lock across the ledger call or a callback, block in Submit, or
// call a callback more than once.
package committer
