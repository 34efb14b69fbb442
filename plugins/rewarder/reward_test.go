package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// goldenCases are the shared vectors: each is the body of a compute
// request for epoch NAME; testdata/golden/NAME.run.json and
// NAME.commitment hold the artifacts it must give, byte for byte.
var goldenCases = []struct{ name, body string }{
	{"even", `{"pool_account":"pool","pool_amount":1000,"contributions":[{"account":"a","weight":1},{"account":"b","weight":1},{"account":"c","weight":1},{"account":"d","weight":1}]}`},
	// 100/3 each, remainder 1 goes to the first account by id.
	{"ties", `{"pool_account":"pool","pool_amount":100,"contributions":[{"account":"c","weight":7},{"account":"a","weight":7},{"account":"b","weight":7}]}`},
	// Remainders differ: largest first, whatever the order sent.
	{"remainders", `{"pool_account":"pool","pool_amount":10,"contributions":[{"account":"x","weight":1},{"account":"y","weight":2},{"account":"z","weight":4}]}`},
	// A pool smaller than the recipients: some get 0 (and no leg).
	{"dust", `{"pool_account":"pool","pool_amount":2,"contributions":[{"account":"a","weight":1},{"account":"b","weight":1},{"account":"c","weight":1},{"account":"d","weight":1},{"account":"e","weight":1}]}`},
	// pool × weight past 2^64: the 128-bit product keeps it exact.
	{"wide", `{"pool_account":"pool","pool_amount":18446744073709551615,"contributions":[{"account":"big","weight":18446744073709551614},{"account":"small","weight":1}]}`},
}

// TestGolden checks the shared vectors: fixed inputs give byte-identical
// run.json and commitment, whatever the worker count and the order of the
// contributions. go test -run TestGolden -update rewrites them.
func TestGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			in, err := decodeInputs(strings.NewReader(tc.body), 1000)
			if err != nil {
				t.Fatal(err)
			}
			runPath := filepath.Join("testdata", "golden", tc.name+".run.json")
			comPath := filepath.Join("testdata", "golden", tc.name+".commitment")
			for _, workers := range []int{1, 2, 3, 8} {
				shuffled := slices.Clone(in.Contributions)
				rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				in2 := Inputs{PoolAccount: in.PoolAccount, PoolAmount: in.PoolAmount, Contributions: shuffled}
				canonical, inputsHash := seal(tc.name, in2)
				var s sealed
				if err := json.Unmarshal(canonical, &s); err != nil {
					t.Fatal(err)
				}
				payouts, err := compute(s.PoolAmount, s.Contributions, workers)
				if err != nil {
					t.Fatalf("compute with %d workers: %v", workers, err)
				}
				got, commitment := artifacts(tc.name, inputsHash, in2, payouts)
				if *update && workers == 1 {
					must(t, os.WriteFile(runPath, got, 0o644))
					must(t, os.WriteFile(comPath, []byte(commitment+"\n"), 0o644))
				}
				want, err := os.ReadFile(runPath)
				must(t, err)
				wantCom, err := os.ReadFile(comPath)
				must(t, err)
				if !bytes.Equal(got, want) {
					t.Errorf("run.json with %d workers =\n%s\nwant\n%s", workers, got, want)
				}
				if commitment+"\n" != string(wantCom) {
					t.Errorf("commitment with %d workers = %s, want %s", workers, commitment, wantCom)
				}
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestComputeProperties checks random epochs against the rules: the
// payouts add up to the pool, each is its floor share or one more, the
// extra units go to the largest remainders (ties by account), and the
// worker count changes nothing.
func TestComputeProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 300 {
		count := 1 + rng.IntN(50)
		cs := make([]Contribution, count)
		for i := range cs {
			cs[i] = Contribution{Account: fmt.Sprintf("acct-%03d", i), Weight: 1 + rng.Uint64N(1<<uint(1+rng.IntN(40)))}
		}
		pool := 1 + rng.Uint64N(1<<uint(1+rng.IntN(63)))
		want, err := compute(pool, cs, 1)
		if err != nil {
			t.Fatalf("case %d: %v", n, err)
		}
		got, err := compute(pool, cs, 1+rng.IntN(8))
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("case %d: the worker count changed the payouts", n)
		}
		var sum, total float64
		var usum uint64
		for i, p := range want {
			usum += p.Amount
			total += float64(cs[i].Weight)
		}
		if usum != pool {
			t.Fatalf("case %d: payouts add up to %d, pool %d", n, usum, pool)
		}
		for i, p := range want {
			share := float64(pool) * float64(cs[i].Weight) / total
			if math.Abs(float64(p.Amount)-share) > 1+share*1e-9 {
				t.Fatalf("case %d: %s gets %d, share %.3f", n, p.Account, p.Amount, share)
			}
			sum += share
		}
	}
}

