-- The SQL that matters, in one place. Each block starts with `-- name: X` and
-- is loaded by reference/db/queries.py. Every state transition is ONE
-- statement (data-modifying CTEs): the job row update, its event and, where a
-- message is due, its outbox row commit together or not at all. The job row
-- lock serialises transitions of one attachment, so events are in commit order.

-- name: record_upload
-- API: none -> queued, in ONE statement (one round trip, atomic): the
-- idempotency claim (when a key is given), attachment, job, first event and
-- outbox row. Every age is the database's own clock: the staged_uploads row
-- (written by stage_upload before the PUT) is locked, and nothing is written
-- once it is older than max_age or the staging sweep has doomed it, nor when
-- another request holds the idempotency key. Recording removes the row: the
-- object is the attachment's original from now on, never an orphan.
WITH staged AS (
    SELECT doomed_at IS NULL AND staged_at > statement_timestamp() - make_interval(secs => %(max_age_seconds)s)
           AS fresh
    FROM staged_uploads WHERE object_key = %(original_key)s
    FOR UPDATE
), guard AS (
    SELECT coalesce((SELECT fresh FROM staged), false) AS fresh
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
), unstage AS (
    DELETE FROM staged_uploads WHERE object_key = %(original_key)s AND EXISTS (SELECT 1 FROM attachment)
)
SELECT (SELECT fresh FROM guard) AS fresh, EXISTS (SELECT 1 FROM message) AS recorded;

-- name: stage_upload
-- API, BEFORE the PUT of a new original: its staging record, dated by the
-- database's clock (the only clock staging cleanup ever consults).
INSERT INTO staged_uploads (object_key) VALUES (%(object_key)s)
ON CONFLICT (object_key) DO NOTHING
RETURNING staged_at;

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
           claimed_at = now(),  -- the execution's deadline counts from here (sweeper: expire_leases)
           updated_at = now()
     WHERE job_id = %(job_id)s AND attempt = %(attempt)s AND state = 'queued'
       AND pipeline_version = %(pipeline_version)s  -- level 5: a worker claims jobs of its own version only
    RETURNING job_id, attachment_id, attempt, attempt_base, fencing_token, pipeline_version,
              variants, expires_at, lease_expires_at, expires_at <= now() AS expired,
              EXTRACT(EPOCH FROM (expires_at - now()))::float8 AS expires_in_seconds
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, actor)
    SELECT attachment_id, job_id, 'queued', 'processing', attempt, %(actor)s FROM claimed
)
SELECT c.*, a.original_key, a.original_sha256, a.original_size, a.content_type,
       a.width AS original_width, a.height AS original_height
FROM claimed c JOIN attachments a USING (attachment_id);

-- name: job_snapshot
SELECT job_id, attachment_id, state, attempt, fencing_token, lease_owner,
       lease_expires_at, lease_expires_at > now() AS lease_live, expires_at <= now() AS expired
FROM jobs WHERE job_id = %(job_id)s;

-- name: renew_lease
-- Worker: extend the lease while it is still ours. A lease that lapsed while
-- the database was unreachable is revived when nobody recovered it meanwhile:
-- the job still `processing` under our fencing token proves that no one else
-- claimed it (a claim needs `queued` and increments the token; lease recovery
-- moves it to `queued` under the same row lock).
UPDATE jobs
   SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
 WHERE job_id = %(job_id)s AND fencing_token = %(fencing_token)s
   AND state = 'processing'
RETURNING lease_expires_at;

-- name: adopt_claim
-- Worker: the reply of our own claim was lost (the connection broke after the
-- commit): the job is `processing` under the owner string of this very
-- delivery, so the claim is ours. Same token, a fresh lease, no new event.
UPDATE jobs j
   SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
  FROM attachments a
 WHERE j.job_id = %(job_id)s AND j.attempt = %(attempt)s AND j.state = 'processing'
   AND j.lease_owner = %(owner)s AND a.attachment_id = j.attachment_id
   AND j.pipeline_version = %(pipeline_version)s
RETURNING j.job_id, j.attachment_id, j.attempt, j.attempt_base, j.fencing_token, j.pipeline_version,
          j.variants, j.expires_at, j.lease_expires_at, j.expires_at <= now() AS expired,
          EXTRACT(EPOCH FROM (j.expires_at - now()))::float8 AS expires_in_seconds,
          a.original_key, a.original_sha256, a.original_size, a.content_type,
          a.width AS original_width, a.height AS original_height;

