-- Named queries of gopipe. Each section starts with "-- name: <name>".
-- Every transition of a job is written in the same transaction (often the same
-- statement) as the state change it records; transitions of one attachment are
-- serialised by the job row lock, so their seq order is their commit order.

-- name: attachment-by-idempotency-key
SELECT a.id, a.content_sha256, j.id
FROM gp_attachment a
JOIN gp_job j ON j.attachment_id = a.id
WHERE a.idempotency_key = $1
ORDER BY j.pipeline_version
LIMIT 1;

-- name: insert-attachment
INSERT INTO gp_attachment (id, idempotency_key, content_sha256, original_key, original_size, content_type, display_name)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: insert-job
INSERT INTO gp_job (id, attachment_id, pipeline_version, variants, state, max_attempts, expires_at)
VALUES ($1, $2, $3, $4, 'queued', $5, clock_timestamp() + make_interval(secs => $6));

-- name: insert-outbox
-- $2 is the attempt the message is for: the next claim's number.
INSERT INTO gp_outbox (job_id, attempt, publish_after)
VALUES ($1, $2, coalesce($3, clock_timestamp()));

-- name: insert-transition
INSERT INTO gp_transition (attachment_id, job_id, from_state, to_state, attempt, actor, reason, next_attempt_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8);

-- name: notify-outbox
SELECT pg_notify('gp_outbox', '');

-- name: attachment-status
SELECT a.id, a.original_key, a.content_sha256, a.original_size, a.content_type, a.display_name, a.created_at,
       j.id, j.state, j.pipeline_version, j.attempt, j.error_code, j.updated_at
FROM gp_attachment a
JOIN gp_job j ON j.attachment_id = a.id
WHERE a.id = $1
ORDER BY j.pipeline_version DESC
LIMIT 1;

-- name: attachment-variants
SELECT variant, object_key, sha256, size, content_type, width, height
FROM gp_variant
WHERE attachment_id = $1 AND pipeline_version = $2
ORDER BY variant;

-- name: attachment-transitions
SELECT seq, at, from_state, to_state, attempt, reason, actor, next_attempt_at
FROM gp_transition
WHERE attachment_id = $1
ORDER BY seq;

-- name: job-for-replay
SELECT id, state, attempt, max_attempts, error_code
FROM gp_job
WHERE attachment_id = $1
ORDER BY pipeline_version DESC
LIMIT 1
FOR UPDATE;

-- name: replay-job
-- failed -> queued: a fresh TTL and, as River does, one more attempt than used so far.
UPDATE gp_job
SET state = 'queued', error_code = NULL, lease_owner = NULL, lease_until = NULL,
    not_before = clock_timestamp(),
    expires_at = clock_timestamp() + make_interval(secs => $2),
    max_attempts = greatest(max_attempts, attempt + 1),
    updated_at = clock_timestamp()
WHERE id = $1 AND state = 'failed';

-- name: insert-replay-audit
INSERT INTO gp_replay_audit (attachment_id, job_id, operator, reason, from_attempt, error_code)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: job-for-delivery
SELECT j.id, j.attachment_id, j.pipeline_version, j.variants, j.state, j.attempt, j.max_attempts, j.fence,
       coalesce(j.lease_owner, ''), j.lease_until, j.not_before, j.expires_at, clock_timestamp(),
       a.original_key, a.content_sha256, a.content_type
FROM gp_job j
JOIN gp_attachment a ON a.id = j.attachment_id
WHERE j.id = $1;

-- name: count-variants
SELECT count(*) FROM gp_variant WHERE attachment_id = $1 AND pipeline_version = $2;

-- name: claim
-- queued -> processing in one statement: attempt and fencing token bumped, lease taken, transition logged.
WITH claimed AS (
    UPDATE gp_job
    SET state = 'processing', attempt = attempt + 1, fence = fence + 1,
        lease_owner = $2, lease_until = clock_timestamp() + make_interval(secs => $3),
        error_code = NULL, updated_at = clock_timestamp()
    WHERE id = $1 AND state = 'queued'
      AND not_before <= clock_timestamp()
      AND expires_at > clock_timestamp()
      AND attempt < max_attempts
    RETURNING id, attachment_id, attempt, fence, lease_until
), logged AS (
    INSERT INTO gp_transition (attachment_id, job_id, from_state, to_state, attempt, actor, reason)
    SELECT attachment_id, id, 'queued', 'processing', attempt, $2, 'claimed' FROM claimed
)
SELECT attempt, fence, lease_until FROM claimed;

-- name: renew-lease
UPDATE gp_job
SET lease_until = clock_timestamp() + make_interval(secs => $3)
WHERE id = $1 AND fence = $2 AND state = 'processing'
RETURNING lease_until;

-- name: complete-job
-- processing -> ready, fenced by the token and refused once the TTL ran out.
UPDATE gp_job
SET state = 'ready', lease_owner = NULL, lease_until = NULL, error_code = NULL, updated_at = clock_timestamp()
WHERE id = $1 AND fence = $2 AND state = 'processing' AND expires_at > clock_timestamp()
RETURNING attachment_id, attempt;

-- name: insert-variant
INSERT INTO gp_variant (attachment_id, pipeline_version, variant, object_key, sha256, size, content_type, width, height, job_id, attempt)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);

