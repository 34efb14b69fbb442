package group_test

import (
	"context"
	"fmt"
	"time"

	"github.com/plughost/plughost/sdk/backoff"
	"github.com/plughost/plughost/sdk/group"
)

func Example() {
	g := group.New(context.Background(), group.Options{
		Backoff: backoff.Policy{Initial: time.Millisecond},
		OnRestart: func(name string, reason error) {
			fmt.Printf("restarting %s: %v\n", name, reason)
		},
	})
	defer func() { _ = g.Stop(context.Background()) }()

	// Runs of one worker never overlap, so runs needs no lock.
	runs := 0
	done := make(chan struct{})
	g.Go("indexer", func(ctx context.Context) error {
		runs++
		if runs == 1 {
			panic("index corrupt")
		}
		fmt.Println("indexer run", runs, "finished")
		close(done)
		return nil // finished: not restarted
	})
	<-done
	// Output:
	// restarting indexer: recovered index corrupt: group: worker panicked
	// indexer run 2 finished
}