-- name: release_job
-- Worker: processing -> queued without spending an attempt, when the work
-- stopped for a reason that is not the job's (the worker is shutting down).
-- Same attempt, and a message of its own through the outbox in the same
-- transaction (issue 23 defect 2): the delivery being returned unacked may
-- already be gone — after a broker connection or node loss the broker handed
-- it to another worker, which acked it as busy while this one held the job.
-- Where it does come back, the second copy finds the job processing (busy)
-- or ready (a no-op).
WITH moved AS (
    UPDATE jobs
       SET state = 'queued', next_attempt_at = now(), last_error = %(reason)s,
           lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
     WHERE job_id = %(job_id)s AND fencing_token = %(fencing_token)s AND state = 'processing'
    RETURNING job_id, attachment_id, attempt
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor)
    SELECT attachment_id, job_id, 'processing', 'queued', attempt, %(reason)s, %(actor)s FROM moved
), message AS (
    INSERT INTO outbox (job_id, attempt)
    SELECT job_id, attempt FROM moved
)
SELECT job_id, attempt FROM moved;

-- name: job_expired
-- Worker: has the job's deadline passed (the database's clock decides)?
SELECT expires_at <= now() AS expired FROM jobs WHERE job_id = %(job_id)s;

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

-- name: dead_letter_job
-- Worker (issue 23 defect 7): the delivery of a queued job's current attempt is dead-lettered after
-- max_attempts deliveries without a verdict (an error that is neither an outage nor about the job). The
-- dead-lettering is recorded on the job, so nothing (the lost-message safety net) republishes it until its TTL:
-- the worker takes the job (queued -> processing, a new fencing token, as a claim does) and ends it in the same
-- transaction (processing -> failed, error_code `dead_lettered`, attempts exhausted without a verdict). An
-- operator's dead-letter replay then revives it as any failed job (failed -> queued, a new attempt).
WITH moved AS (
    UPDATE jobs
       SET state = 'failed', error_code = 'dead_lettered', last_error = %(reason)s,
           fencing_token = fencing_token + 1, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
     WHERE job_id = %(job_id)s AND attempt = %(attempt)s AND state = 'queued'
       AND pipeline_version = %(pipeline_version)s
    RETURNING job_id, attachment_id, attempt
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor)
    SELECT m.attachment_id, m.job_id, v.from_state, v.to_state, m.attempt, v.reason, %(actor)s
      FROM moved m
     CROSS JOIN (VALUES (1, 'queued', 'processing', NULL),
                        (2, 'processing', 'failed', 'dead_lettered: ' || %(reason)s)) AS v(n, from_state, to_state, reason)
     ORDER BY v.n
)
SELECT job_id, attempt FROM moved;

