-- gopipe schema. Idempotent: `gopipe migrate` runs it under an advisory lock.

CREATE TABLE IF NOT EXISTS gp_attachment (
    id              uuid PRIMARY KEY,
    idempotency_key text UNIQUE,
    content_sha256  text        NOT NULL,
    original_key    text        NOT NULL UNIQUE,
    original_size   bigint      NOT NULL,
    content_type    text        NOT NULL,
    display_name    text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One logical job per (attachment, pipeline_version). `attempt` is counted at claim
-- (0 until the first claim); `fence` is bumped by every claim and checked by every
-- renew and commit.
CREATE TABLE IF NOT EXISTS gp_job (
    id               uuid PRIMARY KEY,
    attachment_id    uuid        NOT NULL REFERENCES gp_attachment (id),
    pipeline_version integer     NOT NULL,
    variants         text[]      NOT NULL,
    state            text        NOT NULL CHECK (state IN ('queued', 'processing', 'ready', 'failed')),
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    fence            bigint      NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_until      timestamptz,
    not_before       timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at       timestamptz NOT NULL,
    error_code       text,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (attachment_id, pipeline_version)
);
CREATE INDEX IF NOT EXISTS gp_job_lease_idx  ON gp_job (lease_until) WHERE state = 'processing';
CREATE INDEX IF NOT EXISTS gp_job_queued_idx ON gp_job (expires_at)  WHERE state = 'queued';

-- Effect key (attachment_id, pipeline_version, variant): one published result each.
CREATE TABLE IF NOT EXISTS gp_variant (
    attachment_id    uuid    NOT NULL REFERENCES gp_attachment (id),
    pipeline_version integer NOT NULL,
    variant          text    NOT NULL,
    object_key       text    NOT NULL UNIQUE,
    sha256           text    NOT NULL,
    size             bigint  NOT NULL,
    content_type     text    NOT NULL,
    width            integer NOT NULL,
    height           integer NOT NULL,
    job_id           uuid    NOT NULL REFERENCES gp_job (id),
    attempt          integer NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (attachment_id, pipeline_version, variant)
);

-- Transition log, in commit order per attachment (seq is assigned inside the
-- committing transaction, after the row lock on the job is held).
CREATE TABLE IF NOT EXISTS gp_transition (
    seq             bigserial PRIMARY KEY,
    attachment_id   uuid        NOT NULL REFERENCES gp_attachment (id),
    job_id          uuid        NOT NULL REFERENCES gp_job (id),
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_state      text,
    to_state        text        NOT NULL,
    attempt         integer     NOT NULL,
    actor           text        NOT NULL,
    reason          text,
    next_attempt_at timestamptz
);
CREATE INDEX IF NOT EXISTS gp_transition_attachment_idx ON gp_transition (attachment_id, seq);

-- Transactional outbox, drained by the relay inside the API process.
CREATE TABLE IF NOT EXISTS gp_outbox (
    id            bigserial PRIMARY KEY,
    job_id        uuid        NOT NULL REFERENCES gp_job (id),
    attempt       integer     NOT NULL,
    publish_after timestamptz NOT NULL DEFAULT clock_timestamp(),
    claimed_until timestamptz,
    published_at  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS gp_outbox_pending_idx ON gp_outbox (publish_after, id) WHERE published_at IS NULL;

-- Operator replays, kept apart from the transition log as an audit trail.
CREATE TABLE IF NOT EXISTS gp_replay_audit (
    id            bigserial PRIMARY KEY,
    attachment_id uuid        NOT NULL REFERENCES gp_attachment (id),
    job_id        uuid        NOT NULL REFERENCES gp_job (id),
    operator      text        NOT NULL,
    reason        text        NOT NULL,
    from_attempt  integer     NOT NULL,
    error_code    text,
    at            timestamptz NOT NULL DEFAULT clock_timestamp()
);
