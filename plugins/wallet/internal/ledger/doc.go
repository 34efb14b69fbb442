// Package ledger is the wallet's durable state: account balances and
// nonces, the receipts of committed operations, the issued and burned
// totals, and the idempotency records of client requests, in one bbolt
// file and its write-ahead log.
//
// The lifecycle is Open → Apply, lookups, Sweep and Checkpoint from any
// goroutine → Close. Apply commits a group of operations: each operation
// is checked (nonce, balance, supply overflow) against the state the
// earlier operations of the group left, and one that fails leaves no
// trace while the others still commit. An operation that carries an
// idempotency key has its outcome recorded with it, so a replay after a
// crash or restart answers exactly what the first request was told.
//
// Durability comes from the write-ahead log (path + ".wal"), as in etcd's
// WAL in front of its bbolt backend: a group's writes (the bbolt puts and
// deletes it makes) go to the log as one checksummed record, and Apply
// returns once fdatasync has, so one small sequential write covers the
// whole group. The groups are applied to a bbolt read-write transaction
// that stays open across them (the pending transaction); Checkpoint
// commits it, with bbolt's own fsyncs, and the log starts its next
// generation. Pages that many groups touch (branches, accounts, the
// receipts' tail) are so written once per checkpoint instead of once per
// group. Open replays the log's records of the current generation, up to
// the first torn or damaged one, into the file.
//
// Lookups read a bbolt read transaction (the last checkpoint) through an
// overlay of the groups logged since, so they see every committed group
// and never wait for a group's fdatasync or a checkpoint: only for a
// writer adding a logged group to the overlay, and, should a checkpoint
// grow the file past its memory map (256 MB at first), for bbolt's remap,
// which waits for open reads. Scans copy the overlay's buckets they need
// and let go of it before they scan.
//
// A group whose writes fail, or that panics, leaves the pending
// transaction holding writes nobody committed: the next writer begins it
// again from the overlay. A log record whose write or fdatasync fails is
// erased from the log (its header zeroed and fdatasynced) so that no
// recovery replays it.
// Where that fails too, or a checkpoint's bbolt commit fails (bbolt may
// have written the new meta page), the files' state is not known and the
// ledger refuses every write (ErrFailed) until it is reopened, which
// replays the log.
//
// Layout of the file (all integers big-endian):
//
//	meta      "seq" → last receipt seq; "issued", "burned" → totals;
//	          "format" → 1, 2 or 3; "wal_gen" → the log generation whose
//	          records the file does not hold yet
//	accounts  id → balance(8) nonce(8)
//	receipts  seq(8) → receipt JSON; never rewritten or deleted
//	idem      key → expires_unix_nano(8) fingerprint(32) status(2) body
//	            or, with 0x8000 set in status, a committed operation's
//	            record: … status(2) seq(8) crc32c(4) rest, its body being
//	            the receipt stored under seq (whose CRC-32C that is)
//	            followed by rest. Only a format 2 or 3 file has these.
//	idem_exp  expires_unix_nano(8) key → ""   (the sweep index)
//
// Format 3 means a log may hold groups the file lacks: Open sets it, a
// clean Close sets 1 again, or 2 once a record refers to a receipt, so
// that a wallet from before the log can open the file after a clean
// shutdown and refuses it after a crash. The log's record layout is
// described in wal.go.
//
// The package owns the files and their invariants (supply = issued −
// burned = the sum of all balances; an account's nonce counts its
// successful debits; receipt seqs have no gaps). It must not start
// goroutines, retry, time out or know about HTTP: the committer decides
// when to call Apply and Checkpoint (CheckpointDue) and what a failure
// means, and the caller renders recorded responses (Options.Render).
package ledger
