//go:build !unix

package catalog

import (
	"os"

	"github.com/plughost/plughost/sdk/wire"
)

// socketPairs returns no data-plane connections where there are no Unix
// socket pairs; the host then uses Exchange streams.
func socketPairs(int) ([]*wire.Conn, []*os.File, error) { return nil, nil, nil }
