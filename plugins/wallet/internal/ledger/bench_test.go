package ledger_test

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
)

// BenchmarkApply measures one group commit of transfers with idempotency
// keys, as the committer makes them, with checkpoints when due: ns/op is
// per group. keys=seq uses keys
// that sort in commit order, so their records append; keys=random uses
// random 32-hex-digit keys, as clients that send UUIDs do, so that each
// record lands on its own page of a growing tree.
func BenchmarkApply(b *testing.B) {
	for _, keys := range []string{"seq", "random"} {
		for _, group := range []int{1, 16, 64, 256} {
			b.Run(fmt.Sprintf("keys=%s/group=%d", keys, group), func(b *testing.B) {
				benchmarkApply(b, keys == "random", group)
			})
		}
	}
}

func benchmarkApply(b *testing.B, randomKeys bool, group int) {
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
	rng := rand.New(rand.NewPCG(1, 2))
	key := func(i, j int) string {
		if randomKeys {
			return fmt.Sprintf("%016x%016x", rng.Uint64(), rng.Uint64())
		}
		return fmt.Sprintf("k-%012d-%04d", i, j)
	}
	nonces := make([]uint64, accounts)
	ops := make([]ledger.Op, group)
	b.ResetTimer()
	for i := range b.N {
		for j := range ops {
			a := (i*group + j) % accounts
			nonces[a]++
			ops[j] = ledger.Op{Kind: ledger.KindTransfer, From: fmt.Sprintf("src-%d", a), To: fmt.Sprintf("dst-%d", a),
				Amount: 1, Nonce: nonces[a], Idem: &ledger.Idem{Key: key(i, j)}}
		}
		res, err := l.Apply(b.Context(), ops)
		if err != nil || res[0].Err != nil {
			b.Fatal(err, res[0].Err)
		}
		// As the committer does between groups.
		if l.CheckpointDue() {
			if err := l.Checkpoint(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N*group)/b.Elapsed().Seconds(), "ops/s")
}
