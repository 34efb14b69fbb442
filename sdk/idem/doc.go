// Package idem is the Idempotency-Key protocol for a plugin's writes, as
// the IETF httpapi draft and Stripe answer them: the first request with a
// key is applied and its answer recorded with the write, in the same
// store group; a retry with the same key and the same request gets the
// recorded answer, byte for byte, with Idempotent-Replayed: true, also
// after a restart; the same key with a different request gets 422; a
// retry while the first is still in progress gets 409.
//
// It has three parts, used together:
//
//   - Key reads and checks the header, and Fingerprint hashes what
//     makes two requests the same.
//   - Claims holds each key in memory while its request is in progress,
//     and for as long after as its outcome is unknown (a group commit
//     that stalled on the disk may still land): a retry meanwhile is told
//     the key is in use, never that nothing was applied.
//   - Table keeps the records in two buckets of an sdk/store: the
//     records by key, and an index by expiry that Sweep walks, in a group
//     of the plugin's writes, so that expired records are reclaimed
//     through the same commit path as every other write.
//
// Replay writes a recorded answer; Status maps the package's errors to
// HTTP statuses and error codes.
//
// The package must not start goroutines, hold a lock across a wait or
// write the store outside the Tx it is given.
package idem
