package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// OutboxRow is one message to publish, joined with its job.
type OutboxRow struct {
	ID              int64
	JobID           string
	Attempt         int
	AttachmentID    string
	PipelineVersion int
	Variants        []string
	CreatedAt       time.Time
	ExpiresAt       time.Time
}

// ClaimOutbox locks up to limit due rows for lock.
func (s *Store) ClaimOutbox(ctx context.Context, limit int, lock time.Duration) ([]OutboxRow, error) {
	rows, err := s.pool.Query(ctx, q("outbox-claim"), limit, secs(lock))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxRow, error) {
		var o OutboxRow
		err := r.Scan(&o.ID, &o.JobID, &o.Attempt, &o.AttachmentID, &o.PipelineVersion, &o.Variants, &o.CreatedAt, &o.ExpiresAt)
		return o, err
	})
}

// MarkPublished records the broker's positive confirms.
func (s *Store) MarkPublished(ctx context.Context, ids []int64) error {
	_, err := s.pool.Exec(ctx, q("outbox-mark-published"), ids)
	return err
}

// ReleaseOutbox unlocks rows whose publish failed, for the next round.
func (s *Store) ReleaseOutbox(ctx context.Context, ids []int64) error {
	_, err := s.pool.Exec(ctx, q("outbox-release"), ids)
	return err
}

// NextOutboxDue says how long until the next pending row is due (ok=false: none pending).
func (s *Store) NextOutboxDue(ctx context.Context) (time.Duration, bool, error) {
	var secs *float64
	if err := s.pool.QueryRow(ctx, q("outbox-next-due")).Scan(&secs); err != nil {
		return 0, false, err
	}
	if secs == nil {
		return 0, false, nil
	}
	return max(0, time.Duration(*secs*float64(time.Second))), true, nil
}

// Listen blocks, sending on wake whenever the outbox channel is notified,
// until ctx ends or the connection fails (the caller reconnects).
func (s *Store) Listen(ctx context.Context, wake chan<- struct{}) error {
	cfg, err := pgx.ParseConfig(s.url)
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = 5 * time.Second
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN gp_outbox"); err != nil {
		return err
	}
	for {
		// Wake up now and then to notice a silently dead connection.
		waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := conn.WaitForNotification(waitCtx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if waitCtx.Err() != nil { // our own timeout: check the connection and go on
				pingCtx, cancelPing := context.WithTimeout(ctx, 5*time.Second)
				err = conn.Ping(pingCtx)
				cancelPing()
				if err == nil {
					continue
				}
			}
			return err
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}
