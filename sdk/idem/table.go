package idem

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/plughost/plughost/sdk/store"
)

// DefaultTTL is Table.TTL's default: a day, as long as Stripe keeps keys.
const DefaultTTL = 24 * time.Hour

// Table keeps a store's idempotency records in two of its buckets: the
// records by key, and an index by expiry (expires(8) ‖ key) that Sweep
// walks oldest first. Write them in the same Update as the operation
// they record, so that the answer is on disk exactly when the write is.
type Table struct {
	// Records and Expiry are the buckets' numbers, their indexes in
	// store.Options.Buckets.
	Records, Expiry int
	// TTL is how long a record answers retries; default DefaultTTL.
	TTL time.Duration
}

// Lookup returns the record of key that has not expired at now, if any.
// A record that does not decode is an error: the store checksums its
// values, so it was written by something else.
func (t Table) Lookup(g store.Reader, key string, now time.Time) (Record, bool, error) {
	v := g.Get(t.Records, []byte(key))
	if v == nil {
		return Record{}, false, nil
	}
	rec, err := decode(v)
	if err != nil {
		return Record{}, false, fmt.Errorf("key %q: %w", key, err)
	}
	if !rec.Expires.After(now) {
		return Record{}, false, nil
	}
	return rec, true, nil
}

// Put records rec under key in tx, expiring TTL after now unless
// rec.Expires is set, and replaces the expiry index entry of an earlier
// (expired) record of key.
func (t Table) Put(tx *store.Tx, key string, rec Record, now time.Time) error {
	if rec.Expires.IsZero() {
		ttl := t.TTL
		if ttl <= 0 {
			ttl = DefaultTTL
		}
		rec.Expires = now.Add(ttl)
	}
	b, err := rec.encode()
	if err != nil {
		return err
	}
	if old := tx.Get(t.Records, []byte(key)); old != nil {
		if o, err := decode(old); err == nil {
			if err := tx.Delete(t.Expiry, expiryKey(o.Expires, key)); err != nil {
				return err
			}
		}
	}
	if err := tx.Put(t.Records, []byte(key), b); err != nil {
		return err
	}
	return tx.Put(t.Expiry, expiryKey(rec.Expires, key), nil)
}

// Sweep deletes, in tx, up to limit records expired at now, oldest first,
// and returns how many. Run it as a group of the plugin's writes (through
// its committer), not beside them: expired records already answer
// nothing, so sweeping only reclaims their space, and may wait.
func (t Table) Sweep(tx *store.Tx, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	at := uint64(now.UnixNano())
	var expired [][]byte
	// Up to the first key that expires after now.
	tx.Ascend(t.Expiry, nil, binary.BigEndian.AppendUint64(nil, at+1), func(k, _ []byte) bool {
		if len(k) >= 8 {
			expired = append(expired, bytes.Clone(k))
		}
		return len(expired) < limit
	})
	for _, k := range expired {
		if err := tx.Delete(t.Expiry, k); err != nil {
			return 0, err
		}
		key := k[8:]
		// A record of the key written since has another expiry: keep it.
		if v := tx.Get(t.Records, key); v != nil {
			if rec, err := decode(v); err == nil && uint64(rec.Expires.UnixNano()) != binary.BigEndian.Uint64(k) {
				continue
			}
		}
		if err := tx.Delete(t.Records, key); err != nil {
			return 0, err
		}
	}
	return len(expired), nil
}

func expiryKey(expires time.Time, key string) []byte {
	return append(binary.BigEndian.AppendUint64(nil, uint64(expires.UnixNano())), key...)
}
