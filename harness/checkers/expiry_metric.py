"""Expiry has a metric of its own (BE-JOB-005: "отдельной метрики истечения").

The adapter names the counter of expired jobs (``[expiry] metric``) and the roles that serve ``/metrics``
(the ``[http]`` role, and those of ``[metrics]``); after the drain the harness read each once (``metrics``
events). Every job the run saw end expired (``failed`` with the expiry error_code) must be counted: the sum over
the roles is at least the number of expired jobs. A counter lower than that is ``invalid`` — unless an instance
serving it was restarted during the run (a process's counter starts again from zero), or could not be read,
which makes the check ``unknown``. A sum above it is noted (one expired job counted on more than one delivery,
say), not judged: the seed asks that expiry be counted apart from success and failure, not how.

The metric must be one of expiry: its name says so (``expired``/``expiry``/``expire``), or a label selector the
adapter gives with it does (``jobs_total{outcome="expired"}``). Any other counter — ``http_requests_total``, a
counter of every finished job — could be large enough by chance and proves nothing: ``unknown``, with the reason.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..metrics import selector
from ..history import History
from .base import INVALID, UNKNOWN, VALID, Verdict, evidence, expiry_code, final_read_ok, seed_of, FinalState, RunInfo

NAME = "expiry_metric"
REQUIREMENTS = ["BE-JOB-005"]
NEEDS = (("expiry.metric", "[expiry] metric (the counter of expired jobs)"),)


def expired_attachments(final: dict[str, Any], code: str) -> list[str]:
    return sorted(a for a, record in (final.get("attachments") or {}).items()
                  if ((record or {}).get("body") or {}).get("state") == "failed"
                  and ((record or {}).get("body") or {}).get("error_code") == code)


def names_expiry(metric: str) -> bool:
    """Whether the metric (with its label selector, if any) is one of expiry by its own words."""
    parsed = selector(metric)
    if parsed is None:
        return False
    name, labels = parsed
    words = [name, *labels.values()]
    return any("expir" in w.lower() for w in words)


def restarted_instances(history: History, roles: set[str]) -> list[str]:
    """Instances of ``roles`` started more than once: their counters began again from zero."""
    starts: dict[str, int] = {}
    for e in history.of_type("role"):
        if e.get("action") == "start" and str(e.get("role", "")).split("#")[0] in roles:
            starts[e["role"]] = starts.get(e["role"], 0) + 1
    return sorted(name for name, n in starts.items() if n > 1)


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    seed = seed_of(run)
    metric = ((run.get("adapter") or {}).get("expiry") or {}).get("metric")

    def verdict(status: str, summary: str, found: Iterable[dict[str, Any]] = (), exercised: bool = True) -> Verdict:
        return Verdict(NAME, status, REQUIREMENTS, summary, exercised=exercised, evidence=list(found), seed=seed)

    if not final_read_ok(final):
        return verdict(UNKNOWN, "the final state could not be read", exercised=False)
    code = expiry_code(run)
    expired = expired_attachments(final, code)
    if not expired:
        return verdict(VALID, f"no job ended expired ({code}): nothing for an expiry metric to count",
                       exercised=False)
    if not metric:
        return verdict(UNKNOWN, f"{len(expired)} jobs ended expired, but the adapter names no expiry metric "
                                "([expiry] metric): the metric the seed asks for could not be read", exercised=False)
    if not names_expiry(metric):
        return verdict(UNKNOWN, f"{len(expired)} jobs ended expired, but the adapter's expiry metric {metric!r} is "
                                "not one of expiry (neither its name nor a label selector such as "
                                "outcome=\"expired\" says so): a counter of something else proves nothing about "
                                "expiry however large it is", exercised=False)
    reads = history.of_type("metrics")
    declared = (run.get("scenario") or {}).get("checks")
    if not reads and isinstance(declared, list) and NAME not in declared:
        # The runner reads /metrics only for a scenario that asks for this check (harness/runner.py _read_metrics):
        # elsewhere no read is no failure to read, and the jobs expired here are counted where it is asked for.
        return verdict(VALID, f"{len(expired)} jobs ended expired; not judged here: this scenario does not ask for "
                              f"{NAME}, so no /metrics was read", exercised=False)
    if not reads:
        return verdict(UNKNOWN, f"{len(expired)} jobs ended expired but no /metrics was read", exercised=False)
    counted = sum(float((e.get("values") or {}).get(metric, 0.0)) for e in reads if e.get("ok"))
    unread = [e for e in reads if not e.get("ok")]
    serving = {e["instance"]: e.get("values", {}).get(metric) for e in reads if e.get("ok")}
    base: dict[str, Any] = dict(metric=metric, counted=counted, expired=len(expired), attachment_ids=expired[:10],
                per_instance=serving, events=reads)
    if counted >= len(expired):
        extra = f"; {counted - len(expired):g} more than the jobs seen expired" if counted > len(expired) else ""
        return verdict(VALID, f"{len(expired)} jobs ended expired and {metric} counts {counted:g}{extra}",
                       [evidence("expired jobs counted by the expiry metric", **base)])
    if unread:
        return verdict(UNKNOWN, f"{metric} counts {counted:g} of {len(expired)} expired jobs, but "
                                f"{len(unread)} /metrics could not be read: "
                                + "; ".join(f"{e['instance']}: {e.get('error')}" for e in unread), exercised=False)
    restarted = restarted_instances(history, {e["role"] for e in reads})
    if restarted:
        return verdict(UNKNOWN, f"{metric} counts {counted:g} of {len(expired)} expired jobs, but "
                                f"{', '.join(restarted)} restarted during the run (its counter began again)",
                       exercised=False)
    what = "no metric counts expiry" if counted == 0 else f"{metric} misses {len(expired) - counted:g} of them"
    return verdict(INVALID, f"{len(expired)} jobs ended expired ({code}) but {what} (read after the drain)",
                   [evidence(f"{len(expired)} expired jobs, {metric} = {counted:g}", **base)])