-- name: expire_leases
-- Sweeper: processing jobs whose lease ran out (worker died or paused) go
-- back to queued as a new attempt with a new outbox row, or to failed when
-- the attempt budget is spent. The new attempt waits out a full-jitter
-- backoff like any retry (uniform(0, min(cap, base * 2^n)), n = failures
-- before this one in the round), so a job that kills its worker does not
-- come straight back. spare_lapsed_seconds_ago (or NULL): leases that lapsed longer ago than this are left
-- alone — a freshly started sweeper's grace for the leases that lapsed before its first contact (an outage it
-- did not see may have cut their workers off; they revive them with renew_lease).
-- A deadline per execution (issue 23): a claim older than execution_timeout_seconds is recovered the same way
-- whatever its lease says (reason 'execution deadline passed'): a worker that renews but never finishes is
-- abandoned; its renewals are refused from then on (the job is no longer processing under its token) and its
-- commit is fenced. Never spared: a renewed lease is no sign of an outage.
WITH lapsed AS (
    SELECT job_id, 'lease expired' AS reason FROM jobs
     WHERE state = 'processing' AND lease_expires_at <= now()
       AND (%(spare_lapsed_seconds_ago)s::float8 IS NULL
            OR lease_expires_at > now() - make_interval(secs => %(spare_lapsed_seconds_ago)s::float8))
     ORDER BY lease_expires_at
     LIMIT %(batch)s
     FOR UPDATE SKIP LOCKED
), overdue AS (  -- disjoint from lapsed: these leases are live
    SELECT job_id, 'execution deadline passed' AS reason FROM jobs
     WHERE state = 'processing' AND lease_expires_at > now()
       AND claimed_at <= now() - make_interval(secs => %(execution_timeout_seconds)s::float8)
     ORDER BY claimed_at
     LIMIT %(batch)s
     FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT job_id, reason FROM lapsed UNION ALL SELECT job_id, reason FROM overdue
), moved AS (
    UPDATE jobs j
       SET state = CASE WHEN j.attempt - j.attempt_base >= %(max_attempts)s THEN 'failed' ELSE 'queued' END,
           attempt = CASE WHEN j.attempt - j.attempt_base >= %(max_attempts)s THEN j.attempt ELSE j.attempt + 1 END,
           error_code = CASE WHEN j.attempt - j.attempt_base >= %(max_attempts)s THEN 'attempts_exhausted' END,
           last_error = e.reason, lease_owner = NULL, lease_expires_at = NULL,
           next_attempt_at = now() + make_interval(secs => random() * least(%(retry_cap_seconds)s::float8,
                   %(retry_base_seconds)s::float8 * power(2, least(greatest(j.attempt - j.attempt_base - 1, 0), 62)))),
           updated_at = now()
      FROM expired e
     WHERE j.job_id = e.job_id
    RETURNING j.job_id, j.attachment_id, j.state, j.attempt, j.next_attempt_at, e.reason
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor, next_attempt_at)
    SELECT attachment_id, job_id, 'processing', state, attempt, reason, 'sweeper',
           CASE WHEN state = 'queued' THEN next_attempt_at END FROM moved
), message AS (
    INSERT INTO outbox (job_id, attempt, available_at)
    SELECT job_id, attempt, next_attempt_at FROM moved WHERE state = 'queued'
)
SELECT job_id, attachment_id, state, attempt, reason FROM moved;

-- name: stale_queued_versions
-- The pipeline versions that have queued jobs old enough for the safety net below (each has its own queue).
SELECT DISTINCT pipeline_version FROM jobs
 WHERE state = 'queued' AND next_attempt_at < now() - make_interval(secs => %(stale_seconds)s);

