"""Broken on purpose: a dead-letter replay drops what it cannot map.

The reference's replay of dead letters leaves a message it cannot map back to a job (not JSON, no job_id, no such
job) in the dead-letter queue with its reason, and audits it as ``unmappable``. This variant takes it as handled:
the replay acknowledges it, so "replay everything" silently empties the dead-letter queue of exactly the messages
an operator most needs to look at.

Everything else is the reference.
"""

import sys

from reference import dlq
from reference.cli import main

_replay_one = dlq._replay_one


async def _drop_unmappable(pool, letter, audit, *args, **kwargs):
    result = await _replay_one(pool, letter, audit, *args, **kwargs)
    if result["outcome"] == "unmappable":  # THE BUG: acknowledged like a handled letter, gone from the queue
        result = {**result, "outcome": "already_terminal", "detail": "nothing to replay"}
    return result


dlq._replay_one = _drop_unmappable

if __name__ == "__main__":
    sys.exit(main())
