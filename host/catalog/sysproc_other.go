//go:build !linux

package catalog

import "syscall"

// sysProcAttr returns nil where there is no parent-death signal; the SDK's
// parent watch makes plugins exit when their host is gone.
func sysProcAttr() *syscall.SysProcAttr { return nil }
