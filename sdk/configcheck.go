package sdk

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// ConfigChecker checks the config values a Schema cannot bound (a number
// that must be whole and in a range, a duration in a range) and keeps the
// first refusal, so that a Configure hook checks every value in a row and
// asks once for the outcome:
//
//	var c sdk.ConfigChecker
//	s.workers = c.Whole("workers", cfg.Workers, 1, 64)
//	s.timeout = c.Duration("retry.timeout", cfg.Retry.Timeout, time.Millisecond, time.Minute)
//	if err := c.Err(); err != nil {
//		return err
//	}
//
// Each method takes the path of what it checks, as ConfigError.Attribute
// writes it (see ParseConfigPath), so that the host points its diagnostic
// there. Once a value is refused the later ones are still checked, but
// only the first refusal is kept: the operator fixes one thing at a time,
// in the order the hook checks them. The zero value is ready to use; a
// ConfigChecker is not safe for concurrent use.
type ConfigChecker struct {
	err *ConfigError
}

// Whole returns v, a TypeNumber attribute's value, as an int when it is a
// whole number from lo to hi. Otherwise it refuses path with "must be a
// whole number from LO to HI, got V" and returns lo, so that the caller
// can go on checking with a value in range.
func (c *ConfigChecker) Whole(path string, v float64, lo, hi int) int {
	if v != math.Trunc(v) || v < float64(lo) || v > float64(hi) {
		c.Refuse(path, "must be a whole number from %d to %d, got %s", lo, hi, number(v))
		return lo
	}
	return int(v)
}

// number formats v as the operator would write it: 10000001, not
// 1.0000001e+07, up to where digits stop meaning anything.
func number(v float64) string {
	if math.Abs(v) < 1e21 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Duration returns d, a TypeDuration attribute's value, when it is from
// lo to hi. Otherwise it refuses path with "must be from LO to HI, got D"
// and returns lo.
func (c *ConfigChecker) Duration(path string, d Duration, lo, hi time.Duration) time.Duration {
	if d.Std() < lo || d.Std() > hi {
		c.Refuse(path, "must be from %v to %v, got %v", lo, hi, d.Std())
		return lo
	}
	return d.Std()
}

// Refuse refuses path with a message formatted as fmt.Sprintf does, for a
// check of the plugin's own, unless a refusal is already kept.
func (c *ConfigChecker) Refuse(path, format string, args ...any) {
	if c.err == nil {
		c.err = &ConfigError{Attribute: path, Message: fmt.Sprintf(format, args...)}
	}
}

// Err returns the first refusal, an *ConfigError, or nil when every value
// passed.
func (c *ConfigChecker) Err() error {
	if c.err == nil {
		return nil
	}
	return c.err
}
