// Package durable is the SDK's group committer: it turns operations that
// request handlers submit into group commits, many operations per
// write-ahead log record and fdatasync, and keeps the store behind it
// healthy: checkpoints, scrubs, a circuit breaker that probes, and the
// recovery of a store a disk error failed. It is generic over the
// plugin's operation and result types; the plugin keeps its rules (what
// an operation does, what a result is called) in Options.Apply and a few
// small funcs, and the store sits behind the small [Store] interface,
// which *store.DB satisfies and another backend can implement.
//
// # Lifecycle
//
//  1. Open the store (sdk/store, in the Configure hook).
//  2. New starts the committer: its committer goroutines, and its
//     checkpointer, prober and scrubber under an sdk/group of their own.
//  3. Submit from any goroutine: each request handler submits its
//     operation with a callback and waits for the callback's result or
//     for its request's context.
//  4. Close, in the Drain hook, with the drain deadline (or a little
//     less, to answer what it aborts): it stops intake, lets the queued
//     operations commit until its context ends, aborts the rest, and
//     waits for every goroutine it owns, except one stalled on the disk
//     once its context has ended (ErrStalled). Close the store only after
//     Close has returned nil: closing it under a stalled commit would
//     wait for the disk.
//
// Health and RetryAfter answer from memory at any time: a plugin's Health
// hook can return Health, and a 503 can carry RetryAfter.
//
// Steps 4 and the store's closing are the same in every plugin, and
// Lifecycle writes them once: its Drain, Close and Health methods are
// the plugin's hooks of those names. Its zero value, a field of the
// plugin, stands for a plugin not yet configured; the Configure hook
// hands it the store, the committer and the plugin's own part of each
// hook (Parts) with Start, as its last step:
//
//	type plugin struct {
//		life durable.Lifecycle[op, result]
//	}
//
//	// in Configure, once db and c run:
//	p.life.Start(durable.Parts[op, result]{Store: db, Committer: c,
//		Drain: func(context.Context) error { sweeper.Wait(); return nil }})
//
//	sdk.Plugin{Configure: p.configure, Drain: p.life.Drain, Close: p.life.Close, Health: p.life.Health}
//
// Drain runs Parts.Drain (stop the goroutines of the plugin's own that
// submit) and then the committer's Close, with the drain deadline less
// DrainMargin at most. Close, which the SDK calls once the requests in
// flight have finished, runs Parts.Close and then closes the store,
// unless a commit is still stalled: then it leaves the store open, for
// the next start to replay its log, and returns ErrStalled. Health is not
// ready before Start and once the store is closed, then Parts.Health's
// answer when it gives one (a condition of the plugin's own), else the
// committer's.
//
// # Concurrency model
//
//  1. Submit refuses at once while the circuit breaker is open
//     (ErrUnavailable) and when the bounded intake queue (sdk/workq) is
//     full (ErrBusy): the overflow policy is reject, never wait.
//  2. Committer goroutines take turns (leader/follower, a token in a
//     one-slot channel): the one holding the turn waits for an operation,
//     takes up to MaxBatch−1 more that are already queued, without
//     waiting, commits them as one group (Options.Apply), announces the
//     results and passes the turn on; then it answers the group's
//     callers while the next holder commits. Operations that arrive
//     during one commit and its fdatasync form the next group: that is
//     where the group sizes, and the throughput, come from.
//  3. Each commit attempt gets CommitTimeout. Options.FaultPoint runs
//     right before Apply, under that deadline. A commit that times out
//     fails its group at once (ErrUnavailable); other failures are
//     retried with jittered exponential backoff, up to Tries attempts.
//     Apply runs on a goroutine of its own (a flight): one still running
//     at the timeout (a stalled log write or fdatasync) is abandoned, its
//     callers answered ErrStalled and ErrOutcomeUnknown, and the breaker
//     tripped; no other group is applied until it returns, and then its
//     results are announced first and Options.Settled gets its
//     operations, so that a plugin holding their idempotency keys until
//     then can release them. Every attempt goes through the breaker,
//     which opens on failures in a row or at a rolling failure rate and
//     half-opens after a cool-down; while it is half-open and nothing is
//     queued, the prober commits a probe of its own (Options.Probe). A
//     store that a disk error failed (Store.Err wraps ErrFailed) is
//     reopened by the next attempt the breaker lets through.
//  4. Results are announced in commit order (Options.Announce), then
//     each operation's callback gets its result, exactly once, after the
//     turn has been passed on. A panic in Apply answers the whole group
//     ErrUnavailable before the committer is restarted.
//  5. The checkpointer checkpoints the store when Store.CheckpointDue
//     says so: a committer kicks it after each group, and a timer wakes
//     it while groups wait in a quiet store's log. The committers go on
//     committing meanwhile. A failed checkpoint is logged, counted and
//     retried after a backoff. The scrubber calls Options.Scrub every
//     ScrubEvery and stops at the first damage.
//
// # Errors
//
// Submit returns, and callbacks receive, errors wrapping ErrBusy (HTTP
// 429), ErrUnavailable (503: nothing applied, unless the error also wraps
// ErrOutcomeUnknown, when a retry with the same idempotency key learns
// the outcome), ErrDraining (503) and, for a commit stalled past its
// timeout, ErrStalled with ErrUnavailable and ErrOutcomeUnknown. A
// refusal of one operation by the plugin's rules is its result, not an
// error. The store's own ErrFailed, ErrClosed, ErrCorrupt and
// ErrOutcomeUnknown (sdk/store's values) tell the committer what a
// Store met.
//
// # Metrics
//
// Named by the plugin guide's rule. The families the design names keep
// their names, with the committer's label values: queue_depth,
// queue_capacity and queue_dropped_total{queue}, worker_inflight,
// tasks_spawned_total{kind="committer"}, tasks_aborted_total and
// tasks_canceled_total{kind="commit"}, io_timeouts_total{op},
// backoff_retries_total{svc,op} and upstream_fail_total{svc}. Its own
// start with Names.Prefix, the plugin's kind: <prefix>_commits_total
// {kind,result}, <prefix>_commit_batch_size, <prefix>_commit_seconds,
// <prefix>_checkpoints_total{result}, <prefix>_checkpoint_seconds,
// <prefix>_breaker_state and, with a scrubber, <prefix>_scrub_passes_total.
// A plugin that fills tasks_spawned_total, tasks_aborted_total,
// tasks_canceled_total or io_timeouts_total for work of its own registers
// its label values under the same name and help (TasksSpawnedName and
// TasksSpawnedHelp, …), since a registry refuses one family with two
// help texts.
//
// The package owns its queue, its goroutines and its breaker. It must not
// hold a lock across Apply, a Store call or a callback, block in Submit,
// or call a callback more than once. The committer never closes the
// store: a Lifecycle does, in the plugin's Close hook, or the plugin.
package durable
