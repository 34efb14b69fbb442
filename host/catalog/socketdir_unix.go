//go:build unix

package catalog

import (
	"errors"
	"fmt"
	"io"
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

// StaleSocketDir is a socket directory that OpenSocketDir removed: its
// process had died.
type StaleSocketDir struct {
	// Path is where it was.
	Path string
	// Owner is the owner its process gave OpenSocketDir.
	Owner string
	// Sockets is how many Unix sockets it held: its plugins' that were
	// running when the process died.
	Sockets int
}

// socketDirNewPrefix names a socket directory while its host creates and
// locks it, before renaming it to socketDirPrefix plus the same suffix.
// No scan looks at these names, so no host can take the lock of a
// directory that another is about to lock; a host killed in that instant
// leaves an empty one behind.
const socketDirNewPrefix = "plughost-newsockets-"

// OpenSocketDir removes the socket directories under parent (the
// temporary directory when "") that a process which has died left
// behind, and makes one for this process, recording owner in it (the
// host's data directory for plughost run; "" for a process that makes
// one only for a check). It removes only directories named as
// OpenSocketDir names them, owned by this user, whose lock file holds a
// pid and is not locked: a live process holds its lock. A directory
// appears under such a name only once its lock is held and its pid
// written, so hosts that start together neither remove nor lock each
// other's. It returns the directories it removed, whoever's they were.
func OpenSocketDir(parent, owner string) (*SocketDir, []StaleSocketDir, error) {
	if parent == "" {
		parent = os.TempDir()
	}
	if strings.Contains(owner, "\n") {
		return nil, nil, fmt.Errorf("socket directory owner %q: a newline", owner)
	}
	removed, err := removeStaleSocketDirs(parent)
	if err != nil {
		return nil, removed, err
	}
	// A suffix is unique among the directories being created, not among
	// the renamed ones: on a clash, try another.
	for range 3 {
		d, err := newSocketDir(parent, owner)
		if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
			continue
		}
		return d, removed, err
	}
	return nil, removed, errors.New("socket directory: no free name")
}

// newSocketDir creates, locks and names a socket directory in parent.
// Its lock file holds the pid, and owner on a line of its own.
func newSocketDir(parent, owner string) (*SocketDir, error) {
	tmp, err := os.MkdirTemp(parent, socketDirNewPrefix) // mode 0700
	if err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(tmp, socketDirLock), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			_, err = lock.WriteString(strconv.Itoa(os.Getpid()) + "\n" + owner + "\n")
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

func removeStaleSocketDirs(parent string) ([]StaleSocketDir, error) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return nil, fmt.Errorf("scan for stale socket directories: %w", err)
	}
	var removed []StaleSocketDir
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), socketDirPrefix) || e.Type() != fs.ModeDir {
			continue // e.Type() is the entry itself: a symlink is not followed
		}
		dir := filepath.Join(parent, e.Name())
		stale, owner, err := staleSocketDir(dir)
		if err != nil || !stale {
			continue
		}
		sockets := countSockets(dir)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove stale socket directory: %w", err))
			continue
		}
		removed = append(removed, StaleSocketDir{Path: dir, Owner: owner, Sockets: sockets})
	}
	return removed, errors.Join(errs...)
}

// countSockets returns how many Unix sockets dir holds.
func countSockets(dir string) int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if e.Type()&fs.ModeSocket != 0 {
			n++
		}
	}
	return n
}

// staleSocketDir reports whether dir is this user's socket directory of a
// process that has died, and the owner its lock file names.
func staleSocketDir(dir string) (bool, string, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return false, "", err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() || !fi.IsDir() {
		return false, "", nil
	}
	f, err := os.OpenFile(filepath.Join(dir, socketDirLock), os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, "", err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return false, "", nil // held: its process is alive
	}
	// Closing f releases the lock again. The file is a line or two.
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil || len(b) == 0 {
		return false, "", err
	}
	_, rest, _ := strings.Cut(string(b), "\n")
	return true, strings.TrimSuffix(rest, "\n"), nil
}
