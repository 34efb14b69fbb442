// Package ledger is the wallet's durable state: account balances and
// nonces, the receipts of committed operations, the issued and burned
// totals, and the idempotency records of client requests, in a store
// (package sdk/store: a bbolt file and its write-ahead log).
//
// The lifecycle is Open → Apply, lookups, Sweep and Checkpoint from any
// goroutine → Close. Apply commits a group of operations as one store
// Update (one log record, one fdatasync): each operation is checked
// (nonce, balance, supply overflow) against the state the earlier
// operations of the group left, and one that fails leaves no trace while
// the others still commit. An operation that carries an idempotency key
// has its outcome recorded with it, so a replay after a crash or restart
// answers exactly what the first request was told. Expired records are
// deleted by a sweep (KindSweep), an operation of a group like any other,
// so that the committer's timeout and breaker bound it. Open checks the
// ledger's invariants in O(accounts) and refuses a ledger that breaks
// them (ErrCorrupt), as it refuses damaged files.
//
// Layout of the store's buckets (all integers big-endian):
//
//	meta      "seq" → last receipt seq; "issued", "burned" → totals
//	accounts  id → balance(8) nonce(8)
//	receipts  seq(8) → receipt JSON; never rewritten or deleted
//	idem      key → expires_unix_nano(8) fingerprint(32) status(2) body
//	            or, with 0x8000 set in status, a committed operation's
//	            record: … status(2) seq(8) crc32c(4) rest, its body being
//	            the receipt stored under seq (whose CRC-32C that is)
//	            followed by rest
//	idem_exp  expires_unix_nano(8) key → ""   (the sweep index)
//
// The idem bucket keeps this format rather than sdk/idem's Table, whose
// records hold the whole body: a committed operation's record refers to
// its receipt instead of copying it, and earlier releases' data dirs hold
// records in this format.
//
// Files of the wallet's release before the store (the ledger's formats 1
// to 4, with a log of their own) are the package's too: Open converts
// them into a store with store.Import, a step a crash leaves undone or
// done (convert.go).
//
// The package owns the ledger's invariants (supply = issued − burned =
// the sum of all balances; an account's nonce counts its successful
// debits; receipt seqs have no gaps). It must not start goroutines,
// retry, time out or know about HTTP: the committer decides when to call
// Apply, Checkpoint (CheckpointDue) and Reopen and what a failure means,
// and the caller renders recorded responses (Options.Render).
package ledger
