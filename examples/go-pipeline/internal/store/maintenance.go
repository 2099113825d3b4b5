package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// RecoverLapsedLeases requeues (through the outbox) or fails the jobs whose
// lease ran out. It returns how many went back to queued and how many failed.
func (s *Store) RecoverLapsedLeases(ctx context.Context, actor string, limit int) (requeued, failed int, err error) {
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q("recover-lapsed-leases"), nil, actor, limit, true)
		if err != nil {
			return err
		}
		states, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var id, st string
			err := r.Scan(&id, &st)
			return st, err
		})
		if err != nil {
			return err
		}
		for _, st := range states {
			if st == "queued" {
				requeued++
			} else {
				failed++
			}
		}
		if requeued > 0 {
			return notifyOutbox(ctx, tx)
		}
		return nil
	})
	return requeued, failed, err
}

// ExpireQueuedJobs fails every queued job whose TTL ran out.
func (s *Store) ExpireQueuedJobs(ctx context.Context, actor, code string, limit int) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, q("expire-queued-jobs"), actor, code, limit).Scan(&n)
	return n, err
}

// NudgeStaleQueued gives a new message to queued jobs that saw none for age.
func (s *Store) NudgeStaleQueued(ctx context.Context, age time.Duration, limit int) (int, error) {
	var n int
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, q("nudge-stale-queued"), secs(age), limit).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return notifyOutbox(ctx, tx)
		}
		return nil
	})
	return n, err
}

// OriginalKeyBound reports whether a committed attachment refers to key.
func (s *Store) OriginalKeyBound(ctx context.Context, key string) (bool, error) {
	var bound bool
	err := s.pool.QueryRow(ctx, q("original-key-bound"), key).Scan(&bound)
	return bound, err
}

// PurgePublishedOutbox deletes outbox rows published longer ago than age.
func (s *Store) PurgePublishedOutbox(ctx context.Context, age time.Duration) (int64, error) {
	tag, err := s.pool.Exec(ctx, q("purge-published-outbox"), secs(age))
	return tag.RowsAffected(), err
}
