//go:build unix

package catalog_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/host/catalog"
)

// TestOpenSocketDir: a host's socket directory is removed at its Close
// and, when the host died, by the next host's OpenSocketDir; nothing that
// is not provably a dead host's directory is touched.
func TestOpenSocketDir(t *testing.T) {
	parent := t.TempDir()
	mk := func(name, lock string) string {
		t.Helper()
		dir := filepath.Join(parent, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "plugin123"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if lock != "" {
			if err := os.WriteFile(filepath.Join(dir, "lock"), []byte(lock), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	// A dead host's: its lock holds a pid and nobody holds the lock.
	// One of an older host names no owner; a newer one's does, and
	// holds its plugins' sockets.
	dead := mk("plughost-sockets-1", "4242\n")
	deadWithSockets := mk("plughost-sockets-7", "4243\n/srv/data\n")
	for _, name := range []string{"plugin1", "plugin2"} {
		ln, err := net.Listen("unix", filepath.Join(deadWithSockets, name))
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
	}
	// Kept: no lock file, an empty one (neither is provably a dead
	// host's), and names that are not ours.
	kept := []string{
		mk("plughost-sockets-2", ""),
		mk("plughost-other-3", "4242\n"),
		mk("plugin-dir4", "4242\n"),
	}
	if err := os.WriteFile(filepath.Join(mk("plughost-sockets-5", ""), "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, filepath.Join(parent, "plughost-sockets-5"))
	// A symlink with our name is not followed.
	target := mk("target", "4242\n")
	if err := os.Symlink(target, filepath.Join(parent, "plughost-sockets-6")); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, target, filepath.Join(parent, "plughost-sockets-6"))
	stray := filepath.Join(parent, "plugin777")
	if err := os.WriteFile(stray, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, stray)

	live, removed, err := catalog.OpenSocketDir(parent, "/srv/other")
	if err != nil {
		t.Fatalf("OpenSocketDir(%s) = %v", parent, err)
	}
	want := []catalog.StaleSocketDir{{Path: dead}, {Path: deadWithSockets, Owner: "/srv/data", Sockets: 2}}
	if diff := cmp.Diff(want, removed); diff != "" {
		t.Errorf("OpenSocketDir removed (-want +got):\n%s", diff)
	}
	for _, d := range []string{dead, deadWithSockets} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("dead host's directory %s: %v, want it removed", d, err)
		}
	}
	for _, p := range kept {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v, want it kept", p, err)
		}
	}
	if !strings.HasPrefix(filepath.Base(live.Path()), "plughost-sockets-") || filepath.Dir(live.Path()) != parent {
		t.Errorf("Path() = %s, want a plughost-sockets-* directory in %s", live.Path(), parent)
	}
	if fi, err := os.Stat(live.Path()); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("Stat(%s) = %v, %v; want a directory only its owner can enter", live.Path(), fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(live.Path(), "lock")); err != nil || string(b) != strconv.Itoa(os.Getpid())+"\n/srv/other\n" {
		t.Errorf("lock file = %q, %v; want this process's pid and its owner", b, err)
	}

	// A second host leaves the live one's directory alone.
	other, removed, err := catalog.OpenSocketDir(parent, "")
	if err != nil {
		t.Fatalf("second OpenSocketDir = %v", err)
	}
	if len(removed) != 0 {
		t.Errorf("second OpenSocketDir removed %+v with the first host alive, want nothing", removed)
	}
	for _, d := range []*catalog.SocketDir{live, other} {
		if err := d.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
		if _, err := os.Stat(d.Path()); !os.IsNotExist(err) {
			t.Errorf("%s after Close: %v, want it removed", d.Path(), err)
		}
	}
}

// TestLaunchSocketDir: with Options.SocketDir the plugin's go-plugin
// socket, the only one its launch makes, is in that directory.
func TestLaunchSocketDir(t *testing.T) {
	dir, _, err := catalog.OpenSocketDir(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dir.Close() })
	inst := launch(t, "hello", catalog.Options{SocketDir: dir.Path(), Host: nil})
	entries, err := os.ReadDir(dir.Path())
	if err != nil {
		t.Fatal(err)
	}
	var sockets []string
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			sockets = append(sockets, e.Name())
		}
	}
	if len(sockets) != 1 {
		t.Errorf("sockets in the socket directory = %q, want the plugin's one", sockets)
	}
	inst.Kill()
}

// TestOpenSocketDirConcurrent: hosts that start at the same time, each
// scanning the directory the others are creating theirs in, all get a
// directory, and none loses its directory to another's scan while it
// runs.
func TestOpenSocketDirConcurrent(t *testing.T) {
	parent := t.TempDir()
	const starters, rounds = 4, 300
	var wg sync.WaitGroup
	errs := make(chan error, starters)
	for range starters {
		wg.Go(func() {
			for range rounds {
				d, _, err := catalog.OpenSocketDir(parent, "")
				if err != nil {
					errs <- fmt.Errorf("OpenSocketDir: %w", err)
					return
				}
				_, serr := os.Stat(filepath.Join(d.Path(), "lock"))
				if err := d.Close(); err != nil {
					errs <- fmt.Errorf("Close: %w", err)
					return
				}
				if serr != nil {
					errs <- fmt.Errorf("own directory while open: %w", serr)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if left, err := os.ReadDir(parent); err != nil || len(left) != 0 {
		t.Errorf("ReadDir(parent) after every Close = %v, %v; want nothing left", left, err)
	}
}
