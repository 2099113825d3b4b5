-- The SQL that matters, in one place. Each block starts with `-- name: X` and
-- is loaded by reference/db/queries.py. Every state transition is ONE
-- statement (data-modifying CTEs): the job row update, its event and, where a
-- message is due, its outbox row commit together or not at all. The job row
-- lock serialises transitions of one attachment, so events are in commit order.

-- name: record_upload
-- API: none -> queued, in ONE statement (one round trip, atomic): the
-- idempotency claim (when a key is given), attachment, job, first event and
-- outbox row. Nothing is written once the staging object is older than
-- max_age (the staging sweep may already consider it an orphan), nor when
-- another request holds the idempotency key.
WITH guard AS (
    SELECT statement_timestamp() < %(staged_at)s + make_interval(secs => %(max_age_seconds)s) AS fresh
), claim AS (
    INSERT INTO idempotency_keys (idempotency_key, request_sha256, attachment_id, job_id, response)
    SELECT %(idempotency_key)s, %(sha256)s, %(attachment_id)s, %(job_id)s, %(response)s
    FROM guard WHERE fresh AND %(idempotency_key)s::text IS NOT NULL
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING idempotency_key
), attachment AS (
    INSERT INTO attachments (attachment_id, original_key, original_sha256, original_size,
                             content_type, width, height, display_filename)
    SELECT %(attachment_id)s, %(original_key)s, %(sha256)s, %(size)s,
           %(content_type)s, %(width)s, %(height)s, %(filename)s
    FROM guard
    WHERE fresh AND (%(idempotency_key)s::text IS NULL OR EXISTS (SELECT 1 FROM claim))
    RETURNING attachment_id, created_at
), job AS (
    INSERT INTO jobs (job_id, attachment_id, pipeline_version, variants, state, attempt,
                      expires_at, traceparent, tracestate)
    SELECT %(job_id)s, attachment_id, %(pipeline_version)s, %(variants)s, 'queued', 1,
           created_at + make_interval(secs => %(ttl_seconds)s), %(traceparent)s, %(tracestate)s
    FROM attachment
    RETURNING job_id, attachment_id, attempt
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor)
    SELECT attachment_id, job_id, NULL, 'queued', attempt, 'upload accepted', 'api' FROM job
), message AS (
    INSERT INTO outbox (job_id, attempt)
    SELECT job_id, attempt FROM job
    RETURNING id
)
SELECT (SELECT fresh FROM guard) AS fresh, EXISTS (SELECT 1 FROM message) AS recorded;

-- name: idempotency_get
SELECT request_sha256, response FROM idempotency_keys WHERE idempotency_key = %(key)s;

-- name: claim_job
-- Worker: queued -> processing. Only the message of the job's current attempt
-- claims it; the fencing token grows on every claim.
WITH claimed AS (
    UPDATE jobs
       SET state = 'processing',
           fencing_token = fencing_token + 1,
           lease_owner = %(owner)s,
           lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
           updated_at = now()
     WHERE job_id = %(job_id)s AND attempt = %(attempt)s AND state = 'queued'
    RETURNING job_id, attachment_id, attempt, attempt_base, fencing_token, pipeline_version,
              variants, expires_at, lease_expires_at, expires_at <= now() AS expired
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, actor)
    SELECT attachment_id, job_id, 'queued', 'processing', attempt, %(actor)s FROM claimed
)
SELECT c.*, a.original_key, a.original_sha256, a.original_size, a.content_type
FROM claimed c JOIN attachments a USING (attachment_id);

-- name: job_snapshot
SELECT job_id, attachment_id, state, attempt, fencing_token, lease_owner,
       lease_expires_at, lease_expires_at > now() AS lease_live, expires_at <= now() AS expired
FROM jobs WHERE job_id = %(job_id)s;

-- name: renew_lease
-- Worker: extend the lease only while it is still ours and still live.
UPDATE jobs
   SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
 WHERE job_id = %(job_id)s AND fencing_token = %(fencing_token)s
   AND state = 'processing' AND lease_expires_at > now()
RETURNING lease_expires_at;

