"""Broken on purpose: no fencing token after the claim, and the event log written from the row as it stands.

The reference fences every write of a claimed job with its fencing token: a renewal, the commit and every other
transition name the token the claim took, so an owner paused past its lease finds its renewal refused once the job
was claimed anew, stops, and its commit could not succeed anyway. This variant is what an implementation with a
lease but no token looks like: the renewal and the commit name the job alone (``UPDATE jobs ... WHERE job_id = ...
AND state = 'processing'``), and the lease never stops the work (it is the sweeper's timeout, nothing more). Its
event log is written the way a database trigger writes it: from the row as it stands when the commit lands — the
actor is the row's current lease owner, the attempt its current attempt.

An owner paused past its lease wakes after the job was recovered and claimed anew, finishes its stale work and
commits it while the new owner is still at work: one ``processing → ready`` event, stamped with the new owner's
actor and attempt, and a result that names the stale claim's objects. The new owner's commit then finds the job
``ready`` (fenced, nacked, a no-op on redelivery). The event log shows one claim committing once; only the objects
``ready`` names (written while the older claim held the job) show whose result it is.

Everything else is the reference: the claim (its own token, its own object keys), the sweeper, the relay.
"""

import sys

from reference import lease as lease_mod
from reference.cli import main
from reference.db.queries import queries


# THE BUG (1/3): a lease found lapsed or lost never stops the work.
async def _wait_live_trusting_the_claim(self, stop=None, timeout=None):
    return None


# THE BUG (2/3): a renewal names the job alone, so a stale owner's renewal succeeds while the new owner holds it.
TOKENLESS_RENEWAL = """
UPDATE jobs
   SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
 WHERE job_id = %(job_id)s AND state = 'processing'
RETURNING lease_expires_at
"""

# THE BUG (3/3): the commit is guarded by the state alone, and its event is the row's (a trigger's view): the actor
# is whoever holds the lease now, the attempt the row's current one — not the committing claim's.
STATE_ONLY_COMMIT = """
WITH current AS (
    SELECT job_id, lease_owner FROM jobs WHERE job_id = %(job_id)s
), fenced AS (
    UPDATE jobs
       SET state = 'ready', lease_owner = NULL, lease_expires_at = NULL,
           last_error = NULL, updated_at = now()
     WHERE job_id = %(job_id)s AND state = 'processing' AND expires_at > now()
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
    SELECT f.attachment_id, f.job_id, 'processing', 'ready', f.attempt,
           COALESCE('worker:' || split_part(c.lease_owner, '/', 1), %(actor)s)
    FROM fenced f JOIN current c USING (job_id)
)
SELECT job_id, (SELECT count(*) FROM stored) AS stored FROM fenced
"""

lease_mod.Lease.wait_live = _wait_live_trusting_the_claim
queries()._statements["renew_lease"] = TOKENLESS_RENEWAL
queries()._statements["commit_result"] = STATE_ONLY_COMMIT

if __name__ == "__main__":
    sys.exit(main())
