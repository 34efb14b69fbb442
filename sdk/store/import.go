package store

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// importSuffix names the file Import writes, after the store's path,
// before it takes the store's place.
const importSuffix = ".import"

// importBatch is how many bytes of writes Import makes per bbolt
// transaction: the file is not in place yet, so a transaction need not
// hold all of them, only bound bbolt's memory for dirty pages.
var importBatch = 32 << 20

// Import creates the store at path from the writes load makes, closed
// cleanly, and puts it in place of the file at path, if any, in one
// step: a crash at any point leaves either the file that was there or
// the whole new store. It is how a plugin moves data from a layout of
// its own (files from before it used the store) into a store: it reads
// its old files, hands their contents to load, and then opens the store
// with Open. Options.Buckets are the store's; Options.LockTimeout and
// Options.Hooks' sync are used as Open uses them.
//
// Import writes the store to path + ".import" (starting over any file a
// crash left there), fdatasyncs it, renames it to path and syncs the
// directory. It leaves the write-ahead log files beside path as they
// are: Open of a store closed cleanly clears what they hold. It must not
// run while a store at path is open, in this process or another: the
// caller keeps other openers off until it returns, by holding its old
// file's lock, say. On error the file at path is unchanged.
func Import(path string, opts Options, load func(*Loader) error) error {
	if err := validBuckets(opts.Buckets); err != nil {
		return fmt.Errorf("import store %s: %w", path, err)
	}
	tmp := path + importSuffix
	d := &DB{path: tmp, name: filepath.Base(path), opts: opts}
	for _, b := range opts.Buckets {
		d.buckets = append(d.buckets, []byte(b.Name))
		d.seqb = append(d.seqb, b.Sequential)
	}
	f, err := lockFresh(tmp, cmp.Or(opts.LockTimeout, DefaultLockTimeout))
	if err != nil {
		return fmt.Errorf("import store %s: %w", path, err)
	}
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{
		// The file is synced once, whole, before it takes path's place.
		NoSync:         true,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		OpenFile:       func(string, int, os.FileMode) (*os.File, error) { return f, nil },
	})
	if err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return fmt.Errorf("import store %s: %w", path, d.mapErr(err))
	}
	d.db = db
	err = d.load(load)
	if err == nil {
		if err = opts.Hooks.syncer()(f); err != nil {
			err = fmt.Errorf("sync: %w", err)
		}
	}
	if err == nil {
		// Renamed while still locked, so that no other Import starts
		// this file over before it is in place.
		if err = os.Rename(tmp, path); err == nil {
			if err = syncDirWith(filepath.Dir(path), opts.Hooks.syncerOr((*os.File).Sync)); err != nil {
				err = fmt.Errorf("sync directory: %w", err)
			}
		}
	}
	if cerr := db.Close(); err == nil && cerr != nil {
		err = d.mapErr(cerr)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("import store %s: %w", path, err)
	}
	return nil
}

// lockFresh creates or opens the file at path, takes bbolt's lock on
// it, and empties it. A file another Import renamed away while this one
// waited for its lock is not the one at path any more: it is opened
// again.
func lockFresh(path string, timeout time.Duration) (*os.File, error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := lockFile(f, timeout); err != nil {
			_ = f.Close()
			if errors.Is(err, berrors.ErrTimeout) {
				return nil, fmt.Errorf("%w for %v: another process is importing it", ErrLocked, timeout)
			}
			return nil, err
		}
		held, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		if now, err := os.Stat(path); err != nil || !os.SameFile(held, now) {
			_ = f.Close()
			continue
		}
		if err := f.Truncate(0); err != nil {
			_ = f.Close()
			return nil, err
		}
		return f, nil
	}
}

// load runs load against a new file and writes the store's own keys.
func (d *DB) load(load func(*Loader) error) error {
	l := &Loader{d: d}
	if err := l.begin(); err != nil {
		return err
	}
	defer func() {
		if l.tx != nil {
			_ = l.tx.Rollback()
		}
	}()
	for _, name := range d.buckets {
		if _, err := l.tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, d.mapErr(err))
		}
	}
	if err := load(l); err != nil {
		return err
	}
	if err := l.w.finish(newGen(), false); err != nil {
		return err
	}
	err := l.tx.Commit()
	l.tx = nil
	return d.mapErr(err)
}

// Loader writes the contents of the store Import creates. Its writes
// go straight into the new file, in order: a later write to a key
// replaces an earlier one. It is valid only until load returns, and only
// in load's goroutine.
type Loader struct {
	d *DB
	w *writer
	// tx is the bbolt transaction under way; n counts the bytes written
	// in it.
	tx *bolt.Tx
	n  int
}

// begin starts the next bbolt transaction, in which sequential buckets
// split their pages nearly full.
func (l *Loader) begin() error {
	tx, err := l.d.db.Begin(true)
	if err != nil {
		return fmt.Errorf("begin: %w", l.d.mapErr(err))
	}
	if l.w == nil {
		l.w = l.d.newWriter(tx, nil, nil)
	}
	l.w.use(tx)
	l.tx, l.n = tx, 0
	return nil
}

// Put writes v under k in bucket b. It fails as Tx.Put does, and with
// the file's error.
func (l *Loader) Put(b int, k, v []byte) error {
	if err := checkWrite(len(l.d.buckets), b, k); err != nil {
		return err
	}
	if int64(len(v)) > MaxValueSize {
		return ErrValueTooLarge
	}
	return l.write(entry{b: b, k: k, v: v})
}

// Delete deletes k from bucket b. It fails as Put does.
func (l *Loader) Delete(b int, k []byte) error {
	if err := checkWrite(len(l.d.buckets), b, k); err != nil {
		return err
	}
	return l.write(entry{b: b, del: true, k: k})
}

// SetSeq sets the store's sequence counter: the first Tx.NextSeq on the
// new store returns seq + 1.
func (l *Loader) SetSeq(seq uint64) { l.w.seq = seq }

func (l *Loader) write(e entry) error {
	if l.d.seqb[e.b] {
		l.tx.Bucket(l.d.buckets[e.b]).FillPercent = 0.9
	}
	// The writer keeps a key as the bucket's last: it must outlive the
	// caller's buffer.
	e.k = append([]byte(nil), e.k...)
	if err := l.w.apply(e); err != nil {
		return err
	}
	if l.n += len(e.k) + len(e.v); l.n < importBatch {
		return nil
	}
	err := l.tx.Commit()
	l.tx = nil
	if err != nil {
		return l.d.mapErr(err)
	}
	return l.begin()
}
