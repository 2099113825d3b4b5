"""Pure parts of `harness load prefetch|upload`: the curve's ticks, summaries, checks, CSV, chart and page; the
upload comparison. No services."""
from __future__ import annotations

import csv
import io
from types import SimpleNamespace
from xml.etree import ElementTree as ET

import pytest

from load import curve, curve_chart
from load.prefetch_curve import LoadError, prefetch_env
from load.upload_load import compare, locust_rows, percentile


def drain(prefetch: int, backlog: int = 100, rss=(100_000, 101_000, 102_000, 103_000), unacked=None) -> list:
    """Ticks every second of a backlog draining at 25 jobs/s by two consumers."""
    ticks = []
    for i, kib in enumerate(rss + (rss[-1],)):
        left = max(0, backlog - 25 * i)
        held = min(prefetch, left) if unacked is None else unacked
        ticks.append(curve.Tick(prefetch, float(i), max(0, left - 2 * held), min(left, 2 * held), backlog - left, kib,
                                {"ch1": (prefetch, held), "ch2": (prefetch, held)}))
    return ticks


def test_rates_are_jobs_finished_over_the_window():
    ticks = curve.rates(drain(4))
    assert [k.finished for k in ticks] == [0, 25, 50, 75, 100]
    assert ticks[0].jobs_per_s is None and ticks[2].jobs_per_s == 25.0


def test_summary_of_a_clean_drain():
    s = curve.summarize(4, drain(4), 100, True, 4.0, upload_seconds=2.0)
    assert s["jobs_per_s"] == 25.0 and s["max_unacked"] == 4 and s["consumer_prefetch"] == 4
    assert s["rss_first_kib"] == 101_000 and s["rss_last_kib"] == 103_000  # first: once a job finished (warm)
    assert s["rss_ratio"] == pytest.approx(1.02, abs=0.001) and s["uploads_per_s"] == 50.0


def test_checks_pass_on_a_clean_drain():
    ticks = {4: drain(4)}
    rows = curve.checks([curve.summarize(4, ticks[4], 100, True, 4.0)], ticks)
    assert {r["check"]: r["status"] for r in rows} == {"unacked_within_prefetch": "pass", "rss_flat": "pass",
                                                       "throughput": "pass"}
    assert curve.verdict(rows) == "pass"


def test_unacked_over_prefetch_fails():
    ticks = {4: drain(4, unacked=5)}
    rows = curve.checks([curve.summarize(4, ticks[4], 100, True, 4.0)], ticks)
    bad = next(r for r in rows if r["check"] == "unacked_within_prefetch")
    assert bad["status"] == "fail" and "unacked 5" in bad["detail"] and curve.verdict(rows) == "fail"


def test_a_consumer_running_with_a_larger_prefetch_than_asked_fails():
    ticks = {4: [curve.Tick(4, 0.0, 10, 8, 0, 1, {"ch1": (8, 3)})]}
    rows = curve.checks([curve.summarize(4, ticks[4], 10, False, None)], ticks)
    assert next(r for r in rows if r["check"] == "unacked_within_prefetch")["status"] == "fail"


def test_growing_memory_fails_rss_flat():
    ticks = {4: drain(4, rss=(100_000, 110_000, 125_000, 140_000))}
    rows = curve.checks([curve.summarize(4, ticks[4], 100, True, 4.0)], ticks)
    assert next(r for r in rows if r["check"] == "rss_flat")["status"] == "fail"


def test_no_samples_and_an_unmeasured_point_are_unknown_and_no_drain_fails():
    rows = curve.checks([curve.summarize(4, [], 100, False, None)], {4: []})
    status = {r["check"]: r["status"] for r in rows}
    assert status == {"unacked_within_prefetch": "unknown", "rss_flat": "unknown", "throughput": "fail"}
    errored = {**curve.summarize(1, [], 100, False, None), "error": "setup command exited 1"}
    rows = curve.checks([errored], {})
    assert {r["status"] for r in rows} == {"unknown"} and "setup command" in rows[0]["detail"]
    assert curve.verdict(rows) == "unknown"


def test_csv_has_one_row_per_tick_and_every_field():
    rows = curve.tick_rows(drain(16))
    text = curve.to_csv(rows, curve.TICK_FIELDS)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert len(parsed) == 5 and tuple(parsed[0]) == curve.TICK_FIELDS
    assert parsed[1]["per_consumer"] == "ch1=16/16;ch2=16/16" and parsed[0]["jobs_per_s"] == ""
    summary = curve.to_csv([curve.summarize(16, drain(16), 100, True, 4.0)], curve.SUMMARY_FIELDS)
    assert summary.splitlines()[0].split(",") == list(curve.SUMMARY_FIELDS)


def test_chart_is_well_formed_svg_and_a_png():
    prims = curve_chart.primitives({1: drain(1), 16: drain(16)}, "reference & co: <curve>")
    root = ET.fromstring(curve_chart.to_svg(prims))
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "prefetch 1" in labels and "prefetch 16" in labels and "reference & co: <curve>" in labels
    assert curve_chart.to_png(prims).startswith(b"\x89PNG\r\n\x1a\n")
    assert ET.fromstring(curve_chart.to_svg(curve_chart.primitives({}, "empty")))  # nothing sampled: still drawn


def test_page_names_seed_images_and_checks():
    ticks = {4: drain(4)}
    summaries = [curve.summarize(4, ticks[4], 100, True, 4.0)]
    meta = {"sut": "x", "seed": 7, "backlog": 100, "images": "48 images of 32-96 px", "prefetch_env": "PREFETCH",
            "consumers": ["worker"], "machine": "2 cores"}
    text = curve.page_markdown(meta, summaries, curve.checks(summaries, ticks))
    assert "seed 7" in text and "32-96 px" in text and "unacked_within_prefetch" in text and "PASS" in text
    page = curve.page_html(text, "<svg xmlns='http://www.w3.org/2000/svg'></svg>")
    assert "<svg" in page and "&lt;svg" not in page


def test_an_adapter_without_prefetch_env_is_refused():
    assert prefetch_env(SimpleNamespace(name="a", raw={"limits": {"prefetch_env": "PREFETCH"}})) == "PREFETCH"
    with pytest.raises(LoadError, match="prefetch_env"):
        prefetch_env(SimpleNamespace(name="a", raw={"limits": {"prefetch": 2}}))


def test_percentile_by_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([5.0], 0.99) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0


def test_upload_comparison_reads_locust_stats(tmp_path):
    stats = tmp_path / "locust_stats.csv"
    stats.write_text('Type,Name,Request Count,Failure Count,50%,99%\n'
                     'POST,POST /v1/attachments,120,0,40,200\n'
                     'POST,POST /v1/attachments [bad],20,0,10,30\n'
                     ',Aggregated,140,0,35,190\n')
    result = compare(locust_rows(stats), {"p50_ms": 20.0, "p99_ms": 100.0})
    assert result["p50_ratio"] == 2.0 and result["p99_ratio"] == 2.0 and result["requests"] == 120
    assert set(result["per_kind"]) == {"POST /v1/attachments", "POST /v1/attachments [bad]"}
    assert compare({}, {"p50_ms": 20.0})["p50_ratio"] is None