-- name: republish_stale_queued
-- Sweeper safety net: a queued job of one pipeline version with no message in flight for a long time
-- (e.g. its message was dead-lettered) gets a new outbox row, same attempt.
WITH stale AS (
    SELECT j.job_id, j.attempt FROM jobs j
     WHERE j.state = 'queued' AND j.pipeline_version = %(pipeline_version)s
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

-- name: expire_queued_jobs
-- Sweeper (BE-JOB-005): queued jobs past their deadline (the database's clock)
-- end failed with error_code `expired`, queued -> failed directly, whether or
-- not a worker ever claims their message. A message still in flight then finds
-- the job terminal (a no-op ack). No attempt is spent and no effect exists.
WITH due AS (
    SELECT job_id FROM jobs
     WHERE state = 'queued' AND expires_at <= now()
     ORDER BY expires_at
     LIMIT %(batch)s
     FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE jobs j
       SET state = 'failed', error_code = 'expired', last_error = 'expired while queued',
           lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
      FROM due d
     WHERE j.job_id = d.job_id AND j.state = 'queued'
    RETURNING j.job_id, j.attachment_id, j.attempt
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor)
    SELECT attachment_id, job_id, 'queued', 'failed', attempt, 'expired: expired while queued', %(actor)s
    FROM moved
)
SELECT job_id, attachment_id FROM moved;

-- name: replay_job
-- Operator: failed -> queued, of ONE job (issue 23 defect 5: at level 5 an attachment has a job per pipeline
-- version; a replay acts on the job it names, never on the attachment's other failed versions). Same job_id and
-- effect keys, a new attempt that starts a new attempt budget, an audit row, an event and an outbox row. Refused
-- (nothing returned) when the new round's attempts could pass the message schema's maximum, or past MAX_REPLAYS.
WITH replayed AS (
    UPDATE jobs
       SET state = 'queued', attempt = attempt + 1, attempt_base = attempt,
           error_code = NULL, last_error = NULL, next_attempt_at = now(),
           expires_at = now() + make_interval(secs => %(ttl_seconds)s), updated_at = now()
     WHERE job_id = %(job_id)s AND state = 'failed' AND original_purged_at IS NULL
       AND attempt + %(max_attempts)s <= %(attempt_max)s
       AND (SELECT count(*) FROM replay_audit r WHERE r.job_id = jobs.job_id AND r.from_attempt > 0)
           < %(max_replays)s
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

-- name: dlq_lock_job
-- Operator, dead-letter replay (reference/dlq.py): the job a dead letter maps to, locked for the decision.
SELECT job_id, attachment_id, state, attempt, original_purged_at IS NOT NULL AS original_released,
       coalesce(lease_expires_at > now(), false) AS lease_live
FROM jobs WHERE job_id = %(job_id)s
FOR UPDATE;

-- name: dlq_replayed_before
-- Operator: the earlier replay of this job's attempt, if any (one per job and attempt: dlq_replays_once).
SELECT at, operator, request_id FROM dlq_replays
WHERE job_id = %(job_id)s AND job_attempt = %(job_attempt)s AND outcome = 'replayed'
ORDER BY at LIMIT 1;

-- name: dlq_replayed_lookup
-- Operator: an earlier request that took a dead letter no longer in the queue (replayed it, or removed it with
-- nothing to do), by its message key or its job.
SELECT message_key, job_id, attachment_id, job_attempt, at, operator, request_id, outcome FROM dlq_replays
WHERE outcome IN ('replayed', 'already_terminal', 'in_progress')
  AND (message_key = %(message_key)s OR job_id = %(job_id)s::uuid)
ORDER BY at DESC LIMIT 1;

-- name: dlq_republish_queued
-- Operator: a queued job whose message was dead-lettered gets a new outbox row for the same attempt (a claim
-- needs that attempt and `queued`: any other copy becomes a no-op), with its audit row, in ONE statement; the
-- unique index makes a second replay of the same job and attempt insert nothing (and publish nothing).
WITH audit AS (
    INSERT INTO dlq_replays (request_id, message_key, job_id, attachment_id, job_attempt, dead_reason, outcome,
                             detail, operator, reason)
    SELECT %(request_id)s, %(message_key)s, job_id, attachment_id, %(job_attempt)s, %(dead_reason)s, 'replayed',
           'queued: published again, same attempt ' || attempt, %(operator)s, %(reason)s
    FROM jobs WHERE job_id = %(job_id)s AND state = 'queued'
    ON CONFLICT (job_id, job_attempt) WHERE outcome = 'replayed' DO NOTHING
    RETURNING job_id
), message AS (
    INSERT INTO outbox (job_id, attempt)
    SELECT j.job_id, j.attempt FROM jobs j JOIN audit a USING (job_id)
    RETURNING id
)
SELECT (SELECT count(*) FROM audit) AS replayed;

-- name: dlq_audit
-- Operator: the audit row of a dead letter a replay request looked at (any outcome).
INSERT INTO dlq_replays (request_id, message_key, job_id, attachment_id, job_attempt, dead_reason, outcome, detail,
                         operator, reason)
VALUES (%(request_id)s, %(message_key)s, %(job_id)s, %(attachment_id)s, %(job_attempt)s, %(dead_reason)s,
        %(outcome)s, %(detail)s, %(operator)s, %(reason)s)
ON CONFLICT (job_id, job_attempt) WHERE outcome = 'replayed' DO NOTHING
RETURNING id;

-- name: dlq_audit_of_request
SELECT message_key, job_id, attachment_id, job_attempt, dead_reason, outcome, detail, operator, reason, at
FROM dlq_replays WHERE request_id = %(request_id)s ORDER BY id;

-- name: outbox_fetch
-- Relay: due rows, locked for the length of the publish; SKIP LOCKED lets
-- several relays share the table.
SELECT o.id, o.job_id, o.attempt, o.publish_attempts, j.attachment_id, j.pipeline_version, j.variants,
       j.created_at, j.expires_at, j.traceparent, j.tracestate,
       EXTRACT(EPOCH FROM (now() - o.created_at))::float8 AS age_seconds
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

-- name: outbox_bury_unpublishable
-- Relay: a row whose message can never pass the message schema (a corrupt or
-- out-of-range job: attempt past the schema's maximum, an unknown variant, ...)
-- is settled for good instead of being deferred forever: published_at doubles
-- as "settled at" (the row leaves the pending set, the stale-republish net and
-- the pruning treat it as done) and last_error says it is dead. When the row
-- is the message of the job's current queued attempt, the job ends failed in
-- the same statement through legal transitions: queued -> processing (a claim:
-- the fencing token grows, so no worker can commit it) -> failed, with its own
-- error_code. A row of an older attempt only settles.
WITH settled AS (
    UPDATE outbox
       SET published_at = now(), publish_attempts = publish_attempts + 1,
           last_error = left('dead: ' || %(error)s, 500)
     WHERE id = %(id)s AND published_at IS NULL
    RETURNING job_id, attempt
), moved AS (
    UPDATE jobs j
       SET state = 'failed', error_code = %(error_code)s, last_error = left(%(error)s, 500),
           fencing_token = j.fencing_token + 1, lease_owner = NULL, lease_expires_at = NULL,
           updated_at = now()
      FROM settled r
     WHERE j.job_id = r.job_id AND j.attempt = r.attempt AND j.state = 'queued'
    RETURNING j.job_id, j.attachment_id, j.attempt
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor)
    SELECT m.attachment_id, m.job_id, s.from_state, s.to_state, m.attempt, s.reason, %(actor)s
    FROM moved m
    CROSS JOIN (VALUES (1, 'queued', 'processing', NULL),
                       (2, 'processing', 'failed', %(error_code)s || ': ' || left(%(error)s, 300)))
         AS s(step, from_state, to_state, reason)
    ORDER BY s.step
)
SELECT (SELECT count(*) FROM settled) AS settled, (SELECT job_id FROM moved) AS failed_job_id;

-- name: outbox_next_due
SELECT EXTRACT(EPOCH FROM (min(available_at) - now()))::float8 AS seconds
FROM outbox WHERE published_at IS NULL;

-- name: get_attachment
-- The served version (level 5, docs/CONTRACT.md): among the versions at or below the cap (max_version,
-- NULL = no cap), the newest `ready` one, else the oldest one (the upload's own job, until a version is ready). One version only (pipeline_version = 1)
-- before level 5: its job.
SELECT a.attachment_id, a.original_key, a.original_sha256, a.original_size, a.content_type,
       a.width, a.height, a.display_filename, a.created_at,
       j.job_id, j.state, j.pipeline_version, j.variants, j.attempt, j.error_code, j.updated_at
FROM attachments a JOIN jobs j USING (attachment_id)
WHERE a.attachment_id = %(attachment_id)s
ORDER BY j.pipeline_version <= coalesce(%(max_version)s::int, j.pipeline_version) DESC,
         j.state = 'ready' DESC,
         CASE WHEN j.state = 'ready' THEN -j.pipeline_version ELSE j.pipeline_version END
LIMIT 1;

-- name: get_versions
-- Level 5: every pipeline version of an attachment (one job each) with its results.
SELECT j.pipeline_version, j.job_id, j.state, j.attempt, j.error_code, j.variants, j.updated_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'name', r.variant, 'key', r.object_key, 'sha256', trim(r.sha256), 'size', r.size,
                    'content_type', r.content_type, 'width', r.width, 'height', r.height)
                    ORDER BY array_position(j.variants, r.variant), r.variant)
                 FROM results r
                 WHERE r.attachment_id = j.attachment_id AND r.pipeline_version = j.pipeline_version),
                '[]'::jsonb) AS results
