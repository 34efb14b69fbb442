package shed

import (
	"testing"
	"time"
)

func TestLevels(t *testing.T) {
	t0 := time.Unix(0, 0)
	tests := []struct {
		name  string
		steps []struct {
			at   time.Duration
			load float64
			want int
		}
	}{
		{"rises at once", []struct {
			at   time.Duration
			load float64
			want int
		}{{0, 0.1, None}, {1, 0.5, OverShareWrites}, {2, 0.75, Writes}, {3, 0.95, All}, {4, 0.2, All}}},
		{"hovering at a threshold does not flap", []struct {
			at   time.Duration
			load float64
			want int
		}{{0, 0.5, OverShareWrites}, {100 * time.Millisecond, 0.49, OverShareWrites}, {5 * time.Second, 0.3, OverShareWrites}, {6 * time.Second, 0.5, OverShareWrites}, {20 * time.Second, 0.26, OverShareWrites}}},
		{"falls one step per hold below the margin", []struct {
			at   time.Duration
			load float64
			want int
		}{{0, 0.95, All}, {time.Second, 0.1, All}, {2*time.Second - 1, 0.1, All}, {2 * time.Second, 0.1, Writes}, {3*time.Second - 1, 0.1, Writes}, {3 * time.Second, 0.1, OverShareWrites}, {4 * time.Second, 0.1, None}}},
		{"a rise during the hold restarts it", []struct {
			at   time.Duration
			load float64
			want int
		}{{0, 0.6, OverShareWrites}, {time.Second, 0.1, OverShareWrites}, {2 * time.Second, 0.4, OverShareWrites}, {3 * time.Second, 0.1, OverShareWrites}, {3500 * time.Millisecond, 0.1, OverShareWrites}, {4 * time.Second, 0.1, None}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(time.Second)
			for _, st := range tt.steps {
				if got := s.Update(t0.Add(st.at), st.load); got != st.want {
					t.Fatalf("Update(%v, %v) = %d, want %d", st.at, st.load, got, st.want)
				}
			}
		})
	}
}

func TestShed(t *testing.T) {
	tests := []struct {
		level            int
		write, overShare bool
		want             bool
	}{
		{None, true, true, false},
		{OverShareWrites, true, true, true},
		{OverShareWrites, true, false, false},
		{OverShareWrites, false, true, false},
		{Writes, true, false, true},
		{Writes, false, true, false},
		{All, false, false, true},
	}
	for _, tt := range tests {
		if got := Shed(tt.level, tt.write, tt.overShare); got != tt.want {
			t.Errorf("Shed(%d, write %v, over share %v) = %v, want %v", tt.level, tt.write, tt.overShare, got, tt.want)
		}
	}
}
