package config

import (
	"time"

	"github.com/hashicorp/hcl/v2"
)

// Defaults and bounds of the connection and stream limits.
const (
	defaultMaxConns           = 10000
	defaultStreamWriteTimeout = 30 * time.Second
	// As Kubernetes' API server bounds its long-running requests (watches)
	// by default: an idle stream cannot hold a plugin's stream slot for
	// ever, and a client reconnects every half hour.
	defaultStreamMaxLifetime = 30 * time.Minute
	defaultStreamBuffer      = 64 << 10
	defaultMaxStreams        = 1024
	// A stream's credit must hold a few frames' worth, and never more than
	// a plugin built with an older SDK assumes it has (wire.ResponseWindow).
	minStreamBuffer = 4 << 10
	maxStreamBuffer = 256 << 10
)

// DefaultMaxConnsPerIP is max_conns_per_ip when the file does not set
// it: a quarter of maxConns, rounded up, so that one client holding idle
// connections leaves three quarters of the listener to the others.
func DefaultMaxConnsPerIP(maxConns int) int {
	return (maxConns + 3) / 4
}

// connLimits decodes the limits block's connection and stream keys into l,
// defaults first.
func (d *decoder) connLimits(l *Limits, b *limitsBody) {
	l.MaxConns = defaultMaxConns
	l.StreamWriteTimeout = defaultStreamWriteTimeout
	l.StreamMaxLifetime = defaultStreamMaxLifetime
	l.StreamBuffer = defaultStreamBuffer
	decodeInt(d, b.MaxConns, &l.MaxConns, 1)
	l.MaxConnsPerIPDefault = b.MaxConnsPerIP == nil
	if l.MaxConnsPerIPDefault {
		l.MaxConnsPerIP = DefaultMaxConnsPerIP(l.MaxConns)
	}
	decodeInt(d, b.MaxConnsPerIP, &l.MaxConnsPerIP, 0)
	decodeInt(d, b.MaxStreamsPerIP, &l.MaxStreamsPerIP, 0)
	d.duration(b.StreamWriteTimeout, &l.StreamWriteTimeout)
	d.durationOrZero(b.StreamMaxLifetime, &l.StreamMaxLifetime)
	var buf int64
	if decodeInt(d, b.StreamBuffer, &buf, minStreamBuffer) {
		if buf > maxStreamBuffer {
			d.errorf(b.StreamBuffer.Expr.Range(), "Value out of range",
				"stream_buffer must be at most %d (256 KiB), got %d.", int64(maxStreamBuffer), buf)
		} else {
			l.StreamBuffer = buf
		}
	}
}

// durationOrZero decodes a duration that may be zero ("0" or "0s"), which
// turns the setting off; a negative one is an error.
func (d *decoder) durationOrZero(a *hcl.Attribute, dst *time.Duration) bool {
	return d.parseDuration(a, dst, true)
}