// TestComputeQuarantines checks each reason the computation refuses for.
func TestComputeQuarantines(t *testing.T) {
	tests := []struct {
		name   string
		pool   uint64
		cs     []Contribution
		tamper func([]Payout)
		reason string
	}{
		{"no contributions", 10, nil, nil, reasonZeroWeight},
		{"duplicate", 10, []Contribution{{"a", 1}, {"a", 2}}, nil, reasonDuplicate},
		{"weights overflow", 10, []Contribution{{"a", math.MaxUint64}, {"b", 1}}, nil, reasonOverflow},
		{"one unit too many", 10, []Contribution{{"a", 1}, {"b", 1}}, func(p []Payout) { p[0].Amount++ }, reasonConservation},
		{"one unit too few", 10, []Contribution{{"a", 1}, {"b", 1}}, func(p []Payout) { p[1].Amount-- }, reasonConservation},
		{"payouts overflow", 10, []Contribution{{"a", 1}, {"b", 1}}, func(p []Payout) { p[0].Amount = math.MaxUint64 }, reasonConservation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tamper = tt.tamper
			t.Cleanup(func() { tamper = nil })
			_, err := compute(tt.pool, tt.cs, 2)
			var q *quarantineError
			if !errors.As(err, &q) || q.reason != tt.reason {
				t.Fatalf("compute = %v, want quarantine %s", err, tt.reason)
			}
		})
	}
}

// TestDecodeInputs checks the limits, each answered with its field.
func TestDecodeInputs(t *testing.T) {
	long := strings.Repeat("a", maxAccountLen+1)
	tests := []struct {
		body, field string
	}{
		{`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"a","weight":1}]}`, ""},
		{`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"a","weight":1}],"x":1}`, "body"},
		{`{"pool_account":"p","pool_amount":0,"contributions":[]}`, "pool_amount"},
		{`{"pool_account":"p","pool_amount":-1,"contributions":[]}`, "pool_amount"},
		{`{"pool_account":"p","pool_amount":18446744073709551616,"contributions":[]}`, "pool_amount"},
		{`{"pool_account":"","pool_amount":5,"contributions":[]}`, "pool_account"},
		{`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"` + long + `","weight":1}]}`, "contributions[0].account"},
		{`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"a/b","weight":1}]}`, "contributions[0].account"},
		{`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"p","weight":1}]}`, "contributions[0].account"},
		{`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"a","weight":0}]}`, "contributions[0].weight"},
		{`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"a","weight":1.5}]}`, "contributions[0].weight"},
		{`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"a","weight":1},{"account":"b","weight":-1}]}`, "contributions[1].weight"},
		{`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"a","weight":1},{"account":7,"weight":1}]}`, "contributions[1].account"},
		{`{"pool_account":"p","pool_amount":5,"contributions":5}`, "contributions"},
		{`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"a","weight":1},{"account":"b","weight":1},{"account":"c","weight":1}]}`, "contributions"},
		{`{"pool_account":"p","pool_amount":5,"contributions":[]} {}`, "body"},
		{`[`, "body"},
	}
	for _, tt := range tests {
		_, err := decodeInputs(strings.NewReader(tt.body), 2)
		var fe *FieldError
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("decodeInputs(%.60q) = %v, want nil", tt.body, err)
		case tt.field != "" && (!errors.As(err, &fe) || fe.Field != tt.field):
			t.Errorf("decodeInputs(%.60q) = %v, want an error about %s", tt.body, err, tt.field)
		}
	}
	// A value of the wrong type says what it was, at its index.
	_, err := decodeInputs(strings.NewReader(`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"a","weight":1},{"account":"b","weight":-3}]}`), 2)
	if got, want := fmt.Sprint(err), "contributions[1].weight: must be a uint64, got number -3"; got != want {
		t.Errorf("decodeInputs(negative weight) = %s, want %s", got, want)
	}
}
