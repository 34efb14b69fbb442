package ledger_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
)

// BenchmarkApply measures one group commit of transfers with idempotency
// keys, as the committer makes them: ns/op is per group.
func BenchmarkApply(b *testing.B) {
	for _, group := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("group=%d", group), func(b *testing.B) {
			l, err := ledger.Open(filepath.Join(b.TempDir(), "wallet.db"), ledger.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			const accounts = 64
			var fund []ledger.Op
			for a := range accounts {
				fund = append(fund, ledger.Op{Kind: ledger.KindIssue, To: fmt.Sprintf("src-%d", a), Amount: 1 << 40})
			}
			if _, err := l.Apply(b.Context(), fund); err != nil {
				b.Fatal(err)
			}
			nonces := make([]uint64, accounts)
			ops := make([]ledger.Op, group)
			b.ResetTimer()
			for i := range b.N {
				for j := range ops {
					a := (i*group + j) % accounts
					nonces[a]++
					ops[j] = ledger.Op{Kind: ledger.KindTransfer, From: fmt.Sprintf("src-%d", a), To: fmt.Sprintf("dst-%d", a),
						Amount: 1, Nonce: nonces[a], Idem: &ledger.Idem{Key: fmt.Sprintf("k-%d-%d", i, j)}}
				}
				res, err := l.Apply(b.Context(), ops)
				if err != nil || res[0].Err != nil {
					b.Fatal(err, res[0].Err)
				}
			}
			b.ReportMetric(float64(b.N*group)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
