//go:build unix

package catalog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// socketDirPrefix names the socket directories hosts make in the
// temporary directory: plughost-sockets-RANDOM.
const socketDirPrefix = "plughost-sockets-"

// socketDirLock is the file in a socket directory that its host holds an
// exclusive flock on while it runs and writes its pid to. The kernel
// releases the lock when the process ends, even by SIGKILL.
const socketDirLock = "lock"

// SocketDir is a directory, private to one running host, where go-plugin
// makes the Unix sockets of that host's plugins (Options.SocketDir). Open
// it with OpenSocketDir and Close it when the host stops.
type SocketDir struct {
	path string
	lock *os.File
}

// socketDirNewPrefix names a socket directory while its host creates and
// locks it, before renaming it to socketDirPrefix plus the same suffix.
// No scan looks at these names, so no host can take the lock of a
// directory that another is about to lock; a host killed in that instant
// leaves an empty one behind.
const socketDirNewPrefix = "plughost-newsockets-"

// OpenSocketDir removes the socket directories under parent (the
// temporary directory when "") that a host which has died left behind,
// and makes one for this host. It removes only directories named as
// OpenSocketDir names them, owned by this user, whose lock file holds a
// pid and is not locked: a live host holds its lock. A directory appears
// under such a name only once its lock is held and its pid written, so
// hosts that start together neither remove nor lock each other's. It
// returns the directories it removed.
func OpenSocketDir(parent string) (*SocketDir, []string, error) {
	if parent == "" {
		parent = os.TempDir()
	}
	removed, err := removeStaleSocketDirs(parent)
	if err != nil {
		return nil, removed, err
	}
	// A suffix is unique among the directories being created, not among
	// the renamed ones: on a clash, try another.
	for range 3 {
		d, err := newSocketDir(parent)
		if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
			continue
		}
		return d, removed, err
	}
	return nil, removed, errors.New("socket directory: no free name")
}

// newSocketDir creates, locks and names a socket directory in parent.
func newSocketDir(parent string) (*SocketDir, error) {
	tmp, err := os.MkdirTemp(parent, socketDirNewPrefix) // mode 0700
	if err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(tmp, socketDirLock), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			_, err = lock.WriteString(strconv.Itoa(os.Getpid()) + "\n")
		}
	}
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("socket directory lock: %w", err)
	}
	// The lock stays with the open file across the rename.
	dir := filepath.Join(parent, socketDirPrefix+strings.TrimPrefix(filepath.Base(tmp), socketDirNewPrefix))
	if err := os.Rename(tmp, dir); err != nil {
		lock.Close()
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	return &SocketDir{path: dir, lock: lock}, nil
}

// Path returns the directory's path.
func (d *SocketDir) Path() string { return d.path }

// Close removes the directory and what is left in it, and releases its
// lock.
func (d *SocketDir) Close() error {
	err := os.RemoveAll(d.path)
	d.lock.Close()
	return err
}

func removeStaleSocketDirs(parent string) ([]string, error) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return nil, fmt.Errorf("scan for stale socket directories: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), socketDirPrefix) || e.Type() != fs.ModeDir {
			continue // e.Type() is the entry itself: a symlink is not followed
		}
		dir := filepath.Join(parent, e.Name())
		stale, err := staleSocketDir(dir)
		if err != nil || !stale {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove stale socket directory: %w", err))
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

// staleSocketDir reports whether dir is this user's socket directory of a
// host that has died.
func staleSocketDir(dir string) (bool, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return false, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() || !fi.IsDir() {
		return false, nil
	}
	f, err := os.OpenFile(filepath.Join(dir, socketDirLock), os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return false, nil // held: its host is alive
	}
	// Closing f releases the lock again.
	fi, err = f.Stat()
	if err != nil {
		return false, err
	}
	return fi.Size() > 0, nil
}
