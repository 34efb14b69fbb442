package sdk

import "errors"

// ErrStorageCorrupt is the error a plugin's Configure hook wraps when it
// finds its stored data corrupt and must not serve it:
//
//	return fmt.Errorf("%w: wallet.db.wal.1 record 17 at offset 20: checksum mismatch; restore from backup or run `wallet check -repair`", sdk.ErrStorageCorrupt)
//
// The host then shows the plugin as failed, with the hook's error as its
// last_error, and does not restart it: starting again would find the same
// damage. An operator repairs or restores the data and restarts the plugin
// (POST /v1/plugins/NAME/restart) or reloads the host. Say in the message
// which file and where, and what the operator can do; it is the whole of
// what the operator sees.
var ErrStorageCorrupt = errors.New("storage corrupt")
