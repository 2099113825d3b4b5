"""A short `harness load prefetch` (backlog 200, prefetch 1 and 16) and `harness load upload` (locust ~10 s) on the
reference and the real services: the checks, files and figures have their structure. No absolute timings are
asserted (the machine is shared); the full curve (`--backlog 10000 --prefetch 1,4,16,64`) is run by hand."""
from __future__ import annotations

import csv
import json

import pytest

from harness import adapter
from load import prefetch_curve, upload_load

pytestmark = [pytest.mark.integration, pytest.mark.benchmark]

# The reference refuses WORKER_BATCH_SIZE above its prefetch: a prefetch-1 point runs with batches of one.
ENV = {"WORKER_BATCH_SIZE": "1"}


# A long run (make test-long): a load curve; CI keeps the short upload load below.
@pytest.mark.long
def test_a_short_prefetch_curve_of_the_reference(stack, tmp_path):
    lines: list[str] = []
    result = prefetch_curve.run(stack, adapter.load("reference"), [1, 16], 200, 4242, tmp_path, lines.append,
                                level=4, extra_env=ENV)
    assert [s["prefetch"] for s in result["summaries"]] == [1, 16]
    for s in result["summaries"]:
        assert not s.get("error"), s
        assert s["drained"] and s["states"] == {"ready": 200}
        assert s["max_unacked"] <= s["prefetch"] and s["consumer_prefetch"] == s["prefetch"]
        assert s["jobs_per_s"] > 0 and s["rss_ratio"] is not None
    # The sampler saw work in flight. Not asserted per level: on a loaded machine the broker's channel statistics
    # lagged a whole 10 s drain once (13 samples of prefetch 16, every one 0 unacked).
    assert max(s["max_unacked"] for s in result["summaries"]) >= 1
    checks = {(c["check"], c["prefetch"]): c["status"] for c in result["checks"]}
    assert set(checks) == {(name, p) for name in ("unacked_within_prefetch", "rss_flat", "throughput") for p in (1, 16)}
    assert all(checks[("unacked_within_prefetch", p)] == "pass" for p in (1, 16))
    assert all(checks[("throughput", p)] == "pass" for p in (1, 16))
    for name in ("samples.csv", "summary.csv", "checks.json", "curve.svg", "curve.png", "summary.md", "index.html"):
        assert (tmp_path / name).is_file(), name
    rows = list(csv.DictReader((tmp_path / "samples.csv").open()))
    assert {r["prefetch"] for r in rows} == {"1", "16"}
    assert json.loads((tmp_path / "checks.json").read_text())["seed"] == 4242
    assert any("releasing the consumers" in line for line in lines)


def test_a_short_upload_load_of_the_reference(stack, tmp_path):
    result = upload_load.run(stack, adapter.load("reference"), 4, 10, 4242, tmp_path, print, baseline_ops=40, level=4)
    c = result["comparison"]
    assert result["ok"] and c["requests"] > 0
    assert c["p50_ratio"] > 0 and c["p99_ratio"] > 0 and result["baseline"]["ops"] == 40
    assert "POST /v1/attachments [bad]" in c["per_kind"] or "POST /v1/attachments [hostile]" in c["per_kind"]
    for name in ("locust_stats.csv", "locust.html", "result.json", "summary.md"):
        assert (tmp_path / name).is_file(), name
