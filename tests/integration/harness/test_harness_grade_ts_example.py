"""A third implementation, in TypeScript on Node.js, written from docs/ alone, grades valid at level 4 through an
adapter that maps its own vocabulary — and its seeded bug is graded invalid by the invariant that names it.

`examples/ts-pipeline` keeps its own names: states PENDING/RUNNING/DONE/ERROR (`[vocabulary] states`), API paths
`/v1/files…` (`[paths]`), environment variables TS_* (`${VAR}` interpolation in `[env]`), timings in milliseconds,
metrics at `/prom`, a topic exchange, and no events endpoint (its transition log is read by `[events] sql`).
"""

from __future__ import annotations

import time
import tomllib

import pytest

from harness import adapter, scenarios
from harness.defaults import DEFAULT_PARALLEL
from harness.grade import grade
from harness.runner import ScenarioRun
from harness.schemas import REPO_ROOT

pytestmark = pytest.mark.integration

TS_EXAMPLE = REPO_ROOT / "examples" / "ts-pipeline"


def _built() -> None:
    main = TS_EXAMPLE / "dist" / "main.js"
    assert main.is_file(), f"{main} is missing: scripts/bootstrap.sh builds it with `npm ci` and `npm run build`"


def test_ts_example_grades_valid_at_level_4(stack, tmp_path):
    _built()
    sut = adapter.load(TS_EXAMPLE / "adapter.toml")
    raw = sut.raw
    # Its own vocabulary, mapped by the adapter alone (no wrapper script, no events endpoint).
    assert raw["vocabulary"]["states"] == {"PENDING": "queued", "RUNNING": "processing", "DONE": "ready",
                                           "ERROR": "failed"}
    assert raw["events"]["sql"] and raw["http"]["metrics_path"] == "/prom"
    assert all(cmd[0] == "node" for cmd in [spec["command"] for spec in raw["roles"].values()])
    began = time.monotonic()
    results, grade_dir = grade(sut, 4, seed=20261202, stack=stack, reports_dir=tmp_path,
                               parallel=DEFAULT_PARALLEL)
    print(f"\n[grade] ts-pipeline at level 4 took {time.monotonic() - began:.1f}s")
    failing = {s["name"]: [f"{v['invariant']}: {v['summary']}" for v in s["verdicts"] if v["status"] != "valid"]
               or s.get("error") for s in results["scenarios"] if s["verdict"] != "valid"}
    not_passed = {rid: r["why"] for rid, r in results["requirements"].items() if r["status"] != "pass"}
    assert results["verdict"] == "valid", (failing, not_passed)
    assert not not_passed
    rows = {item: row["why"] for item, row in results["checklist"].items()
            if row["status"] != "pass" and not (row["status"] == "not required" and row["level"] > 4)}
    assert rows == {}, rows  # every checklist row of level 4 proven: none unknown, none not proven
    by_name = {s["name"]: s for s in results["scenarios"]}
    # Transitions came from the SQL query: state_regression judged real paths, in the service's vocabulary mapped.
    regression = next(v for v in by_name["window-commit-ack-failpoint"]["verdicts"]
                      if v["invariant"] == "state_regression")
    assert regression["status"] == "valid" and regression["exercised"], regression["summary"]
    # The topic exchange's publishes were tapped, and the expiry metric was read at /prom.
    hygiene = next(v for v in by_name["redelivery-of-ready-job"]["verdicts"] if v["invariant"] == "message_hygiene")
    assert hygiene["exercised"], hygiene["summary"]
    metric = next(v for v in by_name["expiry-after-backlog"]["verdicts"] if v["invariant"] == "expiry_metric")
    assert metric["status"] == "valid" and metric["exercised"], metric["summary"]


def test_ts_example_seeded_bug_is_graded_invalid_by_ack_after_commit(stack, tmp_path):
    """TS_BUG_ACK_BEFORE_COMMIT=1 (adapter-bug.toml): the worker acks a delivery as soon as it claims the job."""
    _built()
    good = tomllib.loads((TS_EXAMPLE / "adapter.toml").read_text())
    bug = tomllib.loads((TS_EXAMPLE / "adapter-bug.toml").read_text())
    assert bug["env"].pop("TS_BUG_ACK_BEFORE_COMMIT") == "1"
    for key in ("name", "description"):  # otherwise the same adapter: the one switch is the bug
        bug.pop(key), good.pop(key)
    assert bug == good
    sut = adapter.load(TS_EXAMPLE / "adapter-bug.toml")
    seed = 4242
    results = ScenarioRun(scenarios.find("window-s3-commit-failpoint"), sut, stack, seed, 4,
                          run_dir=tmp_path / "bug", progress=print).execute()
    statuses = {v["invariant"]: v for v in results["verdicts"]}
    assert results["verdict"] == "invalid", {k: v["summary"] for k, v in statuses.items()}
    verdict = statuses["ack_after_commit"]
    assert verdict["status"] == "invalid", verdict["summary"]
    assert verdict["seed"] == seed and any(e.get("job_id") or e.get("attachment_id") for e in verdict["evidence"])
