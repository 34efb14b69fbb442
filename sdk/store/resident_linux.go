package store

import (
	"os"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// dropMapped unmaps from this process the pages of the bbolt file's
// memory map below tx's high-water mark, with madvise(MADV_DONTNEED):
// what bbolt's free page scan at Open, a pass of Scrub, and readers
// faulted in. The map is a read-only MAP_SHARED map of the file, so the
// pages stay in the page cache, and a reader that touches one again
// (one running meanwhile included) faults it back, unchanged, without a
// disk read unless the kernel has reclaimed it. Without this, every page
// ever read counts in the process's RSS as long as the store is open.
// MADV_COLD would leave the pages mapped, and counted; MADV_PAGEOUT would
// evict them from the page cache too, so that the next read of one
// waits for the disk.
//
// The caller holds tx, a read transaction, until this returns: it holds
// bbolt's mmaplock shared, so a remap (a checkpoint's commit that grows
// the map) or an unmap (Close, Reopen), which take it exclusively, wait
// for it. The range ends at tx's high-water mark, which bbolt always
// maps (it maps the whole file at open, where the walk of pages.go has
// refused a mark past the file's end, and remaps before it allocates a
// page past its map), not at the file's size: bbolt grows the file ahead
// of its map, and madvise past the map would drop whatever else is
// mapped there, the Go heap included. A file bbolt opened read-only
// (Check's, or what a failed Reopen leaves for readers) was not walked
// first, so its mark is not trusted: it is never dropped. The length is
// rounded down to whole pages of the system's, in case bbolt's pages
// are smaller.
func dropMapped(tx *bolt.Tx) error {
	n := uintptr(tx.Size()) &^ uintptr(os.Getpagesize()-1)
	if n == 0 || tx.DB().IsReadOnly() {
		return nil
	}
	// A raw call: the map's address is bbolt's, as a uintptr.
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, tx.DB().Info().Data, n, unix.MADV_DONTNEED); errno != 0 {
		return errno
	}
	return nil
}

// dropResident runs dropMapped in a read transaction of its own, once
// Open or Reopen has read the whole file through the map. Its error is
// dropped: the pages are memory, and the store reads the same with or
// without them.
func (d *DB) dropResident() { _ = d.db.View(dropMapped) }
