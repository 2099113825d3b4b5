"""Each deliberately broken variant is graded invalid by the invariant that names its bug (tests/broken/)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness import adapter, scenarios
from harness.grade import runs_alone
from harness.runner import ScenarioRun, check_run_dir
from harness.schemas import REPO_ROOT

pytestmark = pytest.mark.integration

SEED = 4242
# A bug that shows only when a crash lands while a second delivery is still unfinished is provoked by timing: its
# case gets further seeds, tried in turn until one run shows it (each run is reported with its own seed).
TIMING_SEEDS = {"ack_multiple": (SEED, 7, 11)}
CASES = [
    # variant folder, the one scenario that catches it, the invariants that must call it invalid
    ("ack_before_commit", "window-s3-commit-failpoint", {"ack_after_commit"}),
    ("no_outbox", "window-commit-publish-failpoint", {"lost_accepted_work"}),
    ("in_memory_dedup", "window-commit-ack-failpoint", {"state_regression", "duplicate_effects"}),
    # One shared ack for the batch: the crashed consumer's unfinished delivery was already settled (BE-JOB-007).
    ("ack_multiple", "batch-crash-after-partial-commit", {"batch_independence", "ack_after_commit"}),
    # A pixel cap of 150 MP instead of ~40 MP: the decompression bomb is accepted and rendered ready (BE-JOB-003).
    ("pixel_cap_too_high", "hostile-images", {"hostile_inputs"}),
    # A worker that refuses a job created well before the newest it has started, as out of date: the permuted
    # queue loses work (BE-JOB-004.1).
    ("order_dependent", "permuted-parallel-delivery", {"order_independence"}),
    # A worker that judges expiry by its own wall clock against the producer's expires_at: with its clock ahead,
    # fresh work expires (BE-JOB-005.4).
    ("local_clock_expiry", "clock-skew-expiry", {"clock_agreement"}),
    # Expired jobs end failed/expired correctly but the expiry metric never moves (BE-JOB-005.3).
    ("expiry_uncounted", "expiry-after-backlog", {"expiry_metric"}),
    # A lease renewal that fails is taken as renewed: the worker keeps writing variants after its lease ran out,
    # while the database link is refused and after the job was recovered (BE-JOB-006.2).
    ("renewal_ignored", "lease-renewal-delayed-and-refused", {"lease_renewal"}),
    # prefetch 0 (no limit): a backlog is pushed to one consumer all at once (BE-JOB-004.3).
    ("unbounded_prefetch", "prefetch-under-backlog", {"bounded_concurrency"}),
    # The original's storage location in a message header (contract: identifiers only).
    ("message_carries_location", "window-commit-publish-failpoint", {"message_hygiene"}),
    # Staging cleanup by age alone deletes the originals of accepted work.
    ("staging_cleanup_by_age", "window-staging-record-failpoint", {"staging_safety"}),
    # The worker never reads a job's deadline: a backlog that outlived it is rendered ready (BE-JOB-005.1).
    ("expiry_ignored", "expiry-after-backlog", {"expiry"}),
    # The lost-message safety net republishes without looking at the queue: copies pile up behind held consumers.
    ("republish_blindly", "backlog-no-republish", {"redundant_publish"}),
    # The operator replay endpoint accepts any caller (BE-JOB-003.3).
    ("replay_without_token", "poison-replay", {"replay_audit"}),
    # "Let it crash": the worker exits after failing a bad image; the platform restarts it (crash loop).
    ("exit_after_bad_image", "poison-message", {"role_stability"}),
    # Unprocessable messages nacked with requeue instead of dead-lettered: a requeue loop (BE-JOB-003.3).
    ("dead_letter_requeue_loop", "unparseable-message-dead-lettered", {"dead_letter"}),
    # Every retry waits one constant delay: attempts still bounded, but the backoff neither grows nor spreads
    # (BE-JOB-003.2).
    ("fixed_retry_delay", "retry-budget-exhausted", {"retry_exhaustion"}),
    # The attempt budget checked with > instead of >=: one attempt more than max_attempts (BE-JOB-003.2).
    ("retry_limit_off_by_one", "retry-budget-exhausted", {"bounded_retries", "retry_exhaustion"}),
    # A worker that finds its lease lapsed (woken from a pause) gives the job up and acks its delivery: with
    # recovery held, the job is left processing with no message anywhere (BE-JOB-006.4).
    ("ack_on_lost_lease", "stale-owner-settles-nothing", {"stale_ack"}),
]
# Scenarios where most jobs end failed with an error_code on purpose: a fault that fails every attempt, or a
# workload made mostly of poison.
FAILS_ON_PURPOSE = {"retry-budget-exhausted", "poison-replay"}
# What an invalid verdict's evidence may name the culprit by.
NAMING_KEYS = ("attachment_id", "attachment_ids", "job_id", "marker", "role", "consumer_tag")


TEST_NAME = "test_broken_variant_is_graded_invalid_by_its_invariant"
SIDE_BY_SIDE = 2  # variants graded at once on the shared stack, each with its own tenant and proxies


def grade_variant(stack, folder, variant: str, scenario_name: str) -> tuple[dict, object, int]:
    """Run the variant's scenario, trying its seeds in turn until one shows the bug: (results, run_dir, seed)."""
    sut = adapter.load(REPO_ROOT / "tests" / "broken" / variant)
    for seed in TIMING_SEEDS.get(variant, (SEED,)):
        run_dir = folder / f"{variant}-s{seed}"
        results = ScenarioRun(scenarios.find(scenario_name), sut, stack, seed, 4, run_dir=run_dir,
                              progress=print).execute()
        if results["verdict"] == "invalid":
            break
        print(f"[broken] {variant} not provoked with seed {seed}: {results['verdict']}")
    return results, run_dir, seed


