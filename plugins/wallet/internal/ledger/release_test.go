package ledger_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/wallettest"
	"github.com/plughost/plughost/sdk/store"
)

// TestOpensPreviousRelease opens data dirs written by the release before
// the store (testdata/release-1.tar.gz: "closed", after a clean Close,
// and "crashed", copied while open with two groups only in the log): both
// open with every committed operation and idempotency record, and are
// converted so that a wallet of that release refuses them rather than
// misread them. The idempotency records expire a day after they were
// written, so the ledger runs on a clock set to when the archive was
// made (its entries' modification time), and the records are gone a day
// later: the conversion keeps each record's expiry.
func TestOpensPreviousRelease(t *testing.T) {
	for _, name := range []string{"closed", "crashed"} {
		t.Run(name, func(t *testing.T) {
			dir, written := untar(t, "testdata/release-1.tar.gz")
			path := filepath.Join(dir, name, "wallet.db")
			clk := wallettest.NewClock(written)
			for range 2 { // converted, then as converted
				l := open(t, path, ledger.Options{Now: clk.Now})
				for id, want := range map[string]ledger.Account{
					"alice": {ID: "alice", Balance: 600, Nonce: 2},
					"bob":   {ID: "bob", Balance: 250, Nonce: 1},
					"carol": {ID: "carol", Balance: 100},
					"dave":  {ID: "dave", Balance: 7},
				} {
					if got := account(t, l, id); got != want {
						t.Errorf("account %s = %+v, want %+v", id, got, want)
					}
				}
				if a := checkAudit(t, l); a.Issued != 1007 || a.Burned != 50 || a.Seq != 5 || a.Receipts != 5 {
					t.Errorf("Audit = %+v, want issued 1007, burned 50, seq 5, 5 receipts", a)
				}
				for _, k := range []string{"k1", "k2", "k3"} {
					if rec, ok, err := l.Idempotency(k); err != nil || !ok || rec.Status != 200 {
						t.Errorf("Idempotency(%q) at %v = %+v, %v, %v, want its recorded 200", k, clk.Now(), rec, ok, err)
					}
				}
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
			}
			clk.Add(ledger.DefaultIdempotencyTTL + time.Minute)
			l := open(t, path, ledger.Options{Now: clk.Now})
			for _, k := range []string{"k1", "k2", "k3"} {
				if rec, ok, err := l.Idempotency(k); err != nil || ok {
					t.Errorf("Idempotency(%q) at %v = %+v, %v, %v, want none: it expired a day after it was written", k, clk.Now(), rec, ok, err)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			_ = db.View(func(tx *bolt.Tx) error {
				// The release before reads meta "format" as 8 bytes from
				// 1 to 4 and refuses anything else.
				if v := tx.Bucket([]byte("meta")).Get([]byte("format")); len(v) == 8 && binary.BigEndian.Uint64(v) <= 4 {
					t.Errorf("meta format = %x, which the release before would open", v)
				}
				return nil
			})
		})
	}
}

// TestCheckPreviousRelease checks that Check refuses the previous
// release's data dirs, which it does not read, saying to start the
// wallet once to convert them, and changes nothing; once Open has
// converted them, Check finds them healthy.
func TestCheckPreviousRelease(t *testing.T) {
	for _, name := range []string{"closed", "crashed"} {
		t.Run(name, func(t *testing.T) {
			dir, written := untar(t, "testdata/release-1.tar.gz")
			path := filepath.Join(dir, name, "wallet.db")
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ledger.Check(path, ledger.Options{})
			if !errors.Is(err, store.ErrNotStore) || !strings.Contains(err.Error(), "release before the store (format ") || !strings.Contains(err.Error(), "start the wallet once to convert it") {
				t.Errorf("Check = %v, want ErrNotStore naming the format and saying to start the wallet once", err)
			}
			if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, before) {
				t.Errorf("the ledger file after Check: %v, changed %v; want it as it was", err, !bytes.Equal(after, before))
			}
			l := open(t, path, ledger.Options{Now: wallettest.NewClock(written).Now})
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if rep, err := ledger.Check(path, ledger.Options{}); err != nil || !rep.OK() || rep.Seq != 5 {
				t.Errorf("Check after the conversion = %+v, %v; want healthy at seq 5", rep, err)
			}
		})
	}
}

// untar extracts the gzipped tar file at path into a new directory and
// returns it, with the newest modification time of its entries: when the
// archive's files were last written.
func untar(t *testing.T, path string) (dir string, written time.Time) {
	t.Helper()
	dir = t.TempDir()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir, written
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.ModTime.After(written) {
			written = h.ModTime
		}
		dst := filepath.Join(dir, filepath.Clean("/"+h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// framed returns v as the store keeps it under k: after the CRC-32C of k
// and v.
func framed(k, v []byte) []byte {
	c := crc32.MakeTable(crc32.Castagnoli)
	return append(binary.BigEndian.AppendUint32(nil, crc32.Update(crc32.Checksum(k, c), c, v)), v...)
}

// openCopy copies the closed ledger at path to a new directory, opens the
// copy, applies ops to it and returns the copy's path; the copy is closed
// by the test's cleanup, so until then it looks as a running wallet's
// files do.
func openCopy(t *testing.T, path string, ops ...ledger.Op) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(path))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o600); err != nil {
		t.Fatal(err)
	}
	l := open(t, dst, ledger.Options{CheckpointInterval: time.Hour})
	if len(ops) > 0 {
		apply(t, l, ops...)
	}
	return dst
}

// crashImage copies the ledger at path and its write-ahead log, as they
// are on disk now, to a new directory and returns the copy's path. Every
// write of a committed group has returned, so the copy is what kill -9
// of the process would leave behind.
func crashImage(t *testing.T, path string) string {
	t.Helper()
	dir := t.TempDir()
	for _, suffix := range []string{"", ".wal", ".wal.1"} {
		data, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(path)+suffix), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, filepath.Base(path))
}
