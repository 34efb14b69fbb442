// Package group supervises long-running goroutines ("workers"): it restarts a
// worker that panics or fails, with jittered exponential backoff from
// [backoff], and on Stop cancels every worker and waits for all of them.
//
// The lifecycle is New → Go (any number of times) → Stop. A worker is a
// func(ctx) error that runs until ctx is done:
//
//   - returning nil means the worker is finished; it is not restarted;
//   - returning an error, or panicking, restarts it after a backoff delay;
//   - once the group's context is done, nothing is restarted.
//
// The group owns its workers' goroutines and their restart loop. It must not
// outlive Stop, hold a lock while a worker runs, or swallow a failure without
// logging it: a panic is logged at error level with its stack, a returned
// error at warn level, each before the restart.
package group
