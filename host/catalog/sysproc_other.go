//go:build !linux

package catalog

import (
	"os"
	"syscall"
)

// sysProcAttr returns nil where there is no parent-death signal; the SDK's
// parent watch makes plugins exit when their host is gone.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// killNow ends the process pid at once.
func killNow(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}
