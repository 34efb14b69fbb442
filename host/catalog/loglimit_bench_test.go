package catalog

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// BenchmarkFloodedLineLogger measures the host's cost of a line of a
// plugin's stdout flood: 1 KiB chunks, as go-plugin's stdio stream
// carries them, of 72-byte lines, nearly all over the limit.
func BenchmarkFloodedLineLogger(b *testing.B) {
	line := append(bytes.Repeat([]byte("x"), 71), '\n')
	chunk := bytes.Repeat(line, 1024/len(line))
	logger := hclog.New(&hclog.LoggerOptions{Output: io.Discard})
	w := newLineLogger(logger, "stdout", newLogLimiter(LogLimit{Rate: 200, Burst: 1000}, hclog.NewNullLogger(), time.Now))
	defer w.limit.close()
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		_, _ = w.Write(chunk)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(len(chunk)/len(line))), "ns/line")
}
