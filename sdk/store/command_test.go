package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckCommand runs CheckCommand against a healthy store, the files
// of a running one, a damaged log before and after -repair, a store its
// Verify refuses, and bad usage.
func TestCheckCommand(t *testing.T) {
	run := func(c CheckCommand, args ...string) (int, string) {
		t.Helper()
		var out bytes.Buffer
		code := c.Run(args, &out, &out)
		return code, out.String()
	}
	cmd := CheckCommand{Name: "notes", File: "s.db", Options: kvOpts,
		Dropped: func(d Drop) []string {
			var lines []string
			for _, g := range d.Groups {
				for _, w := range g {
					lines = append(lines, fmt.Sprintf("lost %s", w.Key))
				}
			}
			return lines
		}}

	healthy := twoGenerations(t)
	if code, out := run(cmd, filepath.Dir(healthy)); code != 0 || !strings.Contains(out, "healthy") {
		t.Errorf("check of a healthy store = %d:\n%s\nwant 0, healthy", code, out)
	}

	running := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(running, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	if code, out := run(cmd, "-data-dir", filepath.Dir(running)); code != 1 || !strings.Contains(out, "the plugin is running; stop it first") {
		t.Errorf("check of a running store = %d:\n%s\nwant 1, running", code, out)
	}

	damaged := twoGenerations(t)
	older, _ := logFiles(t, damaged)
	offs := recordOffsets(t, damaged+older)
	editFile(t, damaged+older, func(b []byte) []byte { b[offs[3]+20] ^= 0xff; return b })
	code, out := run(cmd, filepath.Dir(damaged))
	if code != 1 || !strings.Contains(out, "problem: s.db"+older+" record 3") || !strings.Contains(out, "a repair drops: s.db"+older+" records 3 to") || !strings.Contains(out, "lost key003") {
		t.Errorf("check of a damaged log = %d:\n%s\nwant 1, the problem at record 3, what a repair drops and the keys lost", code, out)
	}
	code, out = run(cmd, "-repair", filepath.Dir(damaged))
	if code != 0 || !strings.Contains(out, "dropped: s.db"+older+" records 3 to") || !strings.Contains(out, "repaired") {
		t.Errorf("check -repair = %d:\n%s\nwant 0, what it dropped, repaired", code, out)
	}
	if code, out := run(cmd, filepath.Dir(damaged)); code != 0 {
		t.Errorf("check after -repair = %d:\n%s\nwant 0", code, out)
	}

	strict := cmd
	strict.Verify = func(s *Snapshot) error {
		if s.Get(0, kvKey(0)) == nil {
			return nil
		}
		return errors.New("key000 must not be there")
	}
	if code, out := run(strict, filepath.Dir(healthy)); code != 1 || !strings.Contains(out, "problem: s.db: key000 must not be there") {
		t.Errorf("check whose Verify fails = %d:\n%s\nwant 1 and its problem", code, out)
	}

	for _, args := range [][]string{nil, {"a", "b"}, {"-bogus", "a"}} {
		if code, out := run(cmd, args...); code != 2 || !strings.Contains(out, "usage: notes check") {
			t.Errorf("check %q = %d:\n%s\nwant 2 and the usage", args, code, out)
		}
	}
	if _, err := os.Stat(healthy); err != nil {
		t.Fatal(err)
	}
}
