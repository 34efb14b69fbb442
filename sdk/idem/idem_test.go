package idem

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/store"
)

func TestKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   string
		err    error
	}{
		{"one key", []string{"order-17"}, "order-17", nil},
		{"longest", []string{strings.Repeat("k", MaxKeyLen)}, strings.Repeat("k", MaxKeyLen), nil},
		{"none", nil, "", ErrMissing},
		{"two headers", []string{"a", "b"}, "", ErrInvalid},
		{"empty", []string{""}, "", ErrInvalid},
		{"too long", []string{strings.Repeat("k", MaxKeyLen+1)}, "", ErrInvalid},
		{"a space", []string{"a b"}, "", ErrInvalid},
		{"not ASCII", []string{"clé"}, "", ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tc.values {
				h.Add(Header, v)
			}
			got, err := Key(h)
			if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Errorf("Key(%q) = %q, %v; want %q, %v", tc.values, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestFingerprintOf(t *testing.T) {
	if FingerprintOf([]byte("ab"), []byte("c")) == FingerprintOf([]byte("a"), []byte("bc")) {
		t.Error("parts split differently hash alike")
	}
	if FingerprintOf([]byte("x")) != FingerprintOf([]byte("x")) {
		t.Error("one request hashes two ways")
	}
}

// TestClaims races many requests for one key: exactly one holds it at a
// time, the same request is told ErrInUse and another ErrReused, and
// after Release the key can be taken again.
func TestClaims(t *testing.T) {
	var c Claims
	a, b := FingerprintOf([]byte("a")), FingerprintOf([]byte("b"))
	var wg sync.WaitGroup
	var mu sync.Mutex
	won, inUse := 0, 0
	for range 64 {
		wg.Go(func() {
			err := c.Claim("k", a)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, ErrInUse):
				inUse++
			default:
				t.Errorf("Claim = %v", err)
			}
		})
	}
	wg.Wait()
	if won != 1 || inUse != 63 {
		t.Errorf("64 claims of one key: %d won, %d in use; want 1 and 63", won, inUse)
	}
	if err := c.Claim("k", b); !errors.Is(err, ErrReused) {
		t.Errorf("Claim by another request = %v, want ErrReused", err)
	}
	c.Release("k")
	if err := c.Claim("k", b); err != nil || c.Len() != 1 {
		t.Errorf("Claim after Release = %v (%d held), want nil and 1", err, c.Len())
	}
}

func TestStatus(t *testing.T) {
	for err, want := range map[error]int{ErrMissing: 400, ErrInvalid: 400, ErrInUse: 409, ErrReused: 422} {
		rec := httptest.NewRecorder()
		if !WriteError(rec, err) || rec.Code != want || !strings.Contains(rec.Body.String(), `"error"`) {
			t.Errorf("WriteError(%v) = %d %s, want %d and a JSON error", err, rec.Code, rec.Body, want)
		}
	}
	if _, _, ok := Status(errors.New("other")); ok {
		t.Error("Status claims an error that is not the protocol's")
	}
}

var tableOpts = store.Options{Buckets: []store.Bucket{{Name: "idem"}, {Name: "idem_exp", Sequential: true}}, CheckpointInterval: time.Hour}

var table = Table{Records: 0, Expiry: 1, TTL: time.Hour}

// TestTable records answers in a store, replays them byte for byte
// after the store is closed and opened again, refuses another request's
// replay, stops answering once a record expires, and sweeps expired
// records, keeping a key recorded again since.
func TestTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := store.Open(path, tableOpts)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	fp := FingerprintOf([]byte("POST /notes"), []byte(`{"text":"hi"}`))
	put := func(key string, at time.Time, body string) {
		t.Helper()
		rec := Record{Fingerprint: fp, Status: 201, ContentType: "application/json", Body: []byte(body)}
		if err := d.Update(func(tx *store.Tx) error { return table.Put(tx, key, rec, at) }); err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range []string{"a", "b", "c"} {
		put(k, t0.Add(time.Duration(i)*time.Minute), `{"id":"`+k+`"}`)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if d, err = store.Open(path, tableOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	lookup := func(key string, at time.Time) (Record, bool) {
		t.Helper()
		var rec Record
		var ok bool
		if err := d.View(func(s *store.Snapshot) (err error) {
			rec, ok, err = table.Lookup(s, key, at)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return rec, ok
	}
	rec, ok := lookup("b", t0.Add(30*time.Minute))
	if !ok {
		t.Fatal("record b not found after a reopen")
	}
	w := httptest.NewRecorder()
	if err := Replay(w, rec, fp); err != nil || w.Code != 201 || w.Body.String() != `{"id":"b"}` ||
		w.Header().Get("Idempotent-Replayed") != "true" || w.Header().Get("Content-Type") != "application/json" {
		t.Errorf("Replay = %v: %d %q %v", err, w.Code, w.Body, w.Header())
	}
	w = httptest.NewRecorder()
	if err := Replay(w, rec, FingerprintOf([]byte("other"))); !errors.Is(err, ErrReused) || w.Body.Len() != 0 {
		t.Errorf("Replay for another request = %v, wrote %q; want ErrReused and nothing", err, w.Body)
	}
	if _, ok := lookup("a", t0.Add(time.Hour)); ok {
		t.Error("record a answers at its expiry")
	}
	// b is recorded again: Put replaces its expiry entry, so the sweep
	// takes a and c and leaves b's new record.
	put("b", t0.Add(2*time.Hour), `{"id":"b2"}`)
	var n int
	if err := d.Update(func(tx *store.Tx) (err error) {
		n, err = table.Sweep(tx, t0.Add(90*time.Minute), 10)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("Sweep deleted %d records, want 2 (a and c)", n)
	}
	if rec, ok := lookup("b", t0.Add(2*time.Hour+time.Minute)); !ok || !bytes.Equal(rec.Body, []byte(`{"id":"b2"}`)) {
		t.Errorf("record b after the sweep = %q, %t; want the one recorded again", rec.Body, ok)
	}
	if err := d.View(func(s *store.Snapshot) error {
		for _, k := range []string{"a", "c"} {
			if s.Get(table.Records, []byte(k)) != nil {
				t.Errorf("record %s is still there after the sweep", k)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	in := Record{Fingerprint: FingerprintOf([]byte("x")), Status: 200, ContentType: "text/plain", Body: []byte("ok"),
		Expires: time.Unix(0, 1_900_000_000_000_000_000)}
	b, err := in.encode()
	if err != nil {
		t.Fatal(err)
	}
	out, err := decode(b)
	if err != nil || out.Fingerprint != in.Fingerprint || out.Status != in.Status || out.ContentType != in.ContentType ||
		!bytes.Equal(out.Body, in.Body) || !out.Expires.Equal(in.Expires) {
		t.Errorf("decode(encode(%+v)) = %+v, %v", in, out, err)
	}
	for _, bad := range []Record{{Status: 42}, {Status: 200, ContentType: strings.Repeat("x", 256)}} {
		if _, err := bad.encode(); err == nil {
			t.Errorf("encode(%+v) succeeded", bad)
		}
	}
}

// FuzzDecode feeds decode arbitrary bytes, as a damaged or foreign value
// would be: it never panics, and what it accepts encodes back to the
// same bytes.
func FuzzDecode(f *testing.F) {
	good, _ := Record{Status: 201, ContentType: "application/json", Body: []byte(`{}`)}.encode()
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{recordVersion})
	f.Add(append([]byte{2}, good[1:]...))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decode(b)
		if err != nil {
			return
		}
		again, err := rec.encode()
		if err != nil || !bytes.Equal(again, b) {
			t.Errorf("decode(%x) = %+v, which encodes to %x, %v", b, rec, again, err)
		}
	})
}

// FuzzKey feeds Key arbitrary header values: it never panics, and a key
// it accepts is one the protocol allows.
func FuzzKey(f *testing.F) {
	for _, s := range []string{"order-17", "", " ", "clé", strings.Repeat("k", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := Key(http.Header{Header: {v}})
		if err == nil && (k != v || len(k) == 0 || len(k) > MaxKeyLen || strings.ContainsFunc(k, func(r rune) bool { return r < 0x21 || r > 0x7e })) {
			t.Errorf("Key(%q) accepted %q", v, k)
		}
	})
}
