package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/plughost/plughost/sdk/breaker"
)

func Example() {
	// A fixed clock stands in for time.Now so the output is deterministic.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := breaker.New(breaker.Settings{
		Name:             "inventory",
		FailureThreshold: 2,
		Cooldown:         10 * time.Second,
		Now:              func() time.Time { return now },
		OnStateChange: func(name string, from, to breaker.State) {
			fmt.Printf("%s: %v -> %v\n", name, from, to)
		},
	})
	ctx := context.Background()
	down := func(context.Context) error { return errors.New("connection refused") }
	up := func(context.Context) error { return nil }

	fmt.Println(b.Do(ctx, down))
	fmt.Println(b.Do(ctx, down))
	fmt.Println(b.Do(ctx, up)) // not called: the breaker is open

	now = now.Add(10 * time.Second)
	fmt.Println(b.Do(ctx, up)) // the probe succeeds
	// Output:
	// connection refused
	// inventory: closed -> open
	// connection refused
	// breaker: open
	// inventory: open -> half-open
	// inventory: half-open -> closed
	// <nil>
}
