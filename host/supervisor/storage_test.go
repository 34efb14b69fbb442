package supervisor_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/supervisor"
)

// corruptDetail is what frail reports after sdk.ErrStorageCorrupt, as a
// storage engine would.
const corruptDetail = "wallet.db.wal.1 record 17 at offset 20: checksum mismatch; restore from backup or run `wallet check -repair`"

// frailSpec returns a spec for frail with the files in its data dir
// already written (see its package doc).
func frailSpec(t *testing.T, files map[string]string) supervisor.Spec {
	t.Helper()
	s := spec(t, "frail", "frail", `{}`)
	if err := os.MkdirAll(s.DataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(s.DataDir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// TestStorageCorruptFails checks that a plugin whose Configure reports
// corrupt storage goes straight to failed, with the plugin's message as
// its last error and no restart, and that an operator's restart, once the
// data is repaired, starts it.
func TestStorageCorruptFails(t *testing.T) {
	pol := testPolicy()
	s := frailSpec(t, map[string]string{"corrupt": corruptDetail})
	f := start(t, s, pol)

	st := waitState(t, f.p, supervisor.StateFailed)
	if want := "storage corrupt: " + corruptDetail; st.LastError != want {
		t.Errorf("Status().LastError = %q, want the plugin's message %q", st.LastError, want)
	}
	if st.Restarts != 0 {
		t.Errorf("Status().Restarts = %d, want 0: corrupt storage is not restarted", st.Restarts)
	}
	// Give a restart loop the time to show itself: several initial
	// backoffs, and a health interval.
	deadline := time.Now().Add(pol.HealthInterval + 20*pol.InitialBackoff)
	for time.Now().Before(deadline) {
		if got := f.p.Status(); got.State != supervisor.StateFailed || got.Restarts != 0 {
			t.Fatalf("Status() = %s with %d restarts, want failed with none", got.State, got.Restarts)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if states := f.rec.since(0); slices.Contains(states, supervisor.StateBackoff) {
		t.Errorf("states = %v, want no backoff", states)
	}

	// Repaired, and restarted by an operator: ready.
	if err := os.Remove(filepath.Join(s.DataDir, "corrupt")); err != nil {
		t.Fatal(err)
	}
	f.p.Restart(time.Now().Add(time.Second))
	waitReady(t, f.p)
}

// TestStorageCorruptStandby checks that a replacement whose storage is
// corrupt fails StartStandby with the plugin's message, as any failed
// first attempt does.
func TestStorageCorruptStandby(t *testing.T) {
	opts, _, _ := options(t, testPolicy())
	p, err := supervisor.StartStandby(t.Context(), frailSpec(t, map[string]string{"corrupt": corruptDetail}), opts)
	if err == nil {
		p.Stop(time.Now())
		t.Fatal("StartStandby() = nil error, want the corrupt storage")
	}
	if !strings.Contains(err.Error(), corruptDetail) {
		t.Errorf("StartStandby() = %v, want the plugin's message", err)
	}
}

// TestExitDuringStartSaysWhy checks that a plugin that dies while it is
// configured (a panic the SDK cannot recover) has a last error that says
// it exited during start, how, and its panic message, instead of the
// broken call's EOF.
func TestExitDuringStartSaysWhy(t *testing.T) {
	pol := testPolicy()
	pol.MaxRestarts = 1
	f := start(t, frailSpec(t, map[string]string{"crash": "open bucket: page 7: unexpected flags"}), pol)

	st := waitState(t, f.p, supervisor.StateFailed)
	for _, want := range []string{"plugin exited during start (exit status 2)", "panic: frail: open bucket: page 7: unexpected flags"} {
		if !strings.Contains(st.LastError, want) {
			t.Errorf("Status().LastError = %q, want it to contain %q", st.LastError, want)
		}
	}
	if strings.Contains(st.LastError, "EOF") {
		t.Errorf("Status().LastError = %q, want no EOF", st.LastError)
	}
}