-- name: fail-job
-- processing -> failed, fenced.
UPDATE gp_job
SET state = 'failed', error_code = $3, lease_owner = NULL, lease_until = NULL, updated_at = clock_timestamp()
WHERE id = $1 AND fence = $2 AND state = 'processing'
RETURNING attachment_id, attempt;

-- name: requeue-job
-- processing -> queued after a transient error, fenced; the next message waits for not_before.
UPDATE gp_job
SET state = 'queued', lease_owner = NULL, lease_until = NULL,
    not_before = clock_timestamp() + make_interval(secs => $3), updated_at = clock_timestamp()
WHERE id = $1 AND fence = $2 AND state = 'processing'
RETURNING attachment_id, attempt, not_before;

-- name: expire-queued-job
-- queued -> failed once the TTL ran out, without a claim.
UPDATE gp_job
SET state = 'failed', error_code = $2, updated_at = clock_timestamp()
WHERE id = $1 AND state = 'queued' AND expires_at <= clock_timestamp()
RETURNING attachment_id, attempt;

-- name: recover-lapsed-leases
-- processing -> queued (or -> failed when the attempts are spent) for leases
-- that ran out: the owner died or stalled. $1 limits to one job (NULL = any),
-- $4 says whether to enqueue a new message through the outbox.
WITH lapsed AS (
    SELECT id FROM gp_job
    WHERE state = 'processing' AND lease_until < clock_timestamp()
      AND ($1::uuid IS NULL OR id = $1::uuid)
    ORDER BY lease_until
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE gp_job j
    SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'queued' END,
        error_code = CASE WHEN j.attempt >= j.max_attempts THEN 'attempts_exhausted' END,
        lease_owner = NULL, lease_until = NULL, not_before = clock_timestamp(), updated_at = clock_timestamp()
    FROM lapsed
    WHERE j.id = lapsed.id
    RETURNING j.id, j.attachment_id, j.attempt, j.state
), logged AS (
    INSERT INTO gp_transition (attachment_id, job_id, from_state, to_state, attempt, actor, reason)
    SELECT attachment_id, id, 'processing', state, attempt, $2,
           CASE WHEN state = 'failed' THEN 'lease-timeout, no attempts left' ELSE 'lease-timeout' END
    FROM moved
), enqueued AS (
    INSERT INTO gp_outbox (job_id, attempt)
    SELECT id, attempt + 1 FROM moved WHERE state = 'queued' AND $4::boolean
)
SELECT id, state FROM moved;

-- name: expire-queued-jobs
WITH due AS (
    SELECT id FROM gp_job
    WHERE state = 'queued' AND expires_at <= clock_timestamp()
    ORDER BY expires_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE gp_job j
    SET state = 'failed', error_code = $2, updated_at = clock_timestamp()
    FROM due
    WHERE j.id = due.id
    RETURNING j.id, j.attachment_id, j.attempt
), logged AS (
    INSERT INTO gp_transition (attachment_id, job_id, from_state, to_state, attempt, actor, reason)
    SELECT attachment_id, id, 'queued', 'failed', attempt, $1, 'ttl-elapsed' FROM moved
)
SELECT count(*) FROM moved;

-- name: nudge-stale-queued
-- A queued job nobody claimed for a long time and with no recent message (its
-- message was dead-lettered, say) gets a new one. Duplicates are harmless.
WITH stale AS (
    SELECT j.id, j.attempt FROM gp_job j
    WHERE j.state = 'queued'
      AND j.not_before < clock_timestamp() - make_interval(secs => $1)
      AND j.updated_at < clock_timestamp() - make_interval(secs => $1)
      AND NOT EXISTS (
          SELECT 1 FROM gp_outbox o
          WHERE o.job_id = j.id
            AND (o.published_at IS NULL OR o.published_at > clock_timestamp() - make_interval(secs => $1)))
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), enqueued AS (
    INSERT INTO gp_outbox (job_id, attempt) SELECT id, attempt + 1 FROM stale RETURNING id
)
SELECT count(*) FROM enqueued;

-- name: original-key-bound
SELECT EXISTS (SELECT 1 FROM gp_attachment WHERE original_key = $1);

-- name: purge-published-outbox
DELETE FROM gp_outbox WHERE published_at < clock_timestamp() - make_interval(secs => $1);

-- name: outbox-claim
-- Rows due for publishing, locked for a while so that several relays never
-- publish the same row at once (a relay that dies lets the lock lapse).
WITH picked AS (
    SELECT id FROM gp_outbox
    WHERE published_at IS NULL AND publish_after <= clock_timestamp()
      AND (claimed_until IS NULL OR claimed_until < clock_timestamp())
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE gp_outbox o
SET claimed_until = clock_timestamp() + make_interval(secs => $2)
FROM picked, gp_job j
WHERE o.id = picked.id AND j.id = o.job_id
RETURNING o.id, o.job_id, o.attempt, j.attachment_id, j.pipeline_version, j.variants, j.created_at, j.expires_at;

-- name: outbox-mark-published
UPDATE gp_outbox SET published_at = clock_timestamp(), claimed_until = NULL WHERE id = ANY($1);

-- name: outbox-release
UPDATE gp_outbox SET claimed_until = NULL WHERE id = ANY($1) AND published_at IS NULL;

-- name: outbox-next-due
SELECT extract(epoch FROM (min(publish_after) - clock_timestamp()))::float8
FROM gp_outbox
WHERE published_at IS NULL;
