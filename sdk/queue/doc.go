// Package queue provides a bounded FIFO queue whose overflow policy is to
// reject: when the queue is full, TryEnqueue fails at once with [ErrBusy]
// and counts the rejection, so a producer learns of back-pressure instead of
// blocking or growing memory without limit.
//
// A queue owns its buffer and, when given a Registerer, three metrics named
// after it: <name>_queue_depth, <name>_queue_capacity and
// <name>_queue_rejected_total.
//
// The package must not block a producer, drop an accepted item, or start
// goroutines: consumers call Dequeue from goroutines they own and wait for.
package queue
