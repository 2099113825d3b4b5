"""Broken on purpose: one attempt too many.

The reference gives a job that keeps failing exactly ``max_attempts``
attempts, then ends it ``failed`` with an error_code. This variant checks the
budget with ``>`` where ``>=`` belongs — the classic off-by-one — so every
job that keeps failing gets ``max_attempts + 1`` attempts: the retry limit the
implementation declares is not the one it keeps.

Everything else is the reference.
"""

import sys

from reference import backoff
from reference.cli import main


def _exhausted_one_late(self, attempt: int, attempt_base: int = 0) -> bool:
    return attempt - attempt_base > self.max_attempts  # THE BUG: >= is the limit


backoff.AttemptBudget.exhausted = _exhausted_one_late

if __name__ == "__main__":
    sys.exit(main())
