"""Broken on purpose: after its claim the worker never checks that it still owns the job.

The reference fences every write of a claimed job: its lease renewal is refused once the job was recovered and
claimed anew (a new fencing token), the worker then stops before any further effect, and its commit is one
statement guarded by the fencing token, a live lease and ``state = 'processing'``. This variant trusts its claim
for good: the lease is kept (renewed) for show, but a lapsed or refused one never stops the work, and the commit
names the job alone — no token, no lease, no state in its WHERE, the results upserted. An owner paused past its
lease wakes up after the job was recovered and claimed by another worker, finishes its stale work and commits it
over the new owner's: a second ``processing → ready`` event, by the old owner, stamped with the row's current
attempt (so an attempt-number check sees nothing wrong).

Everything else is the reference: the claim, the sweeper, the relay.
"""

import sys

from reference import lease as lease_mod
from reference.cli import main
from reference.db.queries import queries

# THE BUG (1/2): a lease found lapsed or lost never stops the work (no LeaseLost before a write or the commit).
async def _wait_live_trusting_the_claim(self, stop=None, timeout=None):
    return None


# THE BUG (2/2): the commit is not fenced: any worker that ever claimed the job commits its result.
UNFENCED_COMMIT = """
WITH fenced AS (
    UPDATE jobs
       SET state = 'ready', lease_owner = NULL, lease_expires_at = NULL,
           last_error = NULL, updated_at = now()
     WHERE job_id = %(job_id)s AND state IN ('processing', 'ready') AND expires_at > now()
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
    ON CONFLICT (attachment_id, pipeline_version, variant) DO UPDATE
       SET object_key = EXCLUDED.object_key, sha256 = EXCLUDED.sha256, size = EXCLUDED.size,
           content_type = EXCLUDED.content_type, width = EXCLUDED.width, height = EXCLUDED.height
    RETURNING variant
), event AS (
    INSERT INTO attachment_events (attachment_id, job_id, from_state, to_state, attempt, actor)
    SELECT attachment_id, job_id, 'processing', 'ready', attempt, %(actor)s FROM fenced
)
SELECT job_id, (SELECT count(*) FROM stored) AS stored FROM fenced
"""

lease_mod.Lease.wait_live = _wait_live_trusting_the_claim
queries()._statements["commit_result"] = UNFENCED_COMMIT

if __name__ == "__main__":
    sys.exit(main())
