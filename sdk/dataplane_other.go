//go:build !unix

package sdk

import (
	"os"

	"github.com/plughost/plughost/sdk/wire"
)

// takeDataPlane returns no connections where there are no Unix socket
// pairs; a host there passes none.
func takeDataPlane() ([]*wire.Conn, error) {
	_ = os.Unsetenv(wire.DataPlaneEnv)
	return nil, nil
}
