"""Broken on purpose: a fixed retry delay (no exponential growth, no jitter).

The reference waits ``uniform(0, min(cap, base * 2**n))`` before the next attempt of a job that met a transient
error (full jitter, CONTRACT §8). This variant waits the same constant delay — the declared base — before every
retry, whatever the retry number: the attempt limit still holds and every job still ends ``failed`` at
max_attempts, but the backoff neither grows nor spreads, so a dependency that is down is hammered at a fixed
rate by every job at once. Only the worker's retry backoff is replaced; everything else is the reference.
"""

import sys

from reference import backoff as backoff_mod
from reference.cli import main


def _fixed_delay(self, failures_before, rng=None):
    return self.base_seconds  # THE BUG: one delay for every retry number and every job


backoff_mod.FullJitterBackoff.delay = _fixed_delay

if __name__ == "__main__":
    sys.exit(main())
