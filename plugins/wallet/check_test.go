package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
)

// walletBinary builds the plugin's binary and returns its path.
func walletBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "wallet")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runBinary runs bin with args and returns its output and exit status.
func runBinary(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), bin, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("run %v: %v", args, err)
	return "", 0
}

// crashedDataDir returns a data dir holding what kill -9 of a wallet
// leaves: five groups in the write-ahead log, none checkpointed. It also
// returns the data dir of the ledger, still open.
func crashedDataDir(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	l, err := ledger.Open(filepath.Join(dir, "wallet.db"), ledger.Options{CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	for i := range 5 {
		op := ledger.Op{Kind: ledger.KindIssue, To: "a", Amount: 10, Idem: &ledger.Idem{Key: fmt.Sprintf("k%d", i)}}
		if _, err := l.Apply(t.Context(), []ledger.Op{op}); err != nil {
			t.Fatal(err)
		}
	}
	image := t.TempDir()
	for _, name := range []string{"wallet.db", "wallet.db.wal", "wallet.db.wal.1"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(image, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return image, dir
}

// TestCheckCommand runs "wallet check" from the built binary against a
// healthy data dir, a damaged one, with -repair, against a running
// wallet's files and with bad usage.
func TestCheckCommand(t *testing.T) {
	bin := walletBinary(t)
	healthy, runningDir := crashedDataDir(t)
	if out, code := runBinary(t, bin, "check", healthy); code != 0 || !strings.Contains(out, "healthy, seq 5") {
		t.Errorf("check of a healthy dir = %d:\n%s\nwant 0 and healthy at seq 5", code, out)
	}
	// The open ledger holds its dir's lock, as a running wallet does.
	if out, code := runBinary(t, bin, "check", "-data-dir", runningDir); code != 1 || !strings.Contains(out, "the wallet is running; stop it first") {
		t.Errorf("check of a running wallet's dir = %d:\n%s\nwant 1 and to stop it first", code, out)
	}

	damaged, _ := crashedDataDir(t)
	logFile := ""
	for _, name := range []string{"wallet.db.wal", "wallet.db.wal.1"} {
		data, err := os.ReadFile(filepath.Join(damaged, name))
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > 40 && data[0]|data[1]|data[2]|data[3] != 0 {
			data[20] ^= 0xff // in record 0, the start record, with five acknowledged records after it
			if err := os.WriteFile(filepath.Join(damaged, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
			logFile = name
		}
	}
	out, code := runBinary(t, bin, "check", damaged)
	if code != 1 || !strings.Contains(out, "problem: "+logFile+" record 0 at offset 0") || !strings.Contains(out, "a repair drops: "+logFile+" records 0 to 5") {
		t.Errorf("check of a damaged dir = %d:\n%s\nwant 1, the problem in %s record 0 and the records a repair drops", code, out, logFile)
	}
	out, code = runBinary(t, bin, "check", "-repair", damaged)
	if code != 0 || !strings.Contains(out, "dropped: "+logFile+" records 0 to 5") || !strings.Contains(out, "from seq 1 (tx_0000000000000001) to seq 5") || !strings.Contains(out, "repaired") {
		t.Errorf("check -repair = %d:\n%s\nwant 0 and records 0 to 5, seqs 1 to 5 dropped", code, out)
	}
	if out, code := runBinary(t, bin, "check", damaged); code != 0 {
		t.Errorf("check after -repair = %d:\n%s\nwant 0", code, out)
	}
	for _, args := range [][]string{{"check"}, {"check", "a", "b"}, {"check", "-bogus", damaged}} {
		if out, code := runBinary(t, bin, args...); code != 2 {
			t.Errorf("wallet %v = %d:\n%s\nwant 2, a usage error", args, code, out)
		}
	}
}

// TestCheckCommandLastRecord runs "wallet check" against a data dir whose
// newest log record, an acknowledged issue whole in the file, has a byte
// flipped: no crash leaves that, so check reports it (exit 1) instead of
// trimming it as torn, and -repair drops it and says which seq is lost.
func TestCheckCommandLastRecord(t *testing.T) {
	bin := walletBinary(t)
	dir, _ := crashedDataDir(t)
	logFile, last := "", 0
	for _, name := range []string{"wallet.db.wal", "wallet.db.wal.1"} {
		p := filepath.Join(dir, name)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		// The records run from offset 0 to a zero header.
		var offs []int
		for off := 0; off+8 <= len(data); {
			n := int(binary.BigEndian.Uint32(data[off:]))
			if n == 0 || off+8+n > len(data) {
				break
			}
			offs = append(offs, off)
			off += 8 + n
		}
		if len(offs) != 6 { // the start record and five groups
			continue
		}
		logFile, last = name, offs[5]
		data[last+20] ^= 0xff
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if logFile == "" {
		t.Fatal("no log file holds the start record and five groups")
	}
	problem := fmt.Sprintf("problem: %s record 5 at offset %d", logFile, last)
	out, code := runBinary(t, bin, "check", dir)
	if code != 1 || !strings.Contains(out, problem) || strings.Contains(out, "torn tail") || !strings.Contains(out, "a repair drops: "+logFile+" records 5 to 5") {
		t.Errorf("check of a flipped last record = %d:\n%s\nwant 1, %q and record 5 to drop", code, out, problem)
	}
	out, code = runBinary(t, bin, "check", "-repair", dir)
	if code != 0 || !strings.Contains(out, "dropped: "+logFile+" records 5 to 5") || !strings.Contains(out, "from seq 5 (tx_0000000000000005) to an unknown last seq") || !strings.Contains(out, "repaired; the wallet opens at seq 4") {
		t.Errorf("check -repair = %d:\n%s\nwant 0, record 5 and seq 5 dropped, the wallet at seq 4", code, out)
	}
	if out, code := runBinary(t, bin, "check", dir); code != 0 || !strings.Contains(out, "healthy, seq 4") {
		t.Errorf("check after -repair = %d:\n%s\nwant 0 and healthy at seq 4", code, out)
	}
}

// TestCheckCommandFlips runs "wallet check" from the built binary against
// copies of a crashed data dir holding checkpointed transfers, each with
// one byte of wallet.db flipped, at every page the file uses: check
// reports healthy (exit 0) or names the damage in wallet.db (exit 1),
// and never crashes (a Go panic exits 2, as a usage error does).
func TestCheckCommandFlips(t *testing.T) {
	bin := walletBinary(t)
	dir := t.TempDir()
	l, err := ledger.Open(filepath.Join(dir, "wallet.db"), ledger.Options{CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	for g := range 40 {
		var ops []ledger.Op
		for i := range 25 {
			ops = append(ops, ledger.Op{Kind: ledger.KindIssue, To: fmt.Sprintf("acct-%03d", (g*25+i)%300), Amount: 10,
				Idem: &ledger.Idem{Key: fmt.Sprintf("k-%d-%d", g, i)}})
		}
		if _, err := l.Apply(t.Context(), ops); err != nil {
			t.Fatal(err)
		}
		if g == 35 {
			if err := l.Checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
	}
	files := map[string][]byte{}
	for _, name := range []string{"wallet.db", "wallet.db.wal", "wallet.db.wal.1"} {
		if files[name], err = os.ReadFile(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	// Every page of the file that holds anything, and in each a byte
	// that moves from page to page: headers, elements, keys and values.
	db := files["wallet.db"]
	const pageSize = 4096
	var offs []int
	for pg := 0; (pg+1)*pageSize <= len(db); pg++ {
		page := db[pg*pageSize : (pg+1)*pageSize]
		if strings.Trim(string(page), "\x00") == "" {
			continue
		}
		at := 64 + (pg*397)%(pageSize-64)
		if pg%3 == 0 {
			at = (pg * 16) % 64
		}
		offs = append(offs, pg*pageSize+at)
	}
	if len(offs) < 20 {
		t.Fatalf("wallet.db uses %d pages, want a tree of several", len(offs))
	}
	codes := map[int]int{}
	for _, off := range offs {
		image := t.TempDir()
		for name, data := range files {
			if name == "wallet.db" {
				data = append([]byte(nil), data...)
				data[off] ^= 0xff
			}
			if err := os.WriteFile(filepath.Join(image, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		out, code := runBinary(t, bin, "check", image)
		codes[code]++
		switch {
		case code != 0 && code != 1, strings.Contains(out, "goroutine "):
			t.Errorf("check with wallet.db byte %d flipped = %d:\n%s\nwant 0 or 1, no crash", off, code, out)
		case code == 1 && !strings.Contains(out, "wallet.db"):
			t.Errorf("check with wallet.db byte %d flipped = 1:\n%s\nwant the damage named in wallet.db", off, out)
		}
	}
	t.Logf("%d flips of wallet.db: exit status counts %v", len(offs), codes)
}
