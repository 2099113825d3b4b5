package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"example.com/gopipe/internal/store"
)

// errLeaseLost is the cancellation cause of a job whose lease is gone.
var errLeaseLost = errors.New("lease lost")

// keeper renews one lease until stopped. The job may start a new effect only
// while valid() holds: the last renewal, timed from when it was sent, still
// covers now with a safety margin. A process that was paused (SIGSTOP, a long
// GC, a VM freeze) therefore finds its lease stale by its own clock on waking,
// before any fenced write tells it so.
//
// A stale lease is not a lost one. When the renewals failed because the
// database could not be reached (an outage longer than the lease), the keeper
// goes on trying: a renewal still fenced by our token revives the lease if
// nobody recovered the job meanwhile, and the attempt goes on (usable waits
// for that). Only a renewal the database refuses — the sweeper or another
// attempt took the job — loses it. An outage therefore costs no attempt.
type keeper struct {
	store  *store.Store
	lease  store.Lease
	length time.Duration // lease length
	every  time.Duration // renew interval
	margin time.Duration

	mu         sync.Mutex
	validUntil time.Time
	lost       bool
	changed    chan struct{} // closed and replaced on every renewal or loss
}

func newKeeper(s *store.Store, l store.Lease, claimedAt time.Time, length, every time.Duration) *keeper {
	return &keeper{store: s, lease: l, length: length, every: every, margin: min(time.Second, length/4),
		validUntil: claimedAt.Add(length), changed: make(chan struct{})}
}

func (k *keeper) valid() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return !k.lost && time.Now().Before(k.validUntil.Add(-k.margin))
}

// usable is valid(), except that a stale lease is waited on while the keeper
// tries to revive it: true once renewed, false once lost or ctx ends.
func (k *keeper) usable(ctx context.Context) bool {
	for {
		k.mu.Lock()
		lost, ok, changed := k.lost, time.Now().Before(k.validUntil.Add(-k.margin)), k.changed
		k.mu.Unlock()
		if lost {
			return false
		}
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		}
	}
}

func (k *keeper) notify() {
	close(k.changed)
	k.changed = make(chan struct{})
}

// run renews every interval; it cancels the job with errLeaseLost only when
// the database refuses the renewal (another claim owns the job).
func (k *keeper) run(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(k.every)
	defer tick.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sent := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, k.every)
		_, ok, err := k.store.RenewLease(rctx, k.lease.JobID, k.lease.Fence, k.length)
		rcancel()
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			if !warned || !k.valid() {
				slog.Warn("lease renewal failed; retrying (no new effect while the lease is stale)",
					"job_id", k.lease.JobID, "err", err)
				warned = true
			}
		case !ok:
			k.lose(cancel, "fenced: another attempt owns the job")
			return
		default:
			k.mu.Lock()
			if warned && !time.Now().Before(k.validUntil.Add(-k.margin)) {
				slog.Info("stale lease revived: nobody took the job meanwhile", "job_id", k.lease.JobID)
			}
			warned = false
			k.validUntil = sent.Add(k.length)
			k.notify()
			k.mu.Unlock()
		}
	}
}

func (k *keeper) lose(cancel context.CancelCauseFunc, why string) {
	k.mu.Lock()
	k.lost = true
	k.notify()
	k.mu.Unlock()
	slog.Warn("lease lost; stopping without new effects and without ack", "job_id", k.lease.JobID,
		"attempt", k.lease.Attempt, "why", why)
	cancel(errLeaseLost)
}
