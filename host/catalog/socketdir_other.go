//go:build !unix

package catalog

// SocketDir is a directory, private to one running host, where go-plugin
// makes the Unix sockets of that host's plugins. Off Unix the host runs no
// plugins, so there is none.
type SocketDir struct{}

// StaleSocketDir is a socket directory OpenSocketDir removed; there are
// none off Unix.
type StaleSocketDir struct {
	Path    string
	Owner   string
	Sockets int
}

// OpenSocketDir returns an empty SocketDir off Unix.
func OpenSocketDir(string, string) (*SocketDir, []StaleSocketDir, error) {
	return &SocketDir{}, nil, nil
}

// Path returns "".
func (d *SocketDir) Path() string { return "" }

// Close does nothing.
func (d *SocketDir) Close() error { return nil }