-- name: commit_result
-- Worker: processing -> ready, guarded by the fencing token and a live lease.
-- Results (one row per effect key) and the event commit with the transition.
WITH fenced AS (
    UPDATE jobs
       SET state = 'ready', lease_owner = NULL, lease_expires_at = NULL,
           last_error = NULL, updated_at = now()
     WHERE job_id = %(job_id)s AND fencing_token = %(fencing_token)s
       AND state = 'processing' AND lease_expires_at > now() AND expires_at > now()
    RETURNING job_id, attachment_id, pipeline_version, attempt, fencing_token
), stored AS (
    INSERT INTO results (attachment_id, pipeline_version, variant, object_key, sha256, size,
                         content_type, width, height, job_id, attempt, fencing_token)
    SELECT f.attachment_id, f.pipeline_version, v.variant, v.object_key, v.sha256, v.size,
           v.content_type, v.width, v.height, f.job_id, f.attempt, f.fencing_token
    FROM fenced f
    CROSS JOIN jsonb_to_recordset(%(variants)s::jsonb)
         AS v(variant text, object_key text, sha256 text, size bigint, content_type text,
              width integer, height integer)
    RETURNING variant
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, actor)
    SELECT attachment_id, job_id, 'processing', 'ready', attempt, %(actor)s FROM fenced
)
SELECT job_id, (SELECT count(*) FROM stored) AS stored FROM fenced;

-- name: retry_job
-- Worker: processing -> queued after a transient error; a new attempt, its
-- message delayed until next_attempt_at through the outbox.
WITH moved AS (
    UPDATE jobs
       SET state = 'queued', attempt = attempt + 1,
           next_attempt_at = now() + make_interval(secs => %(delay_seconds)s),
           last_error = %(reason)s, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
     WHERE job_id = %(job_id)s AND fencing_token = %(fencing_token)s
       AND state = 'processing' AND lease_expires_at > now()
    RETURNING job_id, attachment_id, attempt, next_attempt_at
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor, next_attempt_at)
    SELECT attachment_id, job_id, 'processing', 'queued', attempt, %(reason)s, %(actor)s, next_attempt_at FROM moved
), message AS (
    INSERT INTO outbox (job_id, attempt, available_at)
    SELECT job_id, attempt, next_attempt_at FROM moved
)
SELECT job_id, attempt, next_attempt_at FROM moved;

-- name: fail_job
-- Worker: processing -> failed (permanent error, attempts exhausted, expired).
WITH moved AS (
    UPDATE jobs
       SET state = 'failed', error_code = %(error_code)s, last_error = %(reason)s,
           lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
     WHERE job_id = %(job_id)s AND fencing_token = %(fencing_token)s
       AND state = 'processing' AND lease_expires_at > now()
    RETURNING job_id, attachment_id, attempt
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor)
    SELECT attachment_id, job_id, 'processing', 'failed', attempt, %(error_code)s || ': ' || %(reason)s, %(actor)s FROM moved
)
SELECT job_id, attempt FROM moved;

-- name: expire_leases
-- Sweeper: processing jobs whose lease ran out (worker died or paused) go
-- back to queued as a new attempt with a new outbox row, or to failed when
-- the attempt budget is spent.
WITH expired AS (
    SELECT job_id FROM jobs
     WHERE state = 'processing' AND lease_expires_at <= now()
     ORDER BY lease_expires_at
     LIMIT %(batch)s
     FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE jobs j
       SET state = CASE WHEN j.attempt - j.attempt_base >= %(max_attempts)s THEN 'failed' ELSE 'queued' END,
           attempt = CASE WHEN j.attempt - j.attempt_base >= %(max_attempts)s THEN j.attempt ELSE j.attempt + 1 END,
           error_code = CASE WHEN j.attempt - j.attempt_base >= %(max_attempts)s THEN 'attempts_exhausted' END,
           last_error = 'lease expired', lease_owner = NULL, lease_expires_at = NULL,
           next_attempt_at = now(), updated_at = now()
      FROM expired e
     WHERE j.job_id = e.job_id
    RETURNING j.job_id, j.attachment_id, j.state, j.attempt
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor)
    SELECT attachment_id, job_id, 'processing', state, attempt, 'lease expired', 'sweeper' FROM moved
), message AS (
    INSERT INTO outbox (job_id, attempt)
    SELECT job_id, attempt FROM moved WHERE state = 'queued'
)
SELECT job_id, attachment_id, state, attempt FROM moved;

-- name: republish_stale_queued
-- Sweeper safety net: a queued job with no message in flight for a long time
-- (e.g. its message was dead-lettered) gets a new outbox row, same attempt.
WITH stale AS (
    SELECT j.job_id, j.attempt FROM jobs j
     WHERE j.state = 'queued'
       AND j.next_attempt_at < now() - make_interval(secs => %(stale_seconds)s)
       AND NOT EXISTS (
           SELECT 1 FROM outbox o
            WHERE o.job_id = j.job_id
              AND (o.published_at IS NULL OR o.published_at > now() - make_interval(secs => %(stale_seconds)s)))
     LIMIT %(batch)s
     FOR UPDATE OF j SKIP LOCKED
)
INSERT INTO outbox (job_id, attempt)
SELECT job_id, attempt FROM stale
RETURNING job_id;

