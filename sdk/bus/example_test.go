package bus_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk/bus"
)

// A DropOldest bus keeps a consumer's newest events; Missed says how
// many went before each one Next returns.
func Example() {
	b, err := bus.New[string](bus.Options{
		Policy:     bus.DropOldest,
		Consumers:  []string{"ops"}, // the operator's list; other names count as "other"
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	sub := b.Subscribe("ops", 2)
	defer sub.Close()
	for _, ev := range []string{"a", "b", "c"} {
		b.Publish(ev) // never blocks
	}
	for sub.Len() > 0 {
		ev, _ := sub.Next(context.Background())
		fmt.Println(ev, "after missing", sub.Missed())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = sub.Next(ctx)
	fmt.Println(errors.Is(err, context.Canceled))
	// Output:
	// b after missing 1
	// c after missing 0
	// true
}

// A plugin's streaming route: each request subscribes, and events go out
// as server-sent events until the client goes, the drain begins or, on a
// CutOff bus, the consumer falls a whole buffer behind.
func ExampleWriter() {
	b, err := bus.New[string](bus.Options{Policy: bus.CutOff, Registerer: prometheus.NewRegistry()})
	if err != nil {
		fmt.Println(err)
		return
	}
	http.HandleFunc("GET /events", func(rw http.ResponseWriter, r *http.Request) {
		consumer := r.URL.Query().Get("consumer")
		if !bus.ValidConsumer(consumer) {
			http.Error(rw, "consumer must match "+bus.ConsumerPattern, http.StatusBadRequest)
			return
		}
		sub := b.Subscribe(consumer, 64)
		defer sub.Close()
		w := bus.NewWriter(rw)
		for {
			ev, err := sub.Next(r.Context())
			if errors.Is(err, bus.ErrLagged) {
				_ = w.Event("lagged", "", []byte("{}")) // the client re-reads from its last id
				w.Flush()
				return
			}
			if err != nil {
				return
			}
			if w.Event("change", "", []byte(ev)) != nil {
				return
			}
			w.Flush()
		}
	})
}
