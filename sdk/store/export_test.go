package store

// The test-only entry points under the names storetest gives them, for
// the package's own tests, which cannot import storetest.
var (
	LogEnd        = logEnd
	Rotate        = rotateOnly
	ForeignRecord = foreignRecord
)