FROM jobs j
WHERE j.attachment_id = %(attachment_id)s
ORDER BY j.pipeline_version;

-- name: reprocess_job
-- Operator, level 5: a job for another pipeline version of an existing attachment, in ONE statement: the job
-- (queued, attempt 1), its event, its outbox row and an audit row (replay_audit with from_attempt = 0: a new
-- version's job, not a replay). Idempotent: the version's job exists already -> nothing is written (the
-- caller reads the existing job). Refused (nothing returned) when the original was released.
WITH source AS (
    SELECT a.attachment_id FROM attachments a
     WHERE a.attachment_id = %(attachment_id)s
       AND EXISTS (SELECT 1 FROM jobs o WHERE o.attachment_id = a.attachment_id AND o.original_purged_at IS NULL)
), job AS (
    INSERT INTO jobs (job_id, attachment_id, pipeline_version, variants, state, attempt, expires_at)
    SELECT %(job_id)s, attachment_id, %(pipeline_version)s, %(variants)s, 'queued', 1,
           now() + make_interval(secs => %(ttl_seconds)s)
    FROM source
    ON CONFLICT (attachment_id, pipeline_version) DO NOTHING
    RETURNING job_id, attachment_id, attempt, pipeline_version
), audit AS (
    INSERT INTO replay_audit (attachment_id, job_id, operator, reason, from_attempt, to_attempt)
    SELECT attachment_id, job_id, %(operator)s, 'reprocess v' || pipeline_version || ': ' || %(reason)s, 0, attempt
    FROM job
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, reason, actor)
    SELECT attachment_id, job_id, NULL, 'queued', attempt, 'reprocess v' || pipeline_version || ': ' || %(reason)s,
           'operator:' || %(operator)s
    FROM job
), message AS (
    INSERT INTO outbox (job_id, attempt) SELECT job_id, attempt FROM job
)
SELECT job_id, attachment_id, attempt, pipeline_version FROM job;

