package durable_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/store"
)

// A note is the example's operation: a key and its text.
type note struct{ key, text string }

func Example() {
	dir, err := os.MkdirTemp("", "notes")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	db, err := store.Open(filepath.Join(dir, "notes.db"), store.Options{Buckets: []store.Bucket{{Name: "notes"}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = db.Close() }() // after the committer's Close

	// The plugin's rule: a group of notes is one transaction, and each
	// note's result is its number, counted from 1. Groups are applied one
	// at a time, so count needs no lock.
	count := 0
	c, err := durable.New(durable.Options[note, int]{
		Store: db,
		Apply: func(_ context.Context, ns []note) ([]int, error) {
			numbers := make([]int, len(ns))
			err := db.Update(func(tx *store.Tx) error {
				for i, n := range ns {
					if err := tx.Put(0, []byte(n.key), []byte(n.text)); err != nil {
						return err
					}
					numbers[i] = count + i + 1
				}
				return nil
			})
			if err != nil {
				return nil, err // nothing committed: count stays
			}
			count += len(ns)
			return numbers, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// A request handler submits its operation and waits for its result.
	for _, n := range []note{{"a", "first"}, {"b", "second"}} {
		done := make(chan error, 1)
		var number int
		if err := c.Submit(n, func(r int, err error) { number = r; done <- err }); err != nil {
			fmt.Println("refused:", err) // ErrBusy: 429; ErrUnavailable, ErrDraining: 503
			continue
		}
		if err := <-done; err != nil {
			fmt.Println("failed:", err)
			continue
		}
		fmt.Printf("note %d: %s=%s committed\n", number, n.key, n.text)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		fmt.Println(err) // ErrStalled: leave the store open
		return
	}
	fmt.Println("closed; the store is still ready:", c.Health().Status == sdk.StatusReady)
	// Output:
	// note 1: a=first committed
	// note 2: b=second committed
	// closed; the store is still ready: true
}
