package config

import (
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	cases := map[string]time.Duration{
		"2":     2 * time.Second,
		"0.5":   500 * time.Millisecond,
		"200ms": 200 * time.Millisecond,
		"1m30s": 90 * time.Second,
	}
	for in, want := range cases {
		got, err := ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "soon", "-3s"} {
		if _, err := ParseDuration(bad); err == nil {
			t.Errorf("ParseDuration(%q) accepted", bad)
		}
	}
}

func TestLoadDefaultsAndPrefetch(t *testing.T) {
	t.Setenv("GOPIPE_CONCURRENCY", "3")
	t.Setenv("GOPIPE_PREFETCH", "")
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.Prefetch != 3 {
		t.Errorf("prefetch defaults to concurrency: got %d", c.Prefetch)
	}
	if c.Lease != 30*time.Second || c.MaxAttempts != 20 {
		t.Errorf("production defaults changed: lease %s, max attempts %d", c.Lease, c.MaxAttempts)
	}
}

func TestLoadRejectsBadValues(t *testing.T) {
	t.Setenv("GOPIPE_LEASE", "2s")
	t.Setenv("GOPIPE_LEASE_RENEW", "3s")
	if _, err := Load(); err == nil {
		t.Error("a renew interval longer than the lease was accepted")
	}
	t.Setenv("GOPIPE_LEASE_RENEW", "1s")
	t.Setenv("GOPIPE_MAX_ATTEMPTS", "many")
	if _, err := Load(); err == nil {
		t.Error("a non-numeric GOPIPE_MAX_ATTEMPTS was accepted")
	}
}
