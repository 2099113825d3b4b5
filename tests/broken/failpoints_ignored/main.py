"""Broken on purpose: failpoints declared, never wired.

The adapter says the implementation has failpoints (CONTRACT §7), and the harness
arms them by restarting a role with FAILPOINTS set. This worker drops the
variable before the reference reads it: an armed window is passed through as if
nothing were armed. Nothing is wrong with its processing; what is wrong is that
a grade would vouch for failure windows that were never entered. The
``fault_coverage`` check must refuse to: the scenario is ``unknown``, never
``valid``.

Everything else is the reference.
"""

import os
import sys

os.environ.pop("FAILPOINTS", None)  # THE BUG: the test hook is not wired

from reference.cli import main  # noqa: E402  (after the environment is cleared, as a real start-up would read it)

if __name__ == "__main__":
    sys.exit(main())
