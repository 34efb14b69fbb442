//go:build !unix

package sdk

import (
	"errors"
	"os"

	"github.com/plughost/plughost/sdk/wire"
)

// takeDataPlane fails where there are no Unix socket pairs: a plughost
// host runs plugins only on Unix, where it can pass them a data plane.
func takeDataPlane() ([]*wire.Conn, error) {
	if _, ok := os.LookupEnv(wire.DataPlaneEnv); !ok {
		return nil, nil
	}
	_ = os.Unsetenv(wire.DataPlaneEnv)
	return nil, errors.New("the data plane needs Unix socket pairs: plughost plugins run only on Unix")
}
