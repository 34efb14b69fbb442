package sdk

import (
	"errors"
	"io/fs"
	"syscall"
)

// FileConfigError is the refusal for err, a failure to use a file or
// directory that the config value at attribute names (a key to read, a
// directory to create), or to accept what it holds. It names attribute
// when the config is at fault: the path itself cannot serve (permission
// denied, not a directory, a directory where a file should be, a
// read-only file system, a name too long), or the file's content is
// wrong (err is no *fs.PathError). It names none when the file system
// may mend (the file missing, as a volume mounted late is; the disk full;
// an I/O error; too many open files), so that the host retries the start
// rather than leave the plugin failed (see ConfigError).
func FileConfigError(attribute string, err error) *ConfigError {
	var pe *fs.PathError
	if errors.As(err, &pe) && !pathRefused(pe.Err) {
		return &ConfigError{Message: attribute + ": " + err.Error()}
	}
	return &ConfigError{Attribute: attribute, Message: err.Error()}
}

// pathRefused reports whether err, a file system call's, says the path
// cannot serve whatever the world does.
func pathRefused(err error) bool {
	for _, e := range []error{fs.ErrPermission, fs.ErrExist, syscall.ENOTDIR, syscall.EISDIR, syscall.EROFS, syscall.ENAMETOOLONG, syscall.ELOOP} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