@pytest.fixture(scope="module")
def graded(request, stack, tmp_path_factory) -> dict:
    """Every selected variant graded once, two side by side (a scenario that restarts a service runs alone
    first), so the cases below only judge stored results: the suite takes half the time it would one by one."""
    selected = {item.callspec.params["variant"] for item in request.session.items
                if getattr(item, "originalname", None) == TEST_NAME}
    chosen = [case for case in CASES if case[0] in selected]
    folder = tmp_path_factory.mktemp("broken")
    alone = [c for c in chosen if runs_alone(scenarios.find(c[1]))]
    out = {c[0]: grade_variant(stack, folder, c[0], c[1]) for c in alone}
    with ThreadPoolExecutor(SIDE_BY_SIDE, thread_name_prefix="broken") as pool:
        futures = {c[0]: pool.submit(grade_variant, stack, folder, c[0], c[1]) for c in chosen if c not in alone}
        for variant, future in futures.items():
            try:
                out[variant] = future.result()
            except Exception as exc:  # one variant's run error fails its own case, not the others
                out[variant] = exc
    return out


# The first case's setup grades every variant: its time limit covers them all.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("variant, scenario_name, invariants", CASES, ids=[c[0] for c in CASES])
def test_broken_variant_is_graded_invalid_by_its_invariant(graded, variant, scenario_name, invariants):
    if isinstance(graded[variant], Exception):
        raise graded[variant]
    results, run_dir, seed = graded[variant]
    sut = adapter.load(REPO_ROOT / "tests" / "broken" / variant)
    statuses = {v["invariant"]: v for v in results["verdicts"]}
    # The variant works apart from its one bug: most accepted uploads still end ready (or expired, where the
    # scenario makes them outlive their deadline on purpose).
    final = json.loads((run_dir / "final.json").read_text())
    bodies = [a["body"] for a in final["attachments"].values() if a.get("body")]
    done = [b for b in bodies if b["state"] == "ready" or b.get("error_code") == sut.expiry["error_code"]
            or (scenario_name in FAILS_ON_PURPOSE and b["state"] == "failed" and b.get("error_code"))]
    assert len(done) >= len(bodies) / 2, [(b["state"], b.get("error_code")) for b in bodies]
    assert results["verdict"] == "invalid", {k: v["summary"] for k, v in statuses.items()}
    for name in invariants:
        verdict = statuses[name]
        assert verdict["status"] == "invalid", (name, verdict["summary"])
        assert verdict["seed"] == seed and verdict["evidence"]
        # The evidence names what went wrong: an attachment, a message the harness injected (its marker), the
        # role that exited, or the consumer over its bound.
        assert any(any(e.get(k) for k in NAMING_KEYS) for e in verdict["evidence"])
    assert f"--seed {seed}" in results["reproduce"] and scenario_name in results["reproduce"]
    # The stored run re-checks to the same verdict without any service.
    again = check_run_dir(run_dir, write=False)
    assert [(v["invariant"], v["status"]) for v in again["verdicts"]] == \
        [(v["invariant"], v["status"]) for v in results["verdicts"]]
