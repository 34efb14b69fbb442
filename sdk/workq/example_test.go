package workq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk/workq"
)

func Example() {
	q, err := workq.New[string](workq.Options{
		Name:       "uploads",
		Capacity:   2,
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// A producer learns at once when the queue is full.
	for _, name := range []string{"a.txt", "b.txt", "c.txt"} {
		if err := q.TryEnqueue(name); errors.Is(err, workq.ErrBusy) {
			fmt.Println("busy, rejected", name)
		}
	}
	q.Close()

	// A consumer owned by a WaitGroup drains what was accepted.
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			name, err := q.Dequeue(context.Background())
			if err != nil {
				fmt.Println("consumer done:", err)
				return
			}
			fmt.Println("uploading", name)
		}
	})
	wg.Wait()
	// Output:
	// busy, rejected c.txt
	// uploading a.txt
	// uploading b.txt
	// consumer done: workq: closed
}
