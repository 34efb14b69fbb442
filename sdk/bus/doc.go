// Package bus broadcasts a plugin's events to the consumers of its
// streaming routes, and writes them as server-sent events, without ever
// blocking the goroutine that publishes: each consumer has a bounded
// buffer of its own, and a consumer that falls a whole buffer behind is
// dealt with by the bus's named overflow policy:
//
//   - [CutOff]: the consumer is unsubscribed and [Sub.Next] returns
//     [ErrLagged] once it has read what its buffer held. A plugin whose
//     events can be read again (from a store, by Last-Event-ID) tells
//     the client to resume from there; the registry's GET /v1/stream does.
//   - [DropOldest]: the consumer's oldest event makes room for the new
//     one; [Sub.Missed] says how many it lost just before the event
//     [Sub.Next] last returned, and it stays subscribed. The rewarder's
//     GET /v1/events does this.
//
// Either way the lag is counted in bus_lagged_total{consumer}
// ([LaggedName], named by the plugin guide's rule for the metrics the
// design names): under CutOff one per consumer cut off, under DropOldest
// one per event dropped. The consumer label takes only the names the
// operator lists in [Options.Consumers], at most [MaxConsumers] of them,
// and [OtherConsumer] for every other name, so that a client choosing
// names cannot add series.
//
// The lifecycle is New → Subscribe (per request) → Next until an error →
// Sub.Close, with Publish from any goroutine meanwhile. [Writer] sends
// the stream: the head (200, Content-Type: text/event-stream,
// Cache-Control: no-store), then events framed as event, id and data
// lines, flushed when the caller says.
//
// The package must not start goroutines, block a publisher, hold its lock
// across a wait or a write to a client, or decide what an event means:
// ids, resuming and what a lagged event carries are the plugin's.
package bus
