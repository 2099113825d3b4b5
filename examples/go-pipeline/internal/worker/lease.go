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
type keeper struct {
	store  *store.Store
	lease  store.Lease
	length time.Duration // lease length
	every  time.Duration // renew interval
	margin time.Duration

	mu         sync.Mutex
	validUntil time.Time
	lost       bool
}

func newKeeper(s *store.Store, l store.Lease, claimedAt time.Time, length, every time.Duration) *keeper {
	return &keeper{store: s, lease: l, length: length, every: every, margin: min(time.Second, length/4),
		validUntil: claimedAt.Add(length)}
}

func (k *keeper) valid() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return !k.lost && time.Now().Before(k.validUntil.Add(-k.margin))
}

// run renews every interval; it cancels the job with errLeaseLost when the
// database refuses the renewal (another claim owns the job) or when no
// renewal succeeded before the lease would have run out.
func (k *keeper) run(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(k.every)
	defer tick.Stop()
	for {
		k.mu.Lock()
		deadline := time.Until(k.validUntil.Add(-k.margin))
		k.mu.Unlock()
		expire := time.NewTimer(max(deadline, 0))
		select {
		case <-ctx.Done():
			expire.Stop()
			return
		case <-expire.C:
			k.lose(cancel, "no renewal before the lease ran out")
			return
		case <-tick.C:
			expire.Stop()
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
			slog.Warn("lease renewal failed; retrying", "job_id", k.lease.JobID, "err", err)
		case !ok:
			k.lose(cancel, "fenced: another attempt owns the job")
			return
		default:
			k.mu.Lock()
			k.validUntil = sent.Add(k.length)
			k.mu.Unlock()
		}
	}
}

func (k *keeper) lose(cancel context.CancelCauseFunc, why string) {
	k.mu.Lock()
	k.lost = true
	k.mu.Unlock()
	slog.Warn("lease lost; stopping without new effects and without ack", "job_id", k.lease.JobID,
		"attempt", k.lease.Attempt, "why", why)
	cancel(errLeaseLost)
}
