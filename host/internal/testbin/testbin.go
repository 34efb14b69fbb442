// Package testbin builds plugin binaries for the host's tests and gives
// them a log sink their goroutines can share. It is for tests only: no
// non-test code may import it.
package testbin

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// BuildFirst returns m wrapped so that its Run builds pkgs (paths relative
// to the module root, such as "./plugins/hello") into a new temporary
// directory, stores that directory in *bin, runs the tests and then removes
// the directory. Pass the result to goleak.VerifyTestMain. name, such as
// "catalog", labels the directory and any error printed to stderr; if the
// build fails, Run returns 1 without running the tests.
func BuildFirst(m *testing.M, name string, bin *string, pkgs ...string) interface{ Run() int } {
	return buildFirst{m: m, name: name, bin: bin, pkgs: pkgs}
}

type buildFirst struct {
	m    *testing.M
	name string
	bin  *string
	pkgs []string
}

func (b buildFirst) Run() int {
	dir, err := os.MkdirTemp("", "plughost-"+b.name+"-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s test: %v\n", b.name, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := Build(dir, b.pkgs...); err != nil {
		fmt.Fprintf(os.Stderr, "%s test: build plugins: %v\n", b.name, err)
		return 1
	}
	*b.bin = dir
	return b.m.Run()
}

// Build builds each package (a path relative to the module root) into dir,
// named after its last path element.
func Build(dir string, pkgs ...string) error {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	cmd := exec.Command("go", append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// SyncBuffer is a bytes.Buffer that is safe for concurrent writers, such as
// a plugin's stdio goroutines or the host's. The zero value is ready to use.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
