-- Initial schema of the reference pipeline (applied by Alembic revision 0001).
-- State lives in `jobs` (one job per attachment and pipeline_version); every
-- transition also appends to `attachment_events` in the same statement.

CREATE TABLE attachments (
    attachment_id     uuid PRIMARY KEY,
    original_key      text        NOT NULL UNIQUE,
    original_sha256   char(64)    NOT NULL,
    original_size     bigint      NOT NULL CHECK (original_size > 0),
    content_type      text        NOT NULL,
    width             integer     NOT NULL,
    height            integer     NOT NULL,
    display_filename  text,                      -- sanitised, display only, never in a key
    created_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobs (
    job_id             uuid PRIMARY KEY,
    attachment_id      uuid        NOT NULL REFERENCES attachments (attachment_id),
    pipeline_version   integer     NOT NULL,
    variants           text[]      NOT NULL,
    state              text        NOT NULL CHECK (state IN ('queued', 'processing', 'ready', 'failed')),
    attempt            integer     NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    attempt_base       integer     NOT NULL DEFAULT 0,   -- attempt at the start of this round (replay starts a round)
    fencing_token      bigint      NOT NULL DEFAULT 0,   -- incremented on every claim, checked on renew/commit
    lease_owner        text,
    lease_expires_at   timestamptz,
    next_attempt_at    timestamptz NOT NULL DEFAULT now(),
    last_error         text,                             -- redacted, operator-visible
    error_code         text,
    expires_at         timestamptz NOT NULL,
    original_purged_at timestamptz,                      -- staging original removed after failed retention
    traceparent        text,
    tracestate         text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (attachment_id, pipeline_version),
    CHECK ((state = 'processing') = (lease_expires_at IS NOT NULL)),
    CHECK ((state = 'failed') = (error_code IS NOT NULL))
);
CREATE INDEX jobs_leases ON jobs (lease_expires_at) WHERE state = 'processing';
CREATE INDEX jobs_queued ON jobs (next_attempt_at) WHERE state = 'queued';
CREATE INDEX jobs_failed ON jobs (updated_at) WHERE state = 'failed' AND original_purged_at IS NULL;

-- One row per effect key (attachment_id, pipeline_version, variant): a second
-- publication of the same effect is a primary-key violation, never a silent overwrite.
CREATE TABLE results (
    attachment_id    uuid        NOT NULL REFERENCES attachments (attachment_id),
    pipeline_version integer     NOT NULL,
    variant          text        NOT NULL,
    object_key       text        NOT NULL UNIQUE,
    sha256           char(64)    NOT NULL,
    size             bigint      NOT NULL,
    content_type     text        NOT NULL,
    width            integer     NOT NULL,
    height           integer     NOT NULL,
    job_id           uuid        NOT NULL REFERENCES jobs (job_id),
    attempt          integer     NOT NULL,
    fencing_token    bigint      NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (attachment_id, pipeline_version, variant)
);

CREATE TABLE attachment_events (
    seq             bigserial PRIMARY KEY,
    attachment_id   uuid        NOT NULL REFERENCES attachments (attachment_id),
    job_id          uuid        NOT NULL REFERENCES jobs (job_id),
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_state      text,
    to_state        text        NOT NULL,
    attempt         integer     NOT NULL,
    reason          text,
    actor           text        NOT NULL,
    next_attempt_at timestamptz
);
CREATE INDEX attachment_events_by_attachment ON attachment_events (attachment_id, seq);

-- Transactional outbox: a row per message to publish; the relay marks it
-- published only after the broker's publisher confirm.
CREATE TABLE outbox (
    id               bigserial PRIMARY KEY,
    job_id           uuid        NOT NULL REFERENCES jobs (job_id),
    attempt          integer     NOT NULL,
    available_at     timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    published_at     timestamptz,
    publish_attempts integer     NOT NULL DEFAULT 0,
    last_error       text
);
CREATE INDEX outbox_pending ON outbox (available_at, id) WHERE published_at IS NULL;
CREATE INDEX outbox_by_job ON outbox (job_id);
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;

CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('reference_outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

CREATE TABLE idempotency_keys (
    idempotency_key text PRIMARY KEY,
    request_sha256  char(64)    NOT NULL,
    attachment_id   uuid        NOT NULL,
    job_id          uuid        NOT NULL,
    response        jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);

CREATE TABLE replay_audit (
    id            bigserial PRIMARY KEY,
    attachment_id uuid        NOT NULL REFERENCES attachments (attachment_id),
    job_id        uuid        NOT NULL REFERENCES jobs (job_id),
    operator      text        NOT NULL,
    reason        text        NOT NULL,
    from_attempt  integer     NOT NULL,
    to_attempt    integer     NOT NULL,
    at            timestamptz NOT NULL DEFAULT now()
);
