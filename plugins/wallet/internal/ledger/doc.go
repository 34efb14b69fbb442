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
// Durability comes from the write-ahead log (path + ".wal" and
// path + ".wal.1"), as in etcd's WAL in front of its bbolt backend: a
// group's writes (the bbolt puts and deletes it makes) go to the log as
// one checksummed record, and Apply returns once fdatasync has, so one
// small sequential write covers the whole group. The groups' writes are
// kept in memory, in an overlay of the latest value of each key written
// since the last checkpoint, as an LSM tree's memtable is. Checkpoint
// freezes the overlay, starts the log's next generation in the other
// file, and writes the frozen overlay into the bbolt file in one
// transaction, each bucket's keys in order, with bbolt's own fsyncs.
// Groups go on committing meanwhile: they wait only for the switch of
// files. A key that many groups write (an account, the totals) is so
// written once per checkpoint instead of once per group, and no group
// waits for a bbolt commit. Open replays the log's records of the
// generations the file lacks, up to the first torn or damaged one.
//
// Groups and lookups read the state after the last committed group: a
// bbolt read transaction (the last checkpoint) under the frozen overlay
// and the current one. Lookups never wait for a group's fdatasync or a
// checkpoint: only for a writer adding a logged group to the overlay,
// and, should a checkpoint grow the file past its memory map (256 MB at
// first), for bbolt's remap, which waits for open reads. Scans copy the
// overlays' buckets they need and let go of them before they scan.
//
// A group whose writes fail, or that panics, leaves nothing: its writes
// reach the overlay only once its record is on disk. A log record whose
// write or fdatasync fails is erased from the log (its header zeroed and
// fdatasynced) so that no recovery replays it. Where that fails too, or
// a checkpoint's bbolt commit fails (bbolt may have written the new meta
// page), the files' state is not known and the ledger refuses every
// write (ErrFailed) until it is reopened, which replays the log. A
// checkpoint that fails before its commit leaves the frozen overlay for
// the next one to write first.
//
// Layout of the file (all integers big-endian):
//
//	meta      "seq" → last receipt seq; "issued", "burned" → totals;
//	          "format" → 1 to 4; "wal_gen" → the first log generation
//	          whose records the file does not hold
//	accounts  id → balance(8) nonce(8)
//	receipts  seq(8) → receipt JSON; never rewritten or deleted
//	idem      key → expires_unix_nano(8) fingerprint(32) status(2) body
//	            or, with 0x8000 set in status, a committed operation's
//	            record: … status(2) seq(8) crc32c(4) rest, its body being
//	            the receipt stored under seq (whose CRC-32C that is)
//	            followed by rest. Only a format 2 to 4 file has these.
//	idem_exp  expires_unix_nano(8) key → ""   (the sweep index)
//
// Format 4 means the log files may hold groups the file lacks: Open sets
// it, a clean Close sets 1 again, or 2 once a record refers to a receipt,
// so that a wallet from before the log can open the file after a clean
// shutdown and refuses it after a crash. Format 3 is the same with the
// log in one file, as wallets before the second file wrote it; Open
// still recovers it. The log's record layout is described in wal.go.
//
// The package owns the files and their invariants (supply = issued −
// burned = the sum of all balances; an account's nonce counts its
// successful debits; receipt seqs have no gaps). It must not start
// goroutines, retry, time out or know about HTTP: the committer decides
// when to call Apply and Checkpoint (CheckpointDue) and what a failure
// means, and the caller renders recorded responses (Options.Render).
package ledger