-- name: version_job
SELECT j.job_id, j.attachment_id, j.attempt, j.pipeline_version, j.state
FROM jobs j WHERE j.attachment_id = %(attachment_id)s AND j.pipeline_version = %(pipeline_version)s;

-- name: replay_target
-- Operator replay (issue 23 defect 5): the one job a replay acts on — the job named (job_id), else the attachment's
-- job of the version named (pipeline_version), else the job its status shows (get_attachment's order) — with what
-- a refusal needs to say.
SELECT j.job_id, j.attachment_id, j.state, j.attempt, j.pipeline_version,
       j.original_purged_at IS NOT NULL AS original_released
FROM jobs j
WHERE j.attachment_id = %(attachment_id)s
  AND (%(job_id)s::uuid IS NULL OR j.job_id = %(job_id)s::uuid)
  AND (%(pipeline_version)s::int IS NULL OR j.pipeline_version = %(pipeline_version)s::int)
ORDER BY j.pipeline_version <= coalesce(%(max_version)s::int, j.pipeline_version) DESC,
         j.state = 'ready' DESC,
         CASE WHEN j.state = 'ready' THEN -j.pipeline_version ELSE j.pipeline_version END
LIMIT 1;

-- name: operator_audit
-- Operator (issue 23 defect 11): one row per operator request and outcome, accepted or refused.
INSERT INTO operator_audit (operator, action, attachment_id, job_id, outcome, status, detail, reason, client)
VALUES (%(operator)s, %(action)s, %(attachment_id)s, %(job_id)s, %(outcome)s, %(status)s, %(detail)s, %(reason)s,
        %(client)s);

-- name: get_results
SELECT variant, object_key, sha256, size, content_type, width, height
FROM results
WHERE attachment_id = %(attachment_id)s AND pipeline_version = %(pipeline_version)s
ORDER BY array_position(%(variants)s::text[], variant), variant;

-- name: get_events
SELECT e.seq, e.at, e.from_state, e.to_state, e.attempt, e.reason, e.actor, e.next_attempt_at, j.pipeline_version
FROM attachment_events e JOIN jobs j USING (job_id)
WHERE e.attachment_id = %(attachment_id)s
ORDER BY e.seq;

-- name: doom_staged_uploads
-- Sweeper: staging records older than the retention by the database's clock
-- belong to uploads that were never recorded (record_upload removes the row):
-- doom them, so record_upload refuses them from now on; their objects are then
-- deleted. Costs what is due, never a listing of the bucket.
UPDATE staged_uploads SET doomed_at = now()
WHERE object_key IN (
    SELECT object_key FROM staged_uploads
     WHERE doomed_at IS NULL AND staged_at < now() - make_interval(secs => %(retention_seconds)s)
     ORDER BY staged_at
     LIMIT %(batch)s
     FOR UPDATE SKIP LOCKED)
RETURNING object_key;

-- name: doomed_staged_uploads
-- Sweeper: objects to delete (doomed now or by an earlier sweep whose delete failed), but those whose delete was
-- refused earlier in this sweep.
SELECT object_key FROM staged_uploads WHERE doomed_at IS NOT NULL
   AND NOT (object_key = ANY(%(skip)s::text[]))
ORDER BY doomed_at, object_key
LIMIT %(batch)s;

-- name: postpone_staged_uploads
-- Sweeper: doomed objects whose delete the store refused (403 ...) stay doomed (never recorded again) and go
-- behind every other doomed object: they are retried each sweep, after the others, and never block them.
UPDATE staged_uploads SET doomed_at = now() WHERE object_key = ANY(%(keys)s::text[]) AND doomed_at IS NOT NULL;

-- name: forget_staged_uploads
-- Sweeper: the objects are deleted; their records go too.
DELETE FROM staged_uploads WHERE object_key = ANY(%(keys)s) AND doomed_at IS NOT NULL;

-- name: release_failed_originals
-- Sweeper: failed jobs older than the failed-retention release their
-- original; replay then answers 409. The original's key is doomed in
-- staged_uploads (once no other job of the attachment keeps it) and deleted
-- by the staging sweep.
WITH released AS (
    UPDATE jobs SET original_purged_at = now()
    WHERE job_id IN (
        SELECT job_id FROM jobs
         WHERE state = 'failed' AND original_purged_at IS NULL
           AND updated_at < now() - make_interval(secs => %(retention_seconds)s)
         LIMIT %(batch)s
         FOR UPDATE SKIP LOCKED)
      AND state = 'failed'
    RETURNING job_id, attachment_id
), doomed AS (
    INSERT INTO staged_uploads (object_key, staged_at, doomed_at)
    SELECT a.original_key, now(), now()
    FROM released r JOIN attachments a USING (attachment_id)
    WHERE NOT EXISTS (SELECT 1 FROM jobs o WHERE o.attachment_id = r.attachment_id
                                              AND o.job_id <> r.job_id AND o.original_purged_at IS NULL)
    ON CONFLICT (object_key) DO UPDATE SET doomed_at = now()
)
SELECT job_id FROM released;

-- name: prune_idempotency_keys
DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => %(ttl_seconds)s);

