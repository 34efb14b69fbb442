//go:build !linux

package store

import bolt "go.etcd.io/bbolt"

// dropMapped leaves the memory map as it is off Linux.
func dropMapped(*bolt.Tx) error { return nil }

// dropResident leaves the memory map as it is off Linux.
func (d *DB) dropResident() {}
