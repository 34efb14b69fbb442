package backoff_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/plughost/plughost/sdk/backoff"
)

func ExamplePolicy_Delay() {
	// A negative Jitter makes the delays exact, which suits an example; real
	// callers keep the default jitter so that many retrying clients spread out.
	p := backoff.Policy{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: -1}
	for attempt := range 6 {
		fmt.Println(attempt, p.Delay(attempt))
	}
	// Output:
	// 0 100ms
	// 1 200ms
	// 2 400ms
	// 3 800ms
	// 4 1s
	// 5 1s
}

func ExampleBackoff() {
	ctx := context.Background()
	b := backoff.Backoff{Policy: backoff.Policy{Initial: time.Millisecond, Max: 10 * time.Millisecond}}

	calls := 0
	connect := func() error {
		calls++
		if calls < 3 {
			return errors.New("connection refused")
		}
		return nil
	}

	for {
		err := connect()
		if err == nil {
			b.Reset()
			break
		}
		fmt.Printf("attempt %d: %v\n", b.Attempt(), err)
		if err := backoff.Sleep(ctx, b.Next()); err != nil {
			fmt.Println("gave up:", err)
			return
		}
	}
	fmt.Println("connected after", calls, "calls")
	// Output:
	// attempt 0: connection refused
	// attempt 1: connection refused
	// connected after 3 calls
}

func ExampleSleep() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fmt.Println(backoff.Sleep(ctx, time.Hour))
	// Output:
	// context canceled
}
