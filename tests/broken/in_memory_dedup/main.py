"""Broken on purpose: completed jobs are remembered in process memory only.

The reference refuses to claim a job that is not `queued` (the database is the
de-duplication). This variant claims `ready` jobs too and relies on a set of
completed job ids kept in the worker's memory — which a restart empties, so a
redelivery after a crash between commit and ack runs the job a second time.
"""

import sys

from reference import worker as worker_mod
from reference.cli import main
from reference.db.queries import queries

statements = queries()._statements


def patched(name: str, old: str, new: str) -> None:
    """Replace exactly one fragment of a reference statement, or refuse to start (the reference changed shape)."""
    if statements[name].count(old) != 1:
        raise SystemExit(f"in_memory_dedup variant: {name} changed shape; update tests/broken/in_memory_dedup")
    statements[name] = statements[name].replace(old, new)


# The claim no longer refuses a job that is already ready; its event records where the job really came from.
patched("claim_job", "AND state = 'queued'", "AND state IN ('queued', 'ready')")
patched("claim_job", "SELECT attachment_id, job_id, 'queued', 'processing'",
        "SELECT attachment_id, job_id, CASE WHEN EXISTS (SELECT 1 FROM attachment_events e WHERE e.job_id = "
        "claimed.job_id AND e.to_state = 'ready') THEN 'ready' ELSE 'queued' END, 'processing'")
# With the database no longer de-duplicating, a second commit overwrites the first result.
patched("commit_result", "    RETURNING variant\n",
        "    ON CONFLICT (attachment_id, pipeline_version, variant) DO UPDATE SET sha256 = EXCLUDED.sha256,\n"
        "        job_id = EXCLUDED.job_id, attempt = EXCLUDED.attempt, fencing_token = EXCLUDED.fencing_token\n"
        "    RETURNING variant\n")

COMPLETED: set = set()  # THE BUG: job ids whose result this process committed, forgotten on every restart
_original_process = worker_mod.Worker._process
_original_commit = worker_mod.Worker._commit


async def _process_with_memory(self, message, job, *args, **kwargs):
    if str(job.job_id) in COMPLETED:
        await message.ack()
        return
    await _original_process(self, message, job, *args, **kwargs)


async def _commit_and_remember(self, claim, results, *args, **kwargs):
    outcome = await _original_commit(self, claim, results, *args, **kwargs)
    if outcome == "ready":
        COMPLETED.add(str(claim["job_id"]))
    return outcome


worker_mod.Worker._process = _process_with_memory
worker_mod.Worker._commit = _commit_and_remember

if __name__ == "__main__":
    sys.exit(main())
