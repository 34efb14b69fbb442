// Package workq provides a bounded in-memory FIFO queue of work handed from
// producers to consumer goroutines, whose overflow policy is to reject: when
// the queue is full, TryEnqueue fails at once with [ErrBusy] and counts the
// rejection, so a producer learns of back-pressure instead of blocking or
// growing memory without limit.
//
// It is named workq, not queue, so that it is not taken for a durable
// message queue such as the mailbox plugin's: nothing in it survives the
// process, and it holds work for goroutines of the same process only.
//
// A queue owns its buffer and, when given a Registerer, three series named
// by the plugin guide's rule for the metrics the design names, its name in
// the queue label: queue_depth{queue}, queue_capacity{queue} and
// queue_dropped_total{queue}.
//
// The package must not block a producer, drop an accepted item, or start
// goroutines: consumers call Dequeue from goroutines they own and wait for.
package workq
