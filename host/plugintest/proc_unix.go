//go:build unix

package plugintest

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// alive reports whether pid is a live, non-zombie process.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// kill sends SIGKILL to pid.
func kill(pid int) { _ = syscall.Kill(pid, syscall.SIGKILL) }
