package sdk

import (
	"encoding/json"
	"errors"
	"io"
)

// ErrTrailingData is DecodeJSON's error for anything but white space
// after the JSON value.
var ErrTrailingData = errors.New("data after the JSON object")

// DecodeJSON decodes exactly one JSON value from r into v, strictly: a
// member of an object that v has no field for is an error, and so is
// anything but white space after the value (ErrTrailingData). It is the
// decoder of request bodies and of DecodeConfig. Its other errors are
// encoding/json's or r's, unwrapped, for the caller to word and to map
// to a status: a *json.UnmarshalTypeError names the field, a
// *http.MaxBytesError says a body was over its limit (413).
func DecodeJSON(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return ErrTrailingData
	}
	return nil
}
