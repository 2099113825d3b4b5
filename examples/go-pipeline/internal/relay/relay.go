// Package relay drains the transactional outbox to the broker. It runs as a
// goroutine inside the API process: woken by NOTIFY (or a poll), it locks due
// rows, publishes each with a fresh message_id on a confirming channel, and
// marks a row published only after the broker's positive confirm. A crash
// anywhere in between leaves the row unpublished; its lock lapses and the row
// is published again (the worker deduplicates by job state).
package relay

import (
	"context"
	"errors"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"example.com/gopipe/internal/broker"
	"example.com/gopipe/internal/failpoint"
	"example.com/gopipe/internal/ids"
	"example.com/gopipe/internal/metrics"
	"example.com/gopipe/internal/store"
)

// Relay publishes outbox rows.
type Relay struct {
	Store      *store.Store
	Session    *broker.Session // must have Confirm set
	Failpoints *failpoint.Set
	Poll       time.Duration // longest sleep without a NOTIFY
	Lock       time.Duration // how long a claimed row stays locked
	Timeout    time.Duration // bound on one database call or confirm wait
	Batch      int

	published, failed metrics.Counter
}

// Register adds the relay's counters to m.
func (r *Relay) Register(m *metrics.Registry) {
	r.published = m.Counter("gopipe_outbox_published_total", "Outbox messages confirmed by the broker.")
	r.failed = m.Counter("gopipe_outbox_publish_failures_total", "Outbox publish rounds that failed (retried later).")
}

// Run loops until ctx ends.
func (r *Relay) Run(ctx context.Context) {
	wake := make(chan struct{}, 1)
	go r.listen(ctx, wake)
	retry := 200 * time.Millisecond
	for ctx.Err() == nil {
		n, err := r.drain(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.failed.Inc()
			slog.Warn("relay round failed", "err", err, "retry_in", retry)
			sleep(ctx, retry, nil)
			retry = min(2*retry, 5*time.Second)
			continue
		}
		retry = 200 * time.Millisecond
		if n >= r.Batch {
			continue // more may be due right now
		}
		wait := r.Poll
		dctx, cancel := context.WithTimeout(ctx, r.Timeout)
		if due, ok, err := r.Store.NextOutboxDue(dctx); err == nil && ok {
			wait = min(wait, max(due, 10*time.Millisecond))
		}
		cancel()
		sleep(ctx, wait, wake)
	}
}

func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := r.Store.Listen(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		slog.Warn("outbox LISTEN connection lost; polling until it is back", "err", err)
		sleep(ctx, time.Second, nil)
	}
}

// drain publishes one batch; it returns how many rows it claimed.
func (r *Relay) drain(ctx context.Context) (int, error) {
	dctx, cancel := context.WithTimeout(ctx, r.Timeout)
	rows, err := r.Store.ClaimOutbox(dctx, r.Batch, r.Lock)
	cancel()
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	published, err := r.publish(ctx, rows)
	if len(published) > 0 {
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.Timeout)
		if merr := r.Store.MarkPublished(mctx, published); merr != nil {
			// The broker has them; the rows will be published again once their lock
			// lapses, and the worker treats the copies as duplicates.
			err = errors.Join(err, merr)
		} else {
			r.published.Add(uint64(len(published)))
		}
		cancel()
	}
	if len(published) < len(rows) {
		done := map[int64]bool{}
		for _, id := range published {
			done[id] = true
		}
		var rest []int64
		for _, row := range rows {
			if !done[row.ID] {
				rest = append(rest, row.ID)
			}
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.Timeout)
		_ = r.Store.ReleaseOutbox(rctx, rest) // if this fails too, the lock lapses on its own
		cancel()
	}
	return len(rows), err
}

// publish sends every row, then waits for the confirms; it returns the ids
// the broker confirmed.
func (r *Relay) publish(ctx context.Context, rows []store.OutboxRow) ([]int64, error) {
	if err := r.Failpoints.Hit(ctx, failpoint.AfterCommitBeforePublish); err != nil {
		return nil, err
	}
	ch, err := r.Session.Channel(ctx)
	if err != nil {
		return nil, err
	}
	type sent struct {
		id      int64
		confirm *amqp.DeferredConfirmation
	}
	var pending []sent
	var sendErr error
	for _, row := range rows {
		body, err := broker.Job{
			SchemaVersion:   1,
			JobID:           row.JobID,
			Attempt:         row.Attempt,
			AttachmentID:    row.AttachmentID,
			PipelineVersion: row.PipelineVersion,
			Variants:        row.Variants,
			CreatedAt:       broker.Timestamp(row.CreatedAt),
			ExpiresAt:       broker.Timestamp(row.ExpiresAt),
		}.Encode()
		if err != nil {
			slog.Error("outbox row makes an invalid message; left unpublished", "outbox_id", row.ID, "err", err)
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, r.Timeout)
		dc, err := ch.PublishWithDeferredConfirmWithContext(pctx, broker.Exchange, broker.RoutingKey, false, false, amqp.Publishing{
			ContentType:   "application/json",
			DeliveryMode:  amqp.Persistent,
			MessageId:     ids.New(), // one per publish: the job is named in the body
			CorrelationId: row.JobID,
			Timestamp:     time.Now().UTC(),
			Type:          broker.MessageType,
			AppId:         "gopipe-relay",
			Headers:       amqp.Table{"x-gopipe-outbox-id": row.ID, "x-gopipe-attempt": int32(row.Attempt)},
			Body:          body,
		})
		cancel()
		if err != nil {
			sendErr = err
			break
		}
		pending = append(pending, sent{row.ID, dc})
	}
	if len(pending) > 0 {
		if err := r.Failpoints.Hit(ctx, failpoint.AfterPublishBeforeConfirm); err != nil {
			r.Session.Reset()
			return nil, err
		}
	}
	var confirmed []int64
	var nacked bool
	for _, p := range pending {
		wctx, cancel := context.WithTimeout(ctx, r.Timeout)
		ok, err := p.confirm.WaitContext(wctx)
		cancel()
		if err != nil {
			sendErr = errors.Join(sendErr, err)
			break
		}
		if ok {
			confirmed = append(confirmed, p.id)
		} else {
			nacked = true
		}
	}
	if nacked {
		sendErr = errors.Join(sendErr, errors.New("broker nacked a publish (queue full or unavailable)"))
	}
	if sendErr != nil {
		r.Session.Reset()
	}
	return confirmed, sendErr
}

func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-wake:
	case <-ctx.Done():
	}
}
