// Package worker consumes job messages. The message only names the job; the
// database is the truth: the worker claims the job (queued -> processing,
// attempt and fencing token bumped, lease taken) in one statement, renders
// the variants from the original whose key and checksum it reads from the
// database, writes them to deterministic keys, commits processing -> ready
// with the variant rows fenced by its token, and acks only after that commit.
package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"example.com/gopipe/internal/backoff"
	"example.com/gopipe/internal/broker"
	"example.com/gopipe/internal/config"
	"example.com/gopipe/internal/failpoint"
	"example.com/gopipe/internal/imaging"
	"example.com/gopipe/internal/metrics"
	"example.com/gopipe/internal/storage"
	"example.com/gopipe/internal/store"
)

// CodeOriginalCorrupt: the staged original no longer matches its checksum.
const CodeOriginalCorrupt = "original-corrupt"

// Worker is one consumer process.
type Worker struct {
	Config     config.Config
	Store      *store.Store
	Objects    *storage.Store
	Session    *broker.Session
	Failpoints *failpoint.Set
	Identity   string // actor of its transitions and consumer tag: one per process start

	Limits  imaging.Limits
	Backoff backoff.Policy

	m struct {
		expired, completed, retried, deadLettered, leasesLost, duplicates metrics.Counter
		failed                                                            func(code string) metrics.Counter
	}
}

// Register adds the worker's counters to r.
func (w *Worker) Register(r *metrics.Registry) {
	w.m.expired = r.Counter("gopipe_jobs_expired_total", "Jobs failed because their TTL ran out before any effect.", "role", "worker")
	w.m.completed = r.Counter("gopipe_jobs_completed_total", "Jobs that reached ready.")
	w.m.retried = r.Counter("gopipe_jobs_retried_total", "Attempts given back after a transient error.")
	w.m.deadLettered = r.Counter("gopipe_deliveries_dead_lettered_total", "Deliveries rejected to the dead-letter queue.")
	w.m.leasesLost = r.Counter("gopipe_leases_lost_total", "Attempts stopped because their lease was lost.")
	w.m.duplicates = r.Counter("gopipe_deliveries_duplicate_total", "Deliveries of jobs already done or owned (acked as no-ops).")
	w.m.failed = func(code string) metrics.Counter {
		return r.Counter("gopipe_jobs_failed_total", "Jobs that reached failed, by error code.", "code", code)
	}
}

// Run consumes until ctx ends (SIGTERM), then stops taking deliveries and
// gives in-flight jobs the shutdown grace to finish.
func (w *Worker) Run(ctx context.Context) error {
	slots := make(chan struct{}, w.Config.Concurrency)
	var inflight sync.WaitGroup
	// Jobs keep their own context through the grace period after SIGTERM.
	jobCtx, cancelJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelJobs()

	for ctx.Err() == nil {
		ch, err := w.Session.Retry(ctx)
		if err != nil {
			break
		}
		var deliveries <-chan amqp.Delivery
		err = w.Session.Bounded(10*time.Second, func() error {
			var err error
			deliveries, err = ch.Consume(broker.WorkQueue, w.Identity, false, false, false, false, nil)
			return err
		})
		if err != nil {
			slog.Warn("consume failed; reconnecting", "err", err)
			w.Session.Reset()
			continue
		}
		slog.Info("consuming", "queue", broker.WorkQueue, "prefetch", w.Config.Prefetch, "concurrency", w.Config.Concurrency)
		w.consume(ctx, jobCtx, ch, deliveries, slots, &inflight)
	}

	slog.Info("shutting down: no new deliveries; waiting for jobs in flight", "grace", w.Config.ShutdownGrace)
	done := make(chan struct{})
	go func() { inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.Config.ShutdownGrace):
		slog.Warn("grace period over; unacked deliveries go back to the queue")
	}
	cancelJobs()
	w.Session.Close()
	return nil
}

func (w *Worker) consume(ctx, jobCtx context.Context, ch *amqp.Channel, deliveries <-chan amqp.Delivery, slots chan struct{}, inflight *sync.WaitGroup) {
	for {
		select {
		case <-ctx.Done():
			_ = ch.Cancel(w.Identity, false) // stop new deliveries; in-flight ones finish
			return
		case d, ok := <-deliveries:
			if !ok {
				slog.Warn("delivery channel closed (broker connection lost); reconnecting")
				w.Session.Reset()
				return
			}
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return // not started: the channel close returns it
			}
			inflight.Add(1)
			go func() {
				defer func() { <-slots; inflight.Done() }()
				w.handle(jobCtx, d)
			}()
		}
	}
}

