package ledger_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/wallettest"
	"github.com/plughost/plughost/sdk/store"
)

// The helper process of TestConvertKilled: the data dir's ledger, and at
// which fsync it kills itself.
const (
	convertPathEnv = "LEDGER_TEST_CONVERT_PATH"
	convertKillEnv = "LEDGER_TEST_CONVERT_KILL_AT"
)

// TestConvertKilled converts the previous release's crashed data dir
// (testdata/release-1.tar.gz) in a helper process that kills itself with
// SIGKILL at its n-th fsync, for every n up to the first run that is not
// killed: the conversion's sync of the new file (not yet in place), of
// the directory after the rename, then those of the first open and
// close. After each kill the data dir opens, in this process, with every
// committed operation: either the old files are still there and convert
// now, or the store is, and nothing converts.
func TestConvertKilled(t *testing.T) {
	if path := os.Getenv(convertPathEnv); path != "" {
		convertChild(t, path)
		return
	}
	seen := map[bool]int{}
	defer func() { t.Logf("kills left the old files %d times, the store %d times", seen[true], seen[false]) }()
	for n := 1; ; n++ {
		path, written, _ := convertKilled(t, n, 0)
		if path == "" {
			break
		}
		old := oldFormat(t, path)
		seen[old]++
		checkKilled(t, path, written, fmt.Sprintf("killed at fsync %d", n), old)
	}
	// The first fsync is the new file's, before it is in place; the
	// second the directory's, after.
	if seen[true] != 1 || seen[false] < 2 {
		t.Errorf("kills left the old files %d times and the store %d times, want once and at least twice", seen[true], seen[false])
	}
	// The same at random moments, within as long as a whole run takes:
	// while the old files are read and the new one written, too.
	_, _, took := convertKilled(t, 0, 0)
	randomly := map[bool]int{}
	defer func() {
		t.Logf("kills at random moments left the old files %d times, the store %d times", randomly[true], randomly[false])
	}()
	for range 10 {
		after := rand.N(took)
		if path, written, _ := convertKilled(t, 0, after); path != "" {
			old := oldFormat(t, path)
			randomly[old]++
			checkKilled(t, path, written, fmt.Sprintf("killed %v after its start", after), old)
		}
	}
}

// convertKilled runs the helper process on a new copy of the crashed
// data dir, killed at its n-th fsync if n > 0, or after after if that is
// not zero, and returns the ledger's path ("" if the process was not
// killed), when the data dir was written, and how long the process ran.
func convertKilled(t *testing.T, n int, after time.Duration) (string, time.Time, time.Duration) {
	t.Helper()
	dir, written := untar(t, "testdata/release-1.tar.gz")
	path := filepath.Join(dir, "crashed", "wallet.db")
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestConvertKilled$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), convertPathEnv+"="+path, convertKillEnv+"="+strconv.Itoa(n))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if after > 0 {
		timer := time.AfterFunc(after, func() { _ = cmd.Process.Kill() })
		defer timer.Stop()
	}
	err := cmd.Wait()
	took := time.Since(start)
	var ee *exec.ExitError
	killed := errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
	switch {
	case err != nil && !killed:
		t.Fatalf("helper process: %v\n%s", err, out.String())
	case !killed && !strings.Contains(out.String(), "converted"):
		t.Fatalf("the helper process that ran to the end did not convert:\n%s", out.String())
	case !killed:
		return "", written, took
	}
	return path, written, took
}

// checkKilled opens the ledger at path, which a killed conversion left,
// and checks that it holds every committed operation, and that it
// converts exactly when the old files were left.
func checkKilled(t *testing.T, path string, written time.Time, what string, old bool) {
	t.Helper()
	l := open(t, path, ledger.Options{Now: wallettest.NewClock(written).Now})
	if l.Converted() != old {
		t.Errorf("%s: the old files left %v, but Open converted %v", what, old, l.Converted())
	}
	for id, want := range map[string]ledger.Account{"alice": {ID: "alice", Balance: 600, Nonce: 2}, "dave": {ID: "dave", Balance: 7}} {
		if got := account(t, l, id); got != want {
			t.Errorf("%s: account %s = %+v, want %+v", what, id, got, want)
		}
	}
	if a := checkAudit(t, l); a.Issued != 1007 || a.Seq != 5 {
		t.Errorf("%s: Audit = %+v, want issued 1007, seq 5", what, a)
	}
	for _, k := range []string{"k1", "k3"} {
		if rec, ok, err := l.Idempotency(k); err != nil || !ok || rec.Status != 200 {
			t.Errorf("%s: Idempotency(%q) = %+v, %v, %v, want its recorded 200", what, k, rec, ok, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// convertChild opens the ledger at path, which converts it, killing the
// process at the fsync convertKillEnv names.
func convertChild(t *testing.T, path string) {
	at, err := strconv.Atoi(os.Getenv(convertKillEnv))
	if err != nil {
		t.Fatal(err)
	}
	hooks := &store.Hooks{}
	var n atomic.Int64
	hooks.SetSync(func(f *os.File) error {
		if n.Add(1) == int64(at) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return f.Sync()
	})
	l, err := ledger.Open(path, ledger.Options{Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	if l.Converted() {
		t.Log("converted")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// oldFormat reports whether the ledger file at path is still of the
// release before the store: meta "format" is 8 bytes from 1 to 4.
func oldFormat(t *testing.T, path string) bool {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var old bool
	_ = db.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket([]byte("meta")); m != nil {
			v := m.Get([]byte("format"))
			old = len(v) == 8 && binary.BigEndian.Uint64(v) >= 1 && binary.BigEndian.Uint64(v) <= 4
		}
		return nil
	})
	return old
}
