// Package sweeper is the janitor: every few seconds it recovers lapsed leases
// (processing -> queued with a new outbox message, or -> failed when no
// attempt is left), expires queued jobs past their TTL (queued -> failed,
// without a claim), re-announces queued jobs whose message went missing (only
// while the work queue holds no waiting message: a backlog is not a loss), and
// removes staged originals that no committed attachment refers to once the
// staging retention has passed. It never touches an object a record refers to.
package sweeper

import (
	"context"
	"log/slog"
	"time"

	"example.com/gopipe/internal/config"
	"example.com/gopipe/internal/metrics"
	"example.com/gopipe/internal/storage"
	"example.com/gopipe/internal/store"
)

// Actor is how the sweeper signs its transitions.
const Actor = "janitor"

const (
	batch            = 200
	outboxKeep       = 7 * 24 * time.Hour
	stagingListLimit = 1000
	stagingOverlap   = time.Minute
)

// Sweeper runs the periodic passes.
type Sweeper struct {
	Config  config.Config
	Store   *store.Store
	Objects *storage.Store
	// ReadyMessages counts the messages waiting in the work queue (nil: no
	// broker, never re-announce).
	ReadyMessages func(context.Context) (int, error)

	expired, recovered, exhausted, nudged, orphans metrics.Counter

	// scannedTo is the staging time up to which every staged object has been
	// judged; each pass lists only from there (zero: from the beginning).
	scannedTo time.Time

	// blind: the last lease pass could not reach the database. graceUntil:
	// after such an outage, lapsed leases are left alone until then.
	blind      bool
	graceUntil time.Time
}

// outageGrace is how many leases a worker cut off with the sweeper gets,
// once the database is back, to revive its lease (a renewal still fenced by
// its token) before the job is recovered as abandoned. A lease that ran out
// while nobody could reach the database most likely ran out for that reason,
// not because its worker died; recovering it would spend an attempt.
const outageGrace = 2

// Register adds the sweeper's counters to r.
func (s *Sweeper) Register(r *metrics.Registry) {
	s.expired = r.Counter("gopipe_jobs_expired_total", "Jobs failed because their TTL ran out before any effect.", "role", "sweeper")
	s.recovered = r.Counter("gopipe_leases_recovered_total", "Lapsed leases given back to the queue.")
	s.exhausted = r.Counter("gopipe_leases_exhausted_total", "Lapsed leases of jobs with no attempt left (failed).")
	s.nudged = r.Counter("gopipe_jobs_reannounced_total", "Queued jobs given a new message after a long silence.")
	s.orphans = r.Counter("gopipe_staging_orphans_removed_total", "Staged originals removed after the retention, never bound to a record.")
}

// Run sweeps until ctx ends.
func (s *Sweeper) Run(ctx context.Context) {
	tick := time.NewTicker(s.Config.SweepEvery)
	defer tick.Stop()
	for {
		s.Once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Once runs every pass once; a failing pass does not stop the others.
func (s *Sweeper) Once(ctx context.Context) {
	s.pass(ctx, "leases", func(c context.Context) error {
		if s.blind || time.Now().Before(s.graceUntil) {
			if err := s.Store.Ping(c); err != nil {
				s.blind = true
				return err
			}
			if s.blind {
				s.blind = false
				s.graceUntil = time.Now().Add(outageGrace * s.Config.Lease)
				slog.Info("database back: lapsed leases get a grace to be revived", "until", s.graceUntil)
			}
			return nil
		}
		requeued, failed, err := s.Store.RecoverLapsedLeases(c, Actor, batch)
		if err != nil {
			s.blind = true
		}
		if requeued+failed > 0 {
			slog.Info("lapsed leases recovered", "requeued", requeued, "failed_no_attempts_left", failed)
		}
		s.recovered.Add(uint64(requeued))
		s.exhausted.Add(uint64(failed))
		return err
	})
	s.pass(ctx, "expiry", func(c context.Context) error {
		n, err := s.Store.ExpireQueuedJobs(c, Actor, store.CodeExpired, batch)
		if n > 0 {
			slog.Info("queued jobs expired", "count", n)
		}
		s.expired.Add(uint64(n))
		return err
	})
	s.pass(ctx, "reannounce", func(c context.Context) error {
		// A job's message that still waits in the queue is not lost, however
		// old: re-announcing it would add a copy per job per period and grow
		// the queue behind held or slow consumers. Only when nothing waits can
		// a long-queued job's message be missing (dead-lettered, purged).
		if s.ReadyMessages == nil {
			return nil
		}
		waiting, err := s.ReadyMessages(c)
		if err != nil || waiting > 0 {
			return err
		}
		n, err := s.Store.NudgeStaleQueued(c, s.Config.StaleQueued, batch)
		if n > 0 {
			slog.Info("silent queued jobs re-announced", "count", n)
		}
		s.nudged.Add(uint64(n))
		return err
	})
	s.pass(ctx, "staging", s.cleanStaging)
	s.pass(ctx, "outbox", func(c context.Context) error {
		_, err := s.Store.PurgePublishedOutbox(c, outboxKeep)
		return err
	})
}

func (s *Sweeper) pass(ctx context.Context, name string, fn func(context.Context) error) {
	if ctx.Err() != nil {
		return
	}
	c, cancel := context.WithTimeout(ctx, 2*s.Config.IOTimeout)
	defer cancel()
	if err := fn(c); err != nil && ctx.Err() == nil {
		slog.Warn("sweep pass failed; next round retries", "pass", name, "err", err)
	}
}

// cleanStaging removes staged originals older than the retention that no
// committed attachment refers to (uploads that never got their 202). Each
// pass lists only the staging window not judged yet.
func (s *Sweeper) cleanStaging(ctx context.Context) error {
	cutoff := time.Now().Add(-s.Config.StagingRetention)
	from := s.scannedTo
	if !from.IsZero() {
		from = from.Add(-stagingOverlap) // clock steps and keys stamped a little late
	}
	objects, err := s.Objects.ListStaged(ctx, from, cutoff, stagingListLimit)
	if err != nil {
		return err
	}
	for _, o := range objects {
		bound, err := s.Store.OriginalKeyBound(ctx, o.Key)
		if err != nil {
			return err
		}
		if bound {
			continue
		}
		if err := s.Objects.Delete(ctx, o.Key); err != nil {
			return err
		}
		s.orphans.Inc()
		slog.Info("orphan staged original removed", "key", o.Key, "age", time.Since(o.LastModified).Round(time.Second))
	}
	if len(objects) < stagingListLimit {
		s.scannedTo = cutoff // everything staged before the cutoff has been judged
	} else if at, ok := storage.StagedAt(objects[len(objects)-1].Key); ok {
		s.scannedTo = at.Add(stagingOverlap) // a full page: go on from its last key next time
	}
	return nil
}
