package catalog

import "syscall"

// sysProcAttr asks the kernel to SIGKILL the plugin when the host dies, so
// no plugin outlives a host killed with SIGKILL. The SDK's parent watch
// covers the case where the forking thread, not the host, goes away.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// killNow sends SIGKILL to the process pid.
func killNow(pid int) { _ = syscall.Kill(pid, syscall.SIGKILL) }
