package main

// event is one committed entry as the stream sends it.
type event struct {
	Version uint64 `json:"version"`
	Hash    string `json:"hash"`
}
