package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// NewUpload is everything one accepted upload commits at once.
type NewUpload struct {
	AttachmentID    string
	JobID           string
	IdempotencyKey  *string
	SHA256          string
	OriginalKey     string
	Size            int64
	ContentType     string
	DisplayName     string
	PipelineVersion int
	Variants        []string
	MaxAttempts     int
	TTL             time.Duration
	Actor           string
}

// Existing identifies an attachment found by its idempotency key.
type Existing struct {
	AttachmentID string
	JobID        string
	SHA256       string
}

// ByIdempotencyKey finds an earlier upload with the same key.
func (s *Store) ByIdempotencyKey(ctx context.Context, key string) (Existing, error) {
	var e Existing
	err := s.pool.QueryRow(ctx, q("attachment-by-idempotency-key"), key).Scan(&e.AttachmentID, &e.SHA256, &e.JobID)
	if errors.Is(err, pgx.ErrNoRows) {
		return e, ErrNotFound
	}
	return e, err
}

// CreateUpload commits attachment, job, outbox row and first transition in one
// transaction. When another request with the same idempotency key committed
// first it returns ErrConflict and commits nothing.
func (s *Store) CreateUpload(ctx context.Context, u NewUpload) error {
	return s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, q("insert-attachment"), u.AttachmentID, u.IdempotencyKey, u.SHA256, u.OriginalKey,
			u.Size, u.ContentType, u.DisplayName)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrConflict
		}
		if _, err := tx.Exec(ctx, q("insert-job"), u.JobID, u.AttachmentID, u.PipelineVersion, u.Variants,
			u.MaxAttempts, secs(u.TTL)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q("insert-outbox"), u.JobID, 1, nil); err != nil {
			return err
		}
		if err := logTransition(ctx, tx, u.AttachmentID, u.JobID, nil, "queued", 0, u.Actor, "accepted", nil); err != nil {
			return err
		}
		return notifyOutbox(ctx, tx)
	})
}

// Status is the API view of an attachment.
type Status struct {
	AttachmentID    string
	OriginalKey     string
	SHA256          string
	Size            int64
	ContentType     string
	DisplayName     *string
	CreatedAt       time.Time
	JobID           string
	State           string
	PipelineVersion int
	Attempt         int
	ErrorCode       *string
	UpdatedAt       time.Time
	Variants        []Variant
}

// Variant is one published result (effect key: attachment, pipeline_version, name).
type Variant struct {
	Name        string
	Key         string
	SHA256      string
	Size        int64
	ContentType string
	Width       int
	Height      int
}

// AttachmentStatus reads the newest job of an attachment and its variants.
func (s *Store) AttachmentStatus(ctx context.Context, id string) (*Status, error) {
	st := &Status{}
	err := s.pool.QueryRow(ctx, q("attachment-status"), id).Scan(&st.AttachmentID, &st.OriginalKey, &st.SHA256, &st.Size,
		&st.ContentType, &st.DisplayName, &st.CreatedAt, &st.JobID, &st.State, &st.PipelineVersion, &st.Attempt,
		&st.ErrorCode, &st.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, q("attachment-variants"), id, st.PipelineVersion)
	if err != nil {
		return nil, err
	}
	st.Variants, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Variant, error) {
		var v Variant
		err := r.Scan(&v.Name, &v.Key, &v.SHA256, &v.Size, &v.ContentType, &v.Width, &v.Height)
		return v, err
	})
	return st, err
}

// Transitions lists an attachment's transitions in commit order; ErrNotFound
// when the attachment does not exist.
func (s *Store) Transitions(ctx context.Context, id string) ([]Transition, error) {
	rows, err := s.pool.Query(ctx, q("attachment-transitions"), id)
	if err != nil {
		return nil, err
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Transition, error) {
		var t Transition
		err := r.Scan(&t.Seq, &t.At, &t.From, &t.To, &t.Attempt, &t.Reason, &t.Actor, &t.NextAttemptAt)
		return t, err
	})
	if err == nil && len(list) == 0 {
		return nil, ErrNotFound // every attachment has at least its null -> queued transition
	}
	return list, err
}

// Replayed is the outcome of an operator replay.
type Replayed struct {
	JobID       string
	NextAttempt int
}

// StateError says which state refused an operation.
type StateError struct{ State string }

func (e *StateError) Error() string { return "job is " + e.State }
func (e *StateError) Unwrap() error { return ErrConflict }

// Replay moves a failed job back to queued for a new attempt, with an audit
// row, a transition by the operator and a new outbox message.
func (s *Store) Replay(ctx context.Context, attachmentID, operator, reason string, ttl time.Duration) (Replayed, error) {
	var out Replayed
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var st string
		var attempt, maxAttempts int
		var code *string
		err := tx.QueryRow(ctx, q("job-for-replay"), attachmentID).Scan(&out.JobID, &st, &attempt, &maxAttempts, &code)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if st != "failed" {
			return &StateError{State: st}
		}
		if _, err := tx.Exec(ctx, q("replay-job"), out.JobID, secs(ttl)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q("insert-replay-audit"), attachmentID, out.JobID, operator, reason, attempt, code); err != nil {
			return err
		}
		out.NextAttempt = attempt + 1
		if err := logTransition(ctx, tx, attachmentID, out.JobID, state("failed"), "queued", attempt, operator,
			"replay: "+reason, nil); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q("insert-outbox"), out.JobID, out.NextAttempt, nil); err != nil {
			return err
		}
		return notifyOutbox(ctx, tx)
	})
	return out, err
}