// handle settles one delivery: ack, reject to the DLQ, or (lease lost)
// requeue. It never acks before the job's outcome is durable.
func (w *Worker) handle(ctx context.Context, d amqp.Delivery) {
	msg, err := broker.Decode(d.Body)
	if err != nil {
		w.deadLetter(d, err.Error())
		return
	}
	log := slog.With("job_id", msg.JobID, "attachment_id", msg.AttachmentID, "message_id", d.MessageId)
	// round counts how often the job changed under us (contention), not
	// database errors: those are retried with backoff while the delivery is held.
	round, retry := 0, 100*time.Millisecond
	for {
		job, err := w.loadJob(ctx, msg.JobID)
		if errors.Is(err, store.ErrNotFound) {
			w.deadLetter(d, "unknown job")
			return
		}
		if err != nil {
			return // shutting down: unacked, the broker redelivers
		}
		if job.AttachmentID != msg.AttachmentID {
			w.deadLetter(d, "attachment_id does not match the job")
			return
		}
		var failed error
		switch w.decide(job, round) {
		case ackDuplicate:
			w.m.duplicates.Inc()
			log.Info("duplicate delivery: job is "+job.State+"; ack without effect", "round", round)
			ack(d)
			return
		case expireNow:
			var done bool
			if done, failed = w.expire(ctx, job); done {
				ack(d)
				return
			}
		case takeOver:
			tctx, cancel := context.WithTimeout(ctx, w.Config.IOTimeout)
			var st string
			var moved bool
			st, moved, failed = w.Store.TakeOver(tctx, job.ID, w.Identity)
			cancel()
			if failed == nil && moved {
				log.Info("took over a lapsed lease", "previous_owner", job.LeaseOwner, "now", st)
			}
		case waitForLease:
			wait := min(job.LeaseUntil.Sub(job.Now)+50*time.Millisecond, w.Config.Lease)
			log.Info("job is leased by another attempt; waiting once for it to end or lapse", "owner", job.LeaseOwner, "wait", wait)
			if !sleep(ctx, wait) {
				return
			}
		case claim:
			var ran bool
			if ran, failed = w.claimAndRun(ctx, d, job, log); ran {
				return
			}
		}
		if failed != nil {
			log.Warn("database call failed; holding the delivery and retrying", "err", failed, "in", retry)
			if !sleep(ctx, retry) {
				return
			}
			retry = min(2*retry, 5*time.Second)
			continue
		}
		if round++; round > 4 {
			// The job keeps changing under us: someone else is on it, and the
			// sweeper recovers it should they die. This copy is not needed.
			w.m.duplicates.Inc()
			ack(d)
			return
		}
	}
}

type step int

const (
	claim step = iota + 1
	ackDuplicate
	expireNow
	takeOver
	waitForLease
)

// decide maps a job row to the next step (pure; see worker_test.go).
func (w *Worker) decide(job *store.Job, round int) step {
	switch job.State {
	case "ready", "failed":
		return ackDuplicate
	case "queued":
		if !job.ExpiresAt.After(job.Now) {
			return expireNow
		}
		if job.NotBefore.After(job.Now) {
			return ackDuplicate // a retry is scheduled: its own message comes at not_before
		}
		return claim
	case "processing":
		if job.LeaseUntil == nil || !job.LeaseUntil.After(job.Now) {
			return takeOver
		}
		if round == 0 {
			return waitForLease
		}
		return ackDuplicate // still owned and renewed: the owner is alive
	}
	return ackDuplicate
}

