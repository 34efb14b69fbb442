package main

import (
	"testing"

	"github.com/plughost/plughost/host/config"
)

// TestFitConns: a max_conns beyond the descriptor room is lowered to it,
// and a defaulted max_conns_per_ip follows at a quarter, while one the
// file sets stays as set.
func TestFitConns(t *testing.T) {
	tests := []struct {
		name               string
		limits             config.Limits
		room               uint64
		wantMax, wantPerIP int
	}{
		{"fits", config.Limits{MaxConns: 10000, MaxConnsPerIP: 2500, MaxConnsPerIPDefault: true}, 10000, 10000, 2500},
		{"lowered default", config.Limits{MaxConns: 10000, MaxConnsPerIP: 2500, MaxConnsPerIPDefault: true}, 9999, 9999, 2500},
		{"lowered far", config.Limits{MaxConns: 10000, MaxConnsPerIP: 2500, MaxConnsPerIPDefault: true}, 256, 256, 64},
		{"lowered set", config.Limits{MaxConns: 10000, MaxConnsPerIP: 100}, 256, 256, 100},
		{"lowered no cap", config.Limits{MaxConns: 10000, MaxConnsPerIP: 0}, 256, 256, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotMax, gotPerIP := fitConns(tt.limits, tt.room)
			if gotMax != tt.wantMax || gotPerIP != tt.wantPerIP {
				t.Errorf("fitConns(%+v, %d) = %d, %d; want %d, %d",
					tt.limits, tt.room, gotMax, gotPerIP, tt.wantMax, tt.wantPerIP)
			}
		})
	}
}
