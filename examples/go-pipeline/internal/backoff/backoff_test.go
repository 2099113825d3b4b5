package backoff

import (
	"testing"
	"time"
)

func TestCeilingDoublesUpToCap(t *testing.T) {
	p := Policy{Base: time.Second, Cap: 10 * time.Second}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i, w := range want {
		if got := p.Ceiling(i + 1); got != w {
			t.Errorf("Ceiling(%d) = %s, want %s", i+1, got, w)
		}
	}
	if got := p.Ceiling(10_000); got != 10*time.Second {
		t.Errorf("huge attempt: %s", got)
	}
}

func TestDelayIsFullJitter(t *testing.T) {
	p := Policy{Base: time.Second, Cap: time.Minute, Rand: func() float64 { return 0.5 }}
	if got := p.Delay(3); got != 2*time.Second {
		t.Errorf("Delay(3) with r=0.5 = %s, want 2s", got)
	}
	p.Rand = nil
	for i := 0; i < 1000; i++ {
		if d := p.Delay(4); d < 0 || d >= 8*time.Second {
			t.Fatalf("Delay(4) = %s outside [0, 8s)", d)
		}
	}
}