// loadJob reads the job, retrying while the database is unreachable: the
// delivery stays unacked meanwhile (bounded by the prefetch).
func (w *Worker) loadJob(ctx context.Context, jobID string) (*store.Job, error) {
	wait := 200 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, w.Config.IOTimeout)
		job, err := w.Store.Job(rctx, jobID)
		cancel()
		if err == nil || errors.Is(err, store.ErrNotFound) {
			return job, err
		}
		slog.Warn("database unavailable while reading a job; holding the delivery", "job_id", jobID, "err", err)
		if !sleep(ctx, wait) {
			return nil, ctx.Err()
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func (w *Worker) expire(ctx context.Context, job *store.Job) (bool, error) {
	ectx, cancel := context.WithTimeout(ctx, w.Config.IOTimeout)
	defer cancel()
	done, err := w.Store.ExpireQueued(ectx, job.ID, store.CodeExpired, w.Identity)
	if done {
		w.m.expired.Inc()
		w.m.failed(store.CodeExpired).Inc()
		slog.Info("job expired before any effect", "job_id", job.ID)
	}
	return done, err
}

// claimAndRun claims the job and, if the claim succeeded, runs the attempt
// and settles the delivery; false means the claim did not happen.
func (w *Worker) claimAndRun(ctx context.Context, d amqp.Delivery, job *store.Job, log *slog.Logger) (bool, error) {
	claimedAt := time.Now()
	cctx, cancel := context.WithTimeout(ctx, w.Config.IOTimeout)
	lease, ok, err := w.Store.Claim(cctx, job.ID, w.Identity, w.Config.Lease)
	cancel()
	if err != nil || !ok {
		return false, err
	}
	log = log.With("attempt", lease.Attempt, "fence", lease.Fence)
	log.Info("claimed")
	// The database clock decides expiry; carry its offset to the local clock.
	skew := job.Now.Sub(claimedAt)
	w.run(ctx, d, job, lease, claimedAt, skew, log)
	return true, nil
}

// run is one attempt, from claim to settled delivery.
func (w *Worker) run(ctx context.Context, d amqp.Delivery, job *store.Job, lease store.Lease, claimedAt time.Time, skew time.Duration, log *slog.Logger) {
	attemptCtx, cancel := context.WithCancelCause(ctx)
	k := newKeeper(w.Store, lease, claimedAt, w.Config.Lease, w.Config.LeaseRenew)
	renewing := make(chan struct{})
	go func() { k.run(attemptCtx, cancel); close(renewing) }()
	defer func() { cancel(nil); <-renewing }()

	started := time.Now()
	outputs, err := w.render(attemptCtx, job)
	rendered := time.Now()
	if err == nil {
		err = w.write(attemptCtx, k, job, outputs, skew)
	}
	written := time.Now()
	if err == nil {
		err = w.Failpoints.Hit(attemptCtx, failpoint.AfterS3WriteBeforeCommit)
	}
	if errors.Is(context.Cause(attemptCtx), errLeaseLost) || !k.usable(attemptCtx) {
		w.leaseLost(d, log)
		return
	}
	if err != nil {
		w.settleFailure(ctx, d, k, job, lease, err, log)
		return
	}

	rows := make([]store.Variant, len(outputs))
	for i, o := range outputs {
		rows[i] = store.Variant{Name: o.Name, Key: storage.VariantKey(job.AttachmentID, job.PipelineVersion, o.Name, o.Ext),
			SHA256: o.SHA256, Size: int64(len(o.Data)), ContentType: o.ContentType, Width: o.Width, Height: o.Height}
	}
	var outcome store.Outcome
	err = w.durably(ctx, k, func(c context.Context) error {
		var err error
		outcome, err = w.Store.Complete(c, lease, job.PipelineVersion, rows, w.Identity, store.CodeExpired)
		return err
	})
	switch {
	case err != nil:
		w.leaseLost(d, log)
		return
	case outcome == store.Fenced:
		w.leaseLost(d, log)
		return
	case outcome == store.Expired:
		w.m.expired.Inc()
		w.m.failed(store.CodeExpired).Inc()
		log.Info("TTL ran out before the commit: failed as expired")
	default:
		w.m.completed.Inc()
		log.Info("ready", "variants", len(rows), "render_ms", rendered.Sub(started).Milliseconds(),
			"write_ms", written.Sub(rendered).Milliseconds(), "commit_ms", time.Since(written).Milliseconds())
	}
	if err := w.Failpoints.Hit(ctx, failpoint.AfterCommitBeforeAck); err != nil {
		// An injected transient error here stands for a lost ack: the delivery
		// goes back and its redelivery must be a no-op.
		log.Warn("ack withheld after the commit", "err", err)
		_ = d.Nack(false, true)
		return
	}
	ack(d)
}

// render fetches the original (key and checksum from the database) and
// renders the variants. Errors are *imaging.Error when permanent.
func (w *Worker) render(ctx context.Context, job *store.Job) ([]imaging.Output, error) {
	data, err := w.Objects.Get(ctx, job.OriginalKey, w.Config.MaxUploadBytes)
	if err != nil {
		return nil, &storageError{fmt.Errorf("read original: %w", err)}
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != job.OriginalSHA256 {
		return nil, &imaging.Error{Code: CodeOriginalCorrupt, Err: errors.New("original does not match its recorded sha256")}
	}
	return imaging.Render(ctx, data, job.Variants, w.Limits, w.Config.DecodeLimit)
}

// write puts every variant at its deterministic key. Before each put it checks
// that the lease still covers it and that the job has not expired: no new
// effect is started by an owner that lost the job, or after the TTL.
func (w *Worker) write(ctx context.Context, k *keeper, job *store.Job, outputs []imaging.Output, skew time.Duration) error {
	for _, o := range outputs {
		if !k.usable(ctx) {
			return errLeaseLost
		}
		if !time.Now().Add(skew).Before(job.ExpiresAt) {
			return errExpired
		}
		key := storage.VariantKey(job.AttachmentID, job.PipelineVersion, o.Name, o.Ext)
		if err := w.Objects.Put(ctx, key, o.Data, o.ContentType); err != nil {
			return &storageError{fmt.Errorf("write %s: %w", o.Name, err)}
		}
	}
	return nil
}

var errExpired = errors.New("job TTL ran out")

// settleFailure records a failed attempt: permanent errors and expiry end the
// job, transient ones give it back with backoff (or end it when the attempts
// are spent). The delivery is acked once that is durable.
func (w *Worker) settleFailure(ctx context.Context, d amqp.Delivery, k *keeper, job *store.Job, lease store.Lease, cause error, log *slog.Logger) {
	var perr *imaging.Error
	var code, reason string
	var delay time.Duration
	requeue := false
	switch {
	case errors.As(cause, &perr):
		code, reason = perr.Code, "render-error: "+perr.Code
	case errors.Is(cause, errExpired):
		code, reason = store.CodeExpired, "ttl-elapsed"
	case lease.Attempt >= job.MaxAttempts:
		code, reason = store.CodeAttemptsExhausted, "transient error, no attempts left: "+transientKind(cause)
	default:
		requeue, delay, reason = true, w.Backoff.Delay(lease.Attempt), "transient: "+transientKind(cause)
	}
	log.Warn("attempt failed", "err", cause, "requeue", requeue, "code", code, "retry_in", delay)
	var outcome store.Outcome
	err := w.durably(ctx, k, func(c context.Context) error {
		var err error
		if requeue {
			outcome, err = w.Store.Requeue(c, lease, delay, w.Identity, reason)
		} else {
			outcome, err = w.Store.Fail(c, lease, code, w.Identity, reason)
		}
		return err
	})
	if err != nil || outcome == store.Fenced {
		w.leaseLost(d, log)
		return
	}
	if requeue {
		w.m.retried.Inc()
	} else {
		w.m.failed(code).Inc()
		if code == store.CodeExpired {
			w.m.expired.Inc()
		}
	}
	ack(d)
}

// durably runs a fenced write, retrying while the database is unreachable
// and the lease still holds.
func (w *Worker) durably(ctx context.Context, k *keeper, write func(context.Context) error) error {
	wait := 100 * time.Millisecond
	for {
		c, cancel := context.WithTimeout(ctx, w.Config.IOTimeout)
		err := write(c)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || !k.usable(ctx) {
			return err
		}
		slog.Warn("fenced write failed; retrying while the lease holds", "err", err)
		if !sleep(ctx, wait) {
			return err
		}
		wait = min(2*wait, time.Second)
	}
}

// leaseLost: the attempt no longer owns the job. It starts no new effect and
// does not ack; the delivery goes back to the queue, where a later delivery
// finds the job with its new owner (or done) and settles as a no-op.
func (w *Worker) leaseLost(d amqp.Delivery, log *slog.Logger) {
	w.m.leasesLost.Inc()
	log.Warn("attempt abandoned: lease lost; delivery requeued, not acked")
	if err := d.Nack(false, true); err != nil {
		log.Warn("nack failed (channel gone; the broker returns the delivery itself)", "err", err)
	}
}

func (w *Worker) deadLetter(d amqp.Delivery, why string) {
	w.m.deadLettered.Inc()
	slog.Warn("unprocessable delivery rejected to the dead-letter queue", "message_id", d.MessageId, "why", why)
	if err := d.Reject(false); err != nil {
		slog.Warn("reject failed", "err", err)
	}
}

func ack(d amqp.Delivery) {
	if err := d.Ack(false); err != nil {
		slog.Warn("ack failed (channel gone; the broker redelivers, and the redelivery is a no-op)", "err", err)
	}
}

// storageError marks a failed object-store call (transient: retried with backoff).
type storageError struct{ err error }

func (e *storageError) Error() string { return "object store: " + e.err.Error() }
func (e *storageError) Unwrap() error { return e.err }

// transientKind names a transient failure for the transition log, without
// its details (no hosts, keys or credentials in the reason).
func transientKind(err error) string {
	var se *storageError
	switch {
	case errors.Is(err, failpoint.ErrInjected):
		return "injected-fault"
	case errors.As(err, &se):
		return "storage-unavailable"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "dependency-unavailable"
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
