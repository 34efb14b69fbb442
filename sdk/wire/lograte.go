package wire

import "time"

// LogRateEnv and LogBurstEnv name the environment variables that carry a
// plugin's log_rate and log_burst to its process, as decimal integers. The
// host sets them only when the plugin's output is limited; the SDK then
// drops its logger's records over the same LogBucket before they cross to
// the host, whose own bucket still holds every plugin to the limit.
const (
	LogRateEnv  = "PLUGHOST_LOG_RATE"
	LogBurstEnv = "PLUGHOST_LOG_BURST"
)

// LogUnit is the record size one token of a LogBucket pays for: a longer
// record takes one token per started LogUnit, so that the bucket bounds
// bytes as well as records.
const LogUnit = 4 << 10

// LogBucket is the token bucket over a plugin's log records that the host
// and the SDK both apply: it holds burst tokens, gains rate a second, and
// a record takes one token per started LogUnit of its size. Its zero value
// allows nothing; make one with NewLogBucket. It is not safe for
// concurrent use.
type LogBucket struct {
	rate, burst float64
	tokens      float64
	last        time.Time
}

// NewLogBucket returns a full bucket that refills at rate records a
// second up to burst (at least 1) from now. rate must be positive.
func NewLogBucket(rate, burst int, now time.Time) LogBucket {
	b := float64(max(burst, 1))
	return LogBucket{rate: float64(rate), burst: b, tokens: b, last: now}
}

// Take reports whether a record of size bytes may be logged at now,
// taking its tokens when it may. A record that finds too few takes none.
func (b *LogBucket) Take(size int, now time.Time) bool {
	b.refill(now)
	if c := cost(size); b.tokens >= c {
		b.tokens -= c
		return true
	}
	return false
}

// Charge takes the tokens of a record of size bytes logged at now
// whatever the bucket holds, going into debt if it must: for a record that
// is never dropped, such as the SDK's report of what it dropped, so that
// what the bucket lets through stays within its rate.
func (b *LogBucket) Charge(size int, now time.Time) {
	b.refill(now)
	b.tokens -= cost(size)
}

// refill adds the tokens gained since the last record, up to the burst.
func (b *LogBucket) refill(now time.Time) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(b.burst, b.tokens+d.Seconds()*b.rate)
		b.last = now
	}
}

// cost is the tokens a record of size bytes takes.
func cost(size int) float64 { return float64(max(1, (size+LogUnit-1)/LogUnit)) }

// LogRecordSize estimates the bytes a record of a logger takes, message
// msg and key/value pairs args: its message and its string values, the
// bulk of a plugin's records. Both sides size records with it before
// they format them.
func LogRecordSize(msg string, args []any) int {
	n := len(msg)
	for _, a := range args {
		if s, ok := a.(string); ok {
			n += len(s) + 2
		}
	}
	return n
}

// The SDK's report of the records it dropped over its LogBucket: a
// record at warn level with message LogDroppedMsg and the count under
// LogDroppedKey, which the host adds to the plugin's count of dropped
// records. LogDroppedErrorsKey counts the error-level records among them,
// and LogLastErrorKey quotes the last of those, so that a plugin's last
// words survive a flood.
const (
	LogDroppedMsg       = "dropped log records over the log rate"
	LogDroppedKey       = "records"
	LogDroppedErrorsKey = "errors"
	LogLastErrorKey     = "last_error"
)
