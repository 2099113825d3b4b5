"""Broken on purpose: the deadline is never checked.

The reference checks a job's deadline (creation + TTL, on the database clock)
at the claim, before each variant write and in the fenced commit; expired work
ends ``failed`` with the expiry error_code. This variant's worker reads every
job as unexpired (and its sweeper never expires a queued one) and commits without the deadline clause — the usual result of
"the TTL is just a column nobody reads": a backlog that outlived its deadline
is rendered and published ``ready`` anyway.

Everything else is the reference.
"""

import sys

from reference import sweeper as sweeper_mod
from reference import worker_jobs as jobs_mod
from reference.cli import main
from reference.db.queries import Queries, queries

_statements = {name: getattr(queries(), name) for name in queries().names()}
_blind = Queries({name: sql.replace("expires_at <= now() AS expired", "false AS expired")  # THE BUG
                  .replace("j.false AS expired", "false AS expired")
                  .replace("AND expires_at > now()", "")
                  for name, sql in _statements.items()})
jobs_mod.queries = lambda: _blind


async def _nothing(self) -> int:
    return 0


sweeper_mod.Sweeper._expire_queued = _nothing  # nor does the sweeper: a queued job past its deadline stays queued

if __name__ == "__main__":
    sys.exit(main())
