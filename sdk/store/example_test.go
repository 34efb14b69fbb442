package store_test

import (
	"encoding/binary"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/plughost/plughost/sdk/store"
)

// A queue on the store: NextSeq numbers each message durably, a range
// read finds the first messages in order, and DeleteRange acknowledges
// them, each step one group.
func Example() {
	dir, err := os.MkdirTemp("", "store-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	const messages = 0 // the bucket's number: its place in Options.Buckets
	db, err := store.Open(filepath.Join(dir, "queue.db"), store.Options{
		Buckets: []store.Bucket{{Name: "messages", Sequential: true}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	// One group: one log record and one fdatasync for the three.
	err = db.Update(func(tx *store.Tx) error {
		for _, body := range []string{"hello", "bonjour", "hallo"} {
			key := binary.BigEndian.AppendUint64(nil, tx.NextSeq())
			if err := tx.Put(messages, key, []byte(body)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	// The two oldest, then the newest, without holding up writers.
	err = db.Scan(func(s *store.Snapshot) error {
		n := 0
		s.Ascend(messages, nil, nil, func(k, v []byte) bool {
			fmt.Printf("%d %s\n", binary.BigEndian.Uint64(k), v)
			n++
			return n < 2
		})
		s.Descend(messages, nil, nil, func(k, v []byte) bool {
			fmt.Printf("newest %d %s\n", binary.BigEndian.Uint64(k), v)
			return false
		})
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	// Acknowledge messages 1 and 2: [1, 3).
	err = db.Update(func(tx *store.Tx) error {
		return tx.DeleteRange(messages, binary.BigEndian.AppendUint64(nil, 1), binary.BigEndian.AppendUint64(nil, 3))
	})
	if err != nil {
		log.Fatal(err)
	}
	err = db.View(func(s *store.Snapshot) error {
		s.Ascend(messages, nil, nil, func(k, v []byte) bool {
			fmt.Printf("left %d %s\n", binary.BigEndian.Uint64(k), v)
			return true
		})
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// 1 hello
	// 2 bonjour
	// newest 3 hallo
	// left 3 hallo
}
