"""Checkers: one module per invariant, each a pure ``check(history, final, run) -> Verdict``."""

from __future__ import annotations

from . import (ack_after_commit, bounded_concurrency, bounded_retries, duplicate_effects, expiry, fault_coverage,
               lease_ownership, lost_accepted_work, message_hygiene, replay_audit, staging_safety, state_regression)
from .base import INVALID, UNKNOWN, VALID, Verdict, combine

CHECKERS = {
    module.NAME: module
    for module in (lost_accepted_work, duplicate_effects, state_regression, bounded_retries, ack_after_commit,
                   message_hygiene, lease_ownership, staging_safety, replay_audit, expiry, bounded_concurrency,
                   fault_coverage)
}


def run_checks(history, final, run, names=None) -> list[Verdict]:
    """Run the named checkers (default: all) and return their verdicts; a crashing checker yields unknown."""
    verdicts = []
    for name in names or CHECKERS:
        module = CHECKERS[name]
        try:
            verdicts.append(module.check(history, final, run))
        except Exception as exc:  # a checker bug must not pass silently as valid
            verdicts.append(Verdict(name, UNKNOWN, list(module.REQUIREMENTS), f"checker crashed: {exc!r}",
                                    seed=run.get("seed")))
    return verdicts


__all__ = ["CHECKERS", "INVALID", "UNKNOWN", "VALID", "Verdict", "combine", "run_checks"]
