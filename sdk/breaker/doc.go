// Package breaker provides a circuit breaker that stops calling a failing
// dependency for a while, so that a plugin or the host fails fast instead of
// piling requests onto something that is down.
//
// A Breaker moves between three states:
//
//  1. Closed: calls go through. FailureThreshold failures in a row open
//     it, and so do FailureThreshold failures within the rolling Window
//     when they are at least FailureRate of its calls. Trip opens it at
//     once.
//  2. Open: calls fail at once with [ErrOpen]. After Cooldown it is half-open.
//  3. Half-open: at most HalfOpenMax calls at a time go through as probes;
//     the rest fail with ErrOpen. SuccessThreshold successful probes close
//     it; one failed probe opens it again for another Cooldown.
//
// What a call counts as is up to Settings.IsFailure; a call whose fn
// returns [ErrNotCounted] (it did not exercise the dependency) counts as
// neither.
//
// The package owns only that state machine. It must not retry, sleep, start
// goroutines, or hold its lock while calling fn or OnStateChange: both run on
// the caller's goroutine with no lock held.
package breaker
