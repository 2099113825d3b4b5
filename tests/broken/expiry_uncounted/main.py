"""Broken on purpose: expiry is not counted.

The reference ends an expired job ``failed`` with the expiry error_code and no
effect, and counts it on its expiry metric. This variant still expires jobs
correctly (worker and sweeper) but never counts them: the counter of expired jobs stays at zero, so
an operator watching the metrics cannot tell a backlog that outlived its
deadline from an idle system (the seeds ask for a metric of its own).

Everything else is the reference.
"""

import sys

from reference import metrics
from reference.cli import main

metrics.count_expired = lambda *args, **kwargs: None  # THE BUG: expiry happens (worker and sweeper), the metric never moves

if __name__ == "__main__":
    sys.exit(main())
