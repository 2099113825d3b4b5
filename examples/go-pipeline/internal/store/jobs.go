package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Error codes of the job lifecycle itself (input errors have their own, see
// package imaging).
const (
	CodeExpired           = "expired"            // the TTL ran out before the effect
	CodeAttemptsExhausted = "attempts_exhausted" // also written by the recover-lapsed-leases query
)

// Job is what a worker reads for one delivery: the job row and the trusted
// storage metadata of its original (never taken from the message).
type Job struct {
	ID              string
	AttachmentID    string
	PipelineVersion int
	Variants        []string
	State           string
	Attempt         int
	MaxAttempts     int
	Fence           int64
	LeaseOwner      string
	LeaseUntil      *time.Time
	NotBefore       time.Time
	ExpiresAt       time.Time
	Now             time.Time // the database clock when read
	OriginalKey     string
	OriginalSHA256  string
	ContentType     string
}

// Job reads one job by id.
func (s *Store) Job(ctx context.Context, jobID string) (*Job, error) {
	j := &Job{}
	err := s.pool.QueryRow(ctx, q("job-for-delivery"), jobID).Scan(&j.ID, &j.AttachmentID, &j.PipelineVersion,
		&j.Variants, &j.State, &j.Attempt, &j.MaxAttempts, &j.Fence, &j.LeaseOwner, &j.LeaseUntil, &j.NotBefore,
		&j.ExpiresAt, &j.Now, &j.OriginalKey, &j.OriginalSHA256, &j.ContentType)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	return j, err
}

// VariantCount counts the published results of a job's effect keys.
func (s *Store) VariantCount(ctx context.Context, attachmentID string, pipelineVersion int) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, q("count-variants"), attachmentID, pipelineVersion).Scan(&n)
	return n, err
}

// Lease is a claim on a job: the attempt it runs and its fencing token.
type Lease struct {
	JobID   string
	Attempt int
	Fence   int64
	Until   time.Time
}

// Claim takes a queued job (queued -> processing) in one statement. ok is
// false when the job is not claimable now (taken, not due, expired, spent).
func (s *Store) Claim(ctx context.Context, jobID, owner string, lease time.Duration) (Lease, bool, error) {
	l := Lease{JobID: jobID}
	err := s.pool.QueryRow(ctx, q("claim"), jobID, owner, secs(lease)).Scan(&l.Attempt, &l.Fence, &l.Until)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, nil
	}
	return l, err == nil, err
}

// TakeOver records a lapsed lease of one job (processing -> queued, or failed
// when no attempt is left) so that the caller can claim it next. It enqueues no
// message: the caller holds a delivery for the job.
func (s *Store) TakeOver(ctx context.Context, jobID, actor string) (string, bool, error) {
	var id, st string
	err := s.pool.QueryRow(ctx, q("recover-lapsed-leases"), jobID, actor, 1, false).Scan(&id, &st)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return st, err == nil, err
}

// RenewLease extends the lease if the token still owns the job.
func (s *Store) RenewLease(ctx context.Context, jobID string, fence int64, lease time.Duration) (time.Time, bool, error) {
	var until time.Time
	err := s.pool.QueryRow(ctx, q("renew-lease"), jobID, fence, secs(lease)).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return until, false, nil
	}
	return until, err == nil, err
}

// Outcome says why a fenced write did not happen.
type Outcome int

const (
	Done    Outcome = iota + 1
	Fenced          // the token no longer owns the job: another attempt took over
	Expired         // the job's TTL ran out before the commit
)

// Complete publishes the result: processing -> ready with the variant rows, in
// one transaction fenced by the token. A job whose TTL ran out is failed with
// expiredCode instead and Expired returned.
func (s *Store) Complete(ctx context.Context, l Lease, pipelineVersion int, variants []Variant, actor, expiredCode string) (Outcome, error) {
	outcome := Done
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var attachmentID string
		var attempt int
		err := tx.QueryRow(ctx, q("complete-job"), l.JobID, l.Fence).Scan(&attachmentID, &attempt)
		if errors.Is(err, pgx.ErrNoRows) {
			outcome = Fenced
			// Still ours but out of time? Then it fails as expired, in this transaction.
			err = tx.QueryRow(ctx, q("fail-job"), l.JobID, l.Fence, expiredCode).Scan(&attachmentID, &attempt)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err != nil {
				return err
			}
			outcome = Expired
			return logTransition(ctx, tx, attachmentID, l.JobID, state("processing"), "failed", attempt, actor, "ttl-elapsed", nil)
		}
		if err != nil {
			return err
		}
		for _, v := range variants {
			if _, err := tx.Exec(ctx, q("insert-variant"), attachmentID, pipelineVersion, v.Name, v.Key, v.SHA256, v.Size,
				v.ContentType, v.Width, v.Height, l.JobID, attempt); err != nil {
				return err
			}
		}
		return logTransition(ctx, tx, attachmentID, l.JobID, state("processing"), "ready", attempt, actor, "variants-published", nil)
	})
	return outcome, err
}

// Fail ends the attempt for good: processing -> failed with an error code, fenced.
func (s *Store) Fail(ctx context.Context, l Lease, code, actor, reason string) (Outcome, error) {
	outcome := Done
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var attachmentID string
		var attempt int
		err := tx.QueryRow(ctx, q("fail-job"), l.JobID, l.Fence, code).Scan(&attachmentID, &attempt)
		if errors.Is(err, pgx.ErrNoRows) {
			outcome = Fenced
			return nil
		}
		if err != nil {
			return err
		}
		return logTransition(ctx, tx, attachmentID, l.JobID, state("processing"), "failed", attempt, actor, reason, nil)
	})
	return outcome, err
}

// Requeue gives the job back after a transient error: processing -> queued,
// due after delay, with a new outbox message held until then. Fenced.
func (s *Store) Requeue(ctx context.Context, l Lease, delay time.Duration, actor, reason string) (Outcome, error) {
	outcome := Done
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var attachmentID string
		var attempt int
		var notBefore time.Time
		err := tx.QueryRow(ctx, q("requeue-job"), l.JobID, l.Fence, secs(delay)).Scan(&attachmentID, &attempt, &notBefore)
		if errors.Is(err, pgx.ErrNoRows) {
			outcome = Fenced
			return nil
		}
		if err != nil {
			return err
		}
		if err := logTransition(ctx, tx, attachmentID, l.JobID, state("processing"), "queued", attempt, actor, reason, &notBefore); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q("insert-outbox"), l.JobID, attempt+1, notBefore); err != nil {
			return err
		}
		return notifyOutbox(ctx, tx)
	})
	return outcome, err
}

// ExpireQueued fails one queued job whose TTL ran out (queued -> failed), without a claim.
func (s *Store) ExpireQueued(ctx context.Context, jobID, code, actor string) (bool, error) {
	done := false
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var attachmentID string
		var attempt int
		err := tx.QueryRow(ctx, q("expire-queued-job"), jobID, code).Scan(&attachmentID, &attempt)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		done = true
		return logTransition(ctx, tx, attachmentID, jobID, state("queued"), "failed", attempt, actor, "ttl-elapsed", nil)
	})
	return done, err
}