-- name: replay_job
-- Operator: failed -> queued. Same job_id and effect keys, a new attempt that
-- starts a new attempt budget, an audit row, an event and an outbox row.
WITH replayed AS (
    UPDATE jobs
       SET state = 'queued', attempt = attempt + 1, attempt_base = attempt,
           error_code = NULL, last_error = NULL, next_attempt_at = now(),
           expires_at = now() + make_interval(secs => %(ttl_seconds)s), updated_at = now()
     WHERE attachment_id = %(attachment_id)s AND state = 'failed' AND original_purged_at IS NULL
    RETURNING job_id, attachment_id, attempt
), audit AS (
    INSERT INTO replay_audit (attachment_id, job_id, operator, reason, from_attempt, to_attempt)
    SELECT attachment_id, job_id, %(operator)s, %(reason)s, attempt - 1, attempt FROM replayed
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor)
    SELECT attachment_id, job_id, 'failed', 'queued', attempt, 'replay: ' || %(reason)s, 'operator:' || %(operator)s
    FROM replayed
), message AS (
    INSERT INTO outbox (job_id, attempt) SELECT job_id, attempt FROM replayed
)
SELECT job_id, attachment_id, attempt FROM replayed;

-- name: outbox_fetch
-- Relay: due rows, locked for the length of the publish; SKIP LOCKED lets
-- several relays share the table.
SELECT o.id, o.job_id, o.attempt, o.publish_attempts, j.attachment_id, j.pipeline_version, j.variants,
       j.created_at, j.expires_at, j.traceparent, j.tracestate
FROM outbox o JOIN jobs j USING (job_id)
WHERE o.published_at IS NULL AND o.available_at <= now()
ORDER BY o.available_at, o.id
LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED;

-- name: outbox_mark_published
UPDATE outbox SET published_at = now(), publish_attempts = publish_attempts + 1
WHERE id = ANY(%(ids)s);

-- name: outbox_defer
UPDATE outbox
   SET publish_attempts = publish_attempts + 1, last_error = %(error)s,
       available_at = now() + make_interval(secs => %(delay_seconds)s)
 WHERE id = ANY(%(ids)s);

-- name: outbox_next_due
SELECT EXTRACT(EPOCH FROM (min(available_at) - now()))::float8 AS seconds
FROM outbox WHERE published_at IS NULL;

-- name: get_attachment
SELECT a.attachment_id, a.original_key, a.original_sha256, a.original_size, a.content_type,
       a.width, a.height, a.display_filename, a.created_at,
       j.job_id, j.state, j.pipeline_version, j.variants, j.attempt, j.error_code, j.updated_at
FROM attachments a JOIN jobs j USING (attachment_id)
WHERE a.attachment_id = %(attachment_id)s
ORDER BY j.pipeline_version DESC
LIMIT 1;

-- name: get_results
SELECT variant, object_key, sha256, size, content_type, width, height
FROM results
WHERE attachment_id = %(attachment_id)s AND pipeline_version = %(pipeline_version)s
ORDER BY array_position(%(variants)s::text[], variant), variant;

-- name: get_events
SELECT seq, at, from_state, to_state, attempt, reason, actor, next_attempt_at
FROM attachment_events
WHERE attachment_id = %(attachment_id)s
ORDER BY seq;

-- name: staging_owners
-- Sweeper: which listed staging keys belong to a recorded attachment, and
-- whether every job of that attachment has released its original.
SELECT a.original_key, bool_and(j.original_purged_at IS NOT NULL) AS released
FROM attachments a JOIN jobs j USING (attachment_id)
WHERE a.original_key = ANY(%(keys)s)
GROUP BY a.original_key;

-- name: release_failed_originals
-- Sweeper: failed jobs older than the failed-retention release their
-- original; replay then answers 409. Marked here, deleted by the staging sweep.
UPDATE jobs SET original_purged_at = now()
WHERE job_id IN (
    SELECT job_id FROM jobs
     WHERE state = 'failed' AND original_purged_at IS NULL
       AND updated_at < now() - make_interval(secs => %(retention_seconds)s)
     LIMIT %(batch)s
     FOR UPDATE SKIP LOCKED)
  AND state = 'failed'
RETURNING job_id;

-- name: prune_idempotency_keys
DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => %(ttl_seconds)s);

-- name: prune_outbox
DELETE FROM outbox
WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => %(retention_seconds)s);

-- name: db_now
SELECT now() AS now;
