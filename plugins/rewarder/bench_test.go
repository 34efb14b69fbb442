package main

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// BenchmarkCompute100k decodes, seals and computes an epoch of 100,000
// contributions and writes its artifacts' bytes: the CPU side of one
// compute, without the store and the disk.
func BenchmarkCompute100k(b *testing.B) {
	body := benchBody(100_000)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		in, err := decodeInputs(strings.NewReader(body), 200_000)
		if err != nil {
			b.Fatal(err)
		}
		_, h := seal("bench", in)
		// The body lists the accounts in order, as the seal sorts them.
		payouts, err := compute(in.PoolAmount, in.Contributions, runtime.NumCPU())
		if err != nil {
			b.Fatal(err)
		}
		artifacts("bench", h, in, payouts)
	}
}

func benchBody(n int) string {
	var s strings.Builder
	s.WriteString(`{"pool_account":"pool","pool_amount":1000000000007,"contributions":[`)
	for i := range n {
		if i > 0 {
			s.WriteByte(',')
		}
		fmt.Fprintf(&s, `{"account":"acct-%06d","weight":%d}`, i, i%1000+1)
	}
	s.WriteString("]}")
	return s.String()
}
