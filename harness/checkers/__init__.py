"""Checkers: one module per invariant, each a pure ``check(history, final, run) -> Verdict``."""

from __future__ import annotations

from . import (ack_after_commit, batch_independence, bounded_concurrency, bounded_retries, dead_letter,
               duplicate_effects, expiry,
               fault_coverage, hostile_inputs, lease_ownership, lost_accepted_work, message_hygiene, redundant_publish,
               replay_audit, retry_exhaustion, role_stability, staging_safety, state_regression)
from . import clock_agreement, order_independence
from . import expiry_metric
from . import lease_renewal, owner_overlap
from . import stale_ack
from . import delivery_accounting
from . import upload_idempotency
from . import version_isolation
from . import broker_failover
from . import dead_letter_replay
from . import copies_raced
from . import tamper_evidence
from .base import INVALID, TAMPERED, UNKNOWN, VALID, Verdict, combine

CHECKERS = {
    module.NAME: module
    for module in (lost_accepted_work, duplicate_effects, state_regression, bounded_retries, ack_after_commit,
                   message_hygiene, lease_ownership, staging_safety, replay_audit, expiry, bounded_concurrency,
                   order_independence, clock_agreement,
                   batch_independence, redundant_publish, role_stability, hostile_inputs, fault_coverage,
                   retry_exhaustion, dead_letter, expiry_metric, lease_renewal,
                   owner_overlap, stale_ack, delivery_accounting, upload_idempotency, version_isolation,
                   broker_failover, dead_letter_replay, copies_raced, tamper_evidence)
}


# Invariants whose "cannot tell" always makes a scenario unknown: observation itself failed (no message seen, no
# upload accepted, a scheduled fault that never happened). Any other checker's unknown counts only in a scenario
# that declares it among its checks; elsewhere it proves nothing and is shown as not counted.
ALWAYS_COUNTED = frozenset({"fault_coverage", "lost_accepted_work", "message_hygiene"})


def counts(verdict: Verdict | dict, declared: list[str] | None) -> bool:
    """Whether this verdict's status decides the scenario's: every valid/invalid does; an unknown only if relied on."""
    data = verdict if isinstance(verdict, dict) else verdict.to_dict()
    return (data["status"] != UNKNOWN or declared is None or data["invariant"] in declared
            or data["invariant"] in ALWAYS_COUNTED)


def _canonical_final(final):
    import json

    from ..formats import canonical_ids, has_upper_uuid

    if isinstance(final, dict) and has_upper_uuid(json.dumps(final, default=str)):
        return canonical_ids(final)
    return final


def run_checks(history, final, run, names=None) -> list[Verdict]:
    """Run the named checkers (default: all) and return their verdicts; a crashing checker yields unknown.
    UUIDs are case-insensitive: the final state is read with each in lower case, as the history is (formats.py)."""
    final = _canonical_final(final)
    verdicts = []
    for name in names or CHECKERS:
        module = CHECKERS[name]
        try:
            verdicts.append(module.check(history, final, run))
        except Exception as exc:  # a checker bug must not pass silently as valid
            verdicts.append(Verdict(name, UNKNOWN, list(module.REQUIREMENTS), f"checker crashed: {exc!r}",
                                    seed=run.get("seed")))
    return verdicts


__all__ = ["ALWAYS_COUNTED", "CHECKERS", "INVALID", "TAMPERED", "UNKNOWN", "VALID", "Verdict", "combine", "counts", "run_checks"]
