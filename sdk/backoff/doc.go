// Package backoff computes jittered exponential delays for retry loops, such
// as the host's plugin restarts and a plugin's reconnects to its backends.
//
// A [Policy] is a value that maps an attempt number to a delay; a [Backoff]
// counts attempts over a Policy for one retry loop; [Sleep] waits for a delay
// unless the context ends first.
//
// The package owns only that arithmetic and the cancellable wait. It must not
// start goroutines, log, or retry anything itself: the caller owns the loop,
// decides what counts as a failure, and passes the context that bounds it.
package backoff
