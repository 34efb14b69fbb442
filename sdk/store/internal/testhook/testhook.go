// Package testhook carries the store's test-only entry points from
// package store to package storetest, so that they stay out of the
// store's documented API. Package store sets them when it is loaded;
// nothing else may set or call them.
package testhook

// The entry points, with the types package store gives them: db is a
// *store.DB.
var (
	LogEnd        func(db any) (string, int64)
	Rotate        func(db any) error
	ForeignRecord func(gen uint64) []byte
	CopyFiles     func(db any, to string, locked func()) error
)
