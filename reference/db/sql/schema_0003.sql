-- Dead-letter replays (applied by Alembic revision 0003; issue 12, BE-JOB-003): one row per dead letter an
-- operator request looked at, whatever came of it — who, when, why, which request (request_id groups "how many"),
-- which message (its AMQP message_id, or sha256:<body hash> without one), the job it maps to (NULL: unmappable,
-- the message stays in the dead-letter queue) and the outcome:
--   replayed          the job got a new message (queued: same attempt; failed: an operator replay, new attempt);
--   already_replayed  this job's attempt was replayed before: a no-op (a duplicate dead letter is removed);
--   already_terminal  the job is ready (or failed and its original released): nothing to do, the letter removed;
--   in_progress       the job is being processed by a live owner: nothing to do, the letter removed;
--   unmappable        no job could be read from the message, or no such job exists: the letter stays.
-- At most one `replayed` row per (job_id, job_attempt): a second replay of the same dead letter is a no-op.
CREATE TABLE dlq_replays (
    id            bigserial PRIMARY KEY,
    request_id    uuid        NOT NULL,
    message_key   text        NOT NULL,
    job_id        uuid        REFERENCES jobs (job_id),
    attachment_id uuid        REFERENCES attachments (attachment_id),
    job_attempt   integer,
    dead_reason   text,
    outcome       text        NOT NULL CHECK (outcome IN ('replayed', 'already_replayed', 'already_terminal',
                                                          'in_progress', 'unmappable')),
    detail        text,
    operator      text        NOT NULL,
    reason        text        NOT NULL,
    at            timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX dlq_replays_once ON dlq_replays (job_id, job_attempt) WHERE outcome = 'replayed';
CREATE INDEX dlq_replays_by_message ON dlq_replays (message_key, at);
CREATE INDEX dlq_replays_by_request ON dlq_replays (request_id);

-- The sweeper expires queued jobs past their deadline (BE-JOB-005): find them without a scan.
CREATE INDEX jobs_queued_expiry ON jobs (expires_at) WHERE state = 'queued';
