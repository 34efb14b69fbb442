package main

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzDecodeInputs feeds the compute body decoder arbitrary bytes: it
// never panics, and what it accepts seals to canonical bytes that decode
// to the same seal, and computes or quarantines without panicking.
func FuzzDecodeInputs(f *testing.F) {
	for _, tc := range goldenCases {
		f.Add([]byte(tc.body))
	}
	f.Add([]byte(`{"pool_account":"p","pool_amount":1,"contributions":[{"account":"a","weight":1},{"account":"a","weight":1}]}`))
	f.Add([]byte(`{"pool_account":"p","pool_amount":5,"contributions":[{"account":"a","weight":18446744073709551615},{"account":"b","weight":1}]}`))
	f.Add([]byte(`{"pool_account":"p","pool_amount":5,"contributions":null}`))
	f.Add([]byte(`{"pool_account":"p","pool_amount":5e0}`))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, body []byte) {
		in, err := decodeInputs(bytes.NewReader(body), 64)
		if err != nil {
			return
		}
		canonical, h := seal("f", in)
		var s sealed
		if err := json.Unmarshal(canonical, &s); err != nil {
			t.Fatalf("the seal of %q does not decode: %v", body, err)
		}
		again, h2 := seal("f", Inputs{PoolAccount: s.PoolAccount, PoolAmount: s.PoolAmount, Contributions: s.Contributions})
		if h != h2 || !bytes.Equal(canonical, again) {
			t.Fatalf("sealing %q twice differs", body)
		}
		payouts, err := compute(s.PoolAmount, s.Contributions, 2)
		if err != nil {
			return
		}
		var sum uint64
		for _, p := range payouts {
			sum += p.Amount
		}
		if sum != s.PoolAmount {
			t.Fatalf("payouts of %q add up to %d, pool %d", body, sum, s.PoolAmount)
		}
	})
}

// FuzzWalletAnswer feeds the decoding of the wallet's answers (a peer's,
// through the host) arbitrary bytes: neither panics.
func FuzzWalletAnswer(f *testing.F) {
	f.Add([]byte(`{"error":{"code":"nonce_mismatch","message":"m","expected_nonce":3}}`))
	f.Add([]byte(`{"account":"pool","balance":1,"nonce":2}`))
	f.Add([]byte(`{"nonce":-1}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		_, _ = decodeWalletError(body)
		_, _ = decodeNonce(body)
	})
}
