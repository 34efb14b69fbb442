// Package store is the storage engine of stateful plugins: buckets of
// keys and values in one bbolt file, in front of which a write-ahead log
// makes each group of writes durable with one small sequential write.
//
// The lifecycle is Open → Update, View, Scan, Checkpoint and Scrub from
// any goroutine → Close. Update runs a function that reads the current
// state and writes; its writes go to the log as one checksummed record,
// and Update returns once fdatasync has, so a plugin that batches its
// requests into one Update (group commit) pays one disk write per batch.
// The writes are kept in memory, in an overlay of the latest value of
// each key written since the last checkpoint, as an LSM tree's memtable
// is: a B-tree per bucket (github.com/tidwall/btree), so that a range
// read costs a seek there as in the file, however many writes wait.
// Checkpoint freezes the overlay, starts the log's next generation in its
// other file, and writes the frozen overlay into the bbolt file in one
// transaction; groups go on committing meanwhile. View and Scan read the
// state after the last committed group (the bbolt file under the
// overlays) and never wait for an fdatasync or a checkpoint.
//
// # Reading and writing
//
// Buckets are numbered by their place in Options.Buckets. A Reader (a
// *Tx in Update, a *Snapshot in View and Scan) has Get, and Ascend and
// Descend over a half-open range [from, to) of a bucket's keys, nil
// bounds being open. View holds a lock that writers wait for, so it suits
// a few lookups; Scan copies the overlay (a copy on write: a pointer per
// bucket) and reads every bucket as View would, without holding it. A Tx
// also has Put, Delete, DeleteRange and NextSeq, a durable counter of the
// store's. Put copies its key and value; its errors are the package's
// own (ErrKeyRequired, ErrKeyTooLarge, ErrValueTooLarge, ErrNoBucket).
// Values handed out are valid until the call that read them returns.
//
// Each log generation begins with a start record that names where the
// generation before it ended (its record count, end offset and last
// record's checksum), written and fdatasynced when a checkpoint (or
// Open) starts the generation, before any of its groups: one small write
// per checkpoint, none per group. The log's format is described at the
// top of wal.go.
//
// # Integrity
//
// Everything a plugin reads is checksummed: log records (CRC-32C) and
// every value in the bbolt file (CRC-32C over its key and value, checked
// on every read), the store's own keys included. Damage to bbolt's
// pages, which it does not checksum, can hide a key from a lookup
// without a value's checksum failing: a lookup that misses checks the
// keys beside where the key would be (in order, and their checksums), and
// each bucket's count of values and sum of their checksums, kept by
// checkpoints in the store's bucket, are compared by Scrub at the end of
// each bucket and by Check (sums.go). Reads run with
// debug.SetPanicOnFault, and a panic or fault inside bbolt becomes a
// *CorruptError of the call. Open and Check first walk the file's pages
// from its bytes, read with pread and checked against every bound
// (pages.go), because bbolt's own walks of the tree (its free page scan
// at open, its consistency check) run in goroutines of its own, where a
// damaged page would crash the process: a damaged tree is refused at
// Open, naming the page. bbolt checksums its meta pages and falls back to the
// older one if the newer is damaged: the log still holds the groups of
// that checkpoint until the next generation starts in its file, and once
// it has, Open finds the log newer than the file and refuses. At Open:
//
//   - a torn record at the end of the newest log generation (an append
//     that a crash cut short, never acknowledged: the file ends before
//     the record's declared length, or the record is zero from a
//     512-byte sector boundary to its end), or a torn start record of it
//     (a crash while a checkpoint started it), is left out and reported
//     in Recovery.Trimmed;
//   - any other damage (a last record whole in the file whose checksum
//     fails, which no crash leaves, since appends are fdatasynced before
//     they are acknowledged and a sector is written whole or not at all;
//     a bad record with acknowledged records after it; an older
//     generation that ends short of where the next one's start record
//     says, as a zeroed or cut off tail does; a log that belongs to
//     another file or time; a missing log of a file not closed cleanly;
//     unreadable meta pages) fails Open with a *CorruptError that names
//     the file, where in it, and what to do.
//
// The rule errs towards refusing: a power loss during an append that
// overwrites an older generation's bytes in place can leave those bytes
// under the unacknowledged record's tail, and Open refuses it until a
// repair drops it. The newest generation's end is recorded nowhere: a
// tail of it zeroed from a record boundary passes for its end, and a last
// record zeroed from a sector boundary, or whose length was damaged to
// reach past the end of the file, for a torn one. The rule is set out at
// the top of wal.go.
//
// A damaged value or page met while running fails the read with a
// *CorruptError, counts it (Corruptions) and makes the store refuse every
// write (Err): a store that has served one bad value must not build on
// it. Scrub re-reads the file in bounded slices to find damage before a
// read does. Check verifies a store's files offline, and Repair cuts a
// damaged log back to its last good record, saying what it drops. The
// records it drops were acknowledged: Repair loses acknowledged writes,
// and runs only when an operator asks for it (a plugin's check command),
// never by itself at Open. Damage in the bbolt file cannot be cut away;
// the remedy there is a backup.
//
// # Disk errors
//
// A group whose log write or fdatasync fails is erased from the log and
// its Update fails: nothing of it happened, and writes resume by
// themselves once the disk takes them. A checkpoint whose start record
// fails is undone the same way: the start record is erased, and the next
// checkpoint tries again. A failed checkpoint commit, or a log record (a
// group's or a start record) that could be neither written nor erased,
// leaves the files in a state the store cannot vouch for: it refuses
// writes (Err wraps ErrFailed) until Reopen, which the plugin calls when
// it probes whether the disk has recovered (no space left, say). Readers
// go on answering from the state in memory throughout.
//
// # Formats and plugins' earlier files
//
// The store's own bucket, "store", names the file's format (Format);
// Open converts the store's earlier format 2 and refuses any other. A
// bbolt file with buckets but no "store" bucket is not a store's: Open
// and Check refuse it with ErrNotStore and leave it as it is. The
// package knows no plugin's own layouts. A plugin that kept its data in
// files of its own before it used the store converts them with Import:
// it reads its old files itself and hands their contents to a Loader,
// and Import writes a whole store, closed cleanly, beside the old file
// and renames it into place, so that a crash leaves either the old file
// or the new store, never neither. The plugin then opens it with Open.
//
// # Memory
//
// The store's values are in its file, not the heap, which holds the
// overlays of the writes not yet checkpointed and bbolt's freelist.
// bbolt reads the file through a read-only shared memory map, and every
// page read through it counts in the process's RSS (as page cache, which
// the kernel can reclaim, but RSS alarms and operators see it): Open's
// rebuild of the freelist (the file keeps none, so that checkpoints
// write fewer pages) reads every page, a pass of Scrub does again, and
// readers add what they read. Open, Reopen and each Scrub call drop the
// whole map from the process with madvise(MADV_DONTNEED) on Linux
// (resident_linux.go), so that what stays resident of it is what was
// read since the last Scrub; the pages stay in the page cache, and a
// read faults them back from there. Off Linux the map stays resident.
//
// # Tests
//
// Hooks are fault-injection points a plugin's tests and fault drills may
// set (a failing or stalled fdatasync, the bbolt file's opening). Package
// storetest holds what only tests need: the state a crash during a
// checkpoint leaves (Rotate), where the log ends (LogEnd), a record of
// another store's log (ForeignRecord).
//
// The package owns its files and their integrity. It must not start
// goroutines, retry, time out or know about HTTP: the plugin decides when
// to Update, Checkpoint (CheckpointDue), Scrub and Reopen, and what a
// failure means to its clients. Its interface has no bbolt types or
// errors, so that another backend can implement the same calls.
package store
