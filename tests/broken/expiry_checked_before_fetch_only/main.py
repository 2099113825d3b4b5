"""Broken on purpose: a job's deadline is checked at the claim only, before the fetch.

The reference checks a job's deadline (creation + TTL, on the database clock) at the claim, again before each
variant write (after a fetch or render that may have waited long) and in the fenced commit. This variant keeps the
check at the claim (a job already past its deadline there still ends ``failed`` with the expiry error_code and is
counted) but drops the two later ones: a job claimed in time whose fetch from a slow store outlasts its deadline
is rendered, written and committed ``ready`` after it. Everything else is the reference.
"""

import sys

from reference import worker as worker_mod
from reference import worker_jobs as jobs_mod
from reference.cli import main
from reference.db.queries import Queries, queries

_statements = {name: getattr(queries(), name) for name in queries().names()}
assert "AND expires_at > now()" in _statements["commit_result"]
_statements["commit_result"] = _statements["commit_result"].replace("AND expires_at > now()", "")  # THE BUG
_late = Queries(_statements)
jobs_mod.queries = lambda: _late


async def _never_expired(self, claim, expires_at=None) -> None:
    return None  # THE BUG: no re-check after the fetch and render, before the writes


worker_mod.Worker._ensure_not_expired = _never_expired

if __name__ == "__main__":
    sys.exit(main())
