package worker

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"example.com/gopipe/internal/failpoint"
	"example.com/gopipe/internal/store"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	later, earlier := now.Add(time.Minute), now.Add(-time.Second)
	job := func(state string, mod func(*store.Job)) *store.Job {
		j := &store.Job{State: state, Now: now, NotBefore: earlier, ExpiresAt: later}
		if mod != nil {
			mod(j)
		}
		return j
	}
	w := &Worker{}
	cases := []struct {
		name  string
		job   *store.Job
		round int
		want  step
	}{
		{"ready is a no-op", job("ready", nil), 0, ackDuplicate},
		{"failed is a no-op", job("failed", nil), 0, ackDuplicate},
		{"queued and due is claimed", job("queued", nil), 0, claim},
		{"queued past its TTL expires without a claim", job("queued", func(j *store.Job) { j.ExpiresAt = earlier }), 0, expireNow},
		{"TTL ending exactly now counts as expired", job("queued", func(j *store.Job) { j.ExpiresAt = now }), 0, expireNow},
		{"a scheduled retry is not claimed early", job("queued", func(j *store.Job) { j.NotBefore = later; j.ExpiresAt = later.Add(time.Hour) }), 0, ackDuplicate},
		{"a lapsed lease is taken over", job("processing", func(j *store.Job) { j.LeaseUntil = &earlier }), 0, takeOver},
		{"a live lease is waited for once", job("processing", func(j *store.Job) { j.LeaseUntil = &later }), 0, waitForLease},
		{"a live lease after the wait: the owner is alive", job("processing", func(j *store.Job) { j.LeaseUntil = &later }), 1, ackDuplicate},
	}
	for _, c := range cases {
		if got := w.decide(c.job, c.round); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestTransientKindNamesNoDetails(t *testing.T) {
	secret := errors.New("dial tcp 10.0.0.7:9000: connect: connection refused (key staging/2026…)")
	cases := map[string]error{
		"storage-unavailable":    &storageError{secret},
		"injected-fault":         fmt.Errorf("x: %w", failpoint.ErrInjected),
		"dependency-unavailable": secret,
	}
	for want, err := range cases {
		if got := transientKind(err); got != want {
			t.Errorf("transientKind(%v) = %q, want %q", err, got, want)
		}
	}
}