-- name: prune_outbox
DELETE FROM outbox
WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => %(retention_seconds)s);

-- name: prune_events
-- Retention (EVENTS_RETENTION_SECONDS): the events of jobs terminal (ready, failed) for longer than the retention,
-- each job's whole path (the sweeper repeats the batch until none is left), never a live job's. A replay after
-- that starts a path of its own. Walked from the oldest event (primary key order): what is due is at the front, and
-- only the events of jobs still live stay there, so a prune never scans the jobs it pruned before.
DELETE FROM attachment_events
 WHERE seq IN (SELECT e.seq FROM attachment_events e JOIN jobs j USING (job_id)
                WHERE j.state IN ('ready', 'failed')
                  AND j.updated_at < now() - make_interval(secs => %(retention_seconds)s)
                ORDER BY e.seq
                LIMIT %(batch)s)
RETURNING job_id;

-- name: prune_replay_audit
DELETE FROM replay_audit WHERE id IN (
    SELECT id FROM replay_audit WHERE at < now() - make_interval(secs => %(retention_seconds)s) LIMIT %(batch)s)
RETURNING id;

-- name: prune_dlq_replays
DELETE FROM dlq_replays WHERE id IN (
    SELECT id FROM dlq_replays WHERE at < now() - make_interval(secs => %(retention_seconds)s) LIMIT %(batch)s)
RETURNING id;

-- name: prune_operator_audit
DELETE FROM operator_audit WHERE id IN (
    SELECT id FROM operator_audit WHERE at < now() - make_interval(secs => %(retention_seconds)s) LIMIT %(batch)s)
RETURNING id;

-- name: pipeline_gauges
-- Sweeper, each sweep: jobs per state, the age of the oldest queued job that is due, the outbox's pending rows and
-- the age of the oldest due one (the relay's lag). One count of the jobs table per sweep.
SELECT (SELECT coalesce(jsonb_object_agg(state, n), '{}'::jsonb)
          FROM (SELECT state, count(*) AS n FROM jobs GROUP BY state) s) AS jobs_by_state,
       (SELECT EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8
          FROM jobs WHERE state = 'queued' AND next_attempt_at <= now()) AS oldest_queued_seconds,
       (SELECT count(*) FROM outbox WHERE published_at IS NULL) AS outbox_pending,
       (SELECT EXTRACT(EPOCH FROM now() - min(available_at))::float8
          FROM outbox WHERE published_at IS NULL AND available_at <= now()) AS outbox_lag_seconds;

-- name: outbox_lag
-- Relay: the age of the oldest due, unpublished row (NULL: none due), for its readiness.
SELECT EXTRACT(EPOCH FROM now() - min(available_at))::float8 AS seconds
FROM outbox WHERE published_at IS NULL AND available_at <= now();

-- name: db_now
SELECT now() AS now;
