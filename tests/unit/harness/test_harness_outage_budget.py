"""An outage may spend an attempt (issue 20: a correct shape misjudged).

``database-outages-past-lease`` runs with ``max_attempts = 1``. An implementation that counts attempts at the claim
(the contract allows it) spends the one attempt of a job whose lease lapsed while the database was cut: the job ends
``failed`` at its budget with an error_code — a transient fault spent attempts within the budget, as the seeds allow.
lost_accepted_work judges the budget and the outcome: failed with an error_code having spent exactly its budget while
a transient fault was in force is an outcome, not lost work; failed before the budget was spent, without an
error_code, or with no fault in force, is still lost. "Outages cost no attempt" is the reference's own property
(tests/integration/harness/test_harness_grade_reference.py), not a requirement on everyone.
"""

from __future__ import annotations

from harness.checkers import lost_accepted_work
from harness.checkers.base import INVALID, VALID
from harness_histories import ATT, Builder


def outage_spent(max_attempts=1, failed_attempt=1, error_code="attempts_exhausted", cut=True):
    b = Builder(lease=4, max_attempts=max_attempts,
                scenario={"name": "database-outages-past-lease", "checks": ["lost_accepted_work"]})
    b.upload(0)
    if cut:
        b.add(1.5, "fault", action="toxic", phase="start", service="postgres", toxic="cut")
        b.add(6.0, "fault", action="toxic", phase="end", service="postgres", toxic="cut")
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker#1"),
                        (6.5, "processing", "failed", failed_attempt, "sweeper#1")], error_code=error_code)
    return b


def test_an_outage_that_spent_the_whole_budget_is_an_outcome_not_lost_work():
    b = outage_spent()
    verdict = lost_accepted_work.check(b.history(), b.final, b.run)
    assert verdict.status == VALID, verdict.evidence
    assert any("budget" in e["message"] for e in verdict.evidence), verdict.evidence


def test_failed_before_its_budget_was_spent_is_still_lost():
    b = outage_spent(max_attempts=3, failed_attempt=1)
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == INVALID


def test_failed_without_a_fault_in_force_or_without_an_error_code_is_still_lost():
    calm = outage_spent(cut=False)
    assert lost_accepted_work.check(calm.history(), calm.final, calm.run).status == INVALID
    silent = outage_spent(error_code=None)
    assert lost_accepted_work.check(silent.history(), silent.final, silent.run).status == INVALID
