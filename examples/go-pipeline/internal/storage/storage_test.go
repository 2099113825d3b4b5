package storage

import (
	"strings"
	"testing"
	"time"
)

func TestKeys(t *testing.T) {
	at := time.Date(2026, 11, 30, 9, 5, 7, 0, time.FixedZone("x", 3600))
	key := StagingKey(at, "5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e")
	if key != "staging/20261130T080507Z-5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e" {
		t.Errorf("StagingKey = %q", key)
	}
	if got, ok := StagedAt(key); !ok || !got.Equal(at) {
		t.Errorf("StagedAt = %v %v", got, ok)
	}
	if _, ok := StagedAt("variants/x"); ok {
		t.Error("a variant key has no staging time")
	}
	v := VariantKey("5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e", 1, "crop", "jpg")
	if v != "variants/5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e/v1/crop.jpg" || strings.HasPrefix(v, StagingPrefix) {
		t.Errorf("VariantKey = %q", v)
	}
}
