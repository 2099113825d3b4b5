"""Broken on purpose, in its adapter only: the reference unchanged, run with LEASE_SECONDS=4 by an adapter that
claims ``lease_seconds = 30``.

Nothing is patched here: the worker is the reference's. The bug is the claim. The checkers place their windows by
the declared lease (how long a pause must last to outlive it, how soon a recovery may come), so a declared lease
seven times the real one misplaces every one of them; lease_ownership measures the lease the implementation keeps
(a job whose only worker crashed is recovered about four seconds after its claim) and flags the claim.
"""

import sys

from reference.cli import main

if __name__ == "__main__":
    sys.exit(main())
