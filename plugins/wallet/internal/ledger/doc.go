// Package ledger is the wallet's durable state: account balances and
// nonces, the receipts of committed operations, the issued and burned
// totals, and the idempotency records of client requests, all in one bbolt
// file.
//
// The lifecycle is Open → Apply, lookups and Sweep from any goroutine →
// Close. Apply commits a group of operations in one bbolt read-write
// transaction, so one fsync covers the whole group: each operation is
// checked (nonce, balance, supply overflow) against the state the earlier
// operations of the group left, and one that fails leaves no trace while
// the others still commit. When Apply returns nil every receipt it reports
// is on disk. An operation that carries an idempotency key has its outcome
// recorded in the same transaction, so a replay after a crash or restart
// answers exactly what the first request was told.
//
// Layout of the file (all integers big-endian):
//
//	meta      "seq" → last receipt seq; "issued", "burned" → totals; "format" → 1 or 2
//	accounts  id → balance(8) nonce(8)
//	receipts  seq(8) → receipt JSON; never rewritten or deleted
//	idem      key → expires_unix_nano(8) fingerprint(32) status(2) body
//	            or, with 0x8000 set in status, a committed operation's
//	            record: … status(2) seq(8) crc32c(4) rest, its body being
//	            the receipt stored under seq (whose CRC-32C that is)
//	            followed by rest. Only a format 2 file has these; the
//	            transaction that writes the first one sets format 2.
//	idem_exp  expires_unix_nano(8) key → ""   (the sweep index)
//
// The package owns the file and its invariants (supply = issued − burned =
// the sum of all balances; an account's nonce counts its successful
// debits). It must not start goroutines, retry, time out or know about
// HTTP: the committer decides when to call Apply and what a failure means,
// and the caller renders recorded responses (Options.Render).
package ledger
