"""Retry policy: full-jitter exponential backoff (CONTRACT §8).

``delay(n) = uniform(0, min(cap, base * 2**n))`` where n counts the failures
before this one (0 for the first retry). Defaults: base 1 s, cap 600 s.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class FullJitterBackoff:
    base_seconds: float = 1.0
    cap_seconds: float = 600.0

    def ceiling(self, failures_before: int) -> float:
        """Upper bound of the delay after ``failures_before`` earlier failures."""
        exponent = min(max(failures_before, 0), 62)  # 2**62 * base already exceeds any cap
        return min(self.cap_seconds, self.base_seconds * (2.0 ** exponent))

    def delay(self, failures_before: int, rng: random.Random | None = None) -> float:
        ceiling = self.ceiling(failures_before)
        return rng.uniform(0.0, ceiling) if rng is not None else random.uniform(0.0, ceiling)


@dataclass(frozen=True)
class AttemptBudget:
    """How many managed attempts a job gets per round (a replay starts a new round)."""

    max_attempts: int = 20

    def exhausted(self, attempt: int, attempt_base: int = 0) -> bool:
        return attempt - attempt_base >= self.max_attempts


def reconnect_delays(base: float = 0.2, cap: float = 5.0) -> Iterator[float]:
    """Endless full-jitter delays for reconnect loops of long-running roles."""
    policy = FullJitterBackoff(base, cap)
    failures = 0
    while True:
        yield max(0.05, policy.delay(failures))
        failures += 1
