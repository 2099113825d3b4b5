"""The SVG plots and the grade's index.html: well-formed, self-contained, and 50 attachments fit readably."""

from __future__ import annotations

import json
import re
from xml.etree import ElementTree as ET

import pytest
from synthetic_grade import backlog_history, build, lost_work_history

from harness.report import plots
from harness.report.html import grade_page

SVG = "{http://www.w3.org/2000/svg}"


def events(history) -> list[dict]:
    return [json.loads(line) for line in history.text().splitlines()]


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # raises on anything that is not well-formed XML
    assert root.tag == SVG + "svg"
    return root


def size(root) -> tuple[float, float]:
    return float(root.get("width")), float(root.get("height"))


def texts(root) -> list[ET.Element]:
    return [t for t in root.iter(SVG + "text")]


def own_text(element) -> str:
    """A <text>'s visible words (its <title> child is the tooltip, not drawn)."""
    return (element.text or "") + "".join((c.tail or "") for c in element)


def test_states_chart_fits_50_attachments_one_readable_row_each():
    hist = events(backlog_history(50))
    root = parse(plots.states_chart(hist))
    width, height = size(root)
    rows = plots.attachment_rows(hist)
    assert len(rows) == 50 and width == 1100
    assert height <= 800, "50 attachments must fit on one screen"
    labels = [t for t in texts(root) if t.get("text-anchor") == "end"]
    assert len(labels) == 50
    ys = sorted(float(t.get("y")) for t in labels)
    # Labels never overlap: each row is at least as tall as its font.
    assert min(b - a for a, b in zip(ys, ys[1:])) >= float(labels[0].get("font-size"))
    # Each label fits left of the plot area (no label runs into the bars).
    left = min(float(r.get("x")) for r in root.iter(SVG + "rect") if r.find(SVG + "title") is not None
               and "–" in r.find(SVG + "title").text and r.get("height") == "9")
    for t in labels:
        assert float(t.get("x")) <= left and len(own_text(t)) * 9.5 * plots.CHAR <= float(t.get("x"))
    # Every bar lies inside the drawing.
    for r in root.iter(SVG + "rect"):
        assert float(r.get("x")) >= 0 and float(r.get("x")) + float(r.get("width")) <= width + 0.5
    # The states, the 202s, the SIGKILL and the hold are all drawn, each with its history line on hover.
    fills = {r.get("fill") for r in root.iter(SVG + "rect")}
    assert {plots.STATE_COLOURS[s] for s in ("queued", "processing", "ready", "failed")} <= fills
    assert len(list(root.iter(SVG + "circle"))) == 50
    words = [own_text(t) for t in texts(root)]
    assert "SIGKILL worker" in words and "held worker" in words
    # The retried attachment shows processing twice (queued again in between).
    retried = next(r for r in rows if r["sample"] == "u0010")
    assert [s["state"] for s in retried["spans"]] == ["queued", "processing", "queued", "processing", "ready"]


def test_fault_labels_never_overlap_even_when_crowded():
    hist = events(backlog_history(5))
    wall = hist[0]["wall"]
    for i in range(12):  # a burst of faults 0.1 s apart
        hist.append({"type": "fault", "action": "sigkill", "phase": "start", "role": f"worker#{i}",
                     "t": 3 + i * 0.1, "wall": wall + 3 + i * 0.1, "line": 900 + i})
    root = parse(plots.states_chart(hist))
    boxes = []
    for t in texts(root):
        if own_text(t).startswith("SIGKILL"):
            x, y = float(t.get("x")), float(t.get("y"))
            boxes.append((x, x + len(own_text(t)) * 10 * plots.CHAR, y))
    assert boxes
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] != b[2] or a[1] <= b[0] or b[1] <= a[0], (a, b)
    # A mark whose label had no room keeps its line and its tooltip.
    lines = [ln for ln in root.iter(SVG + "line") if ln.find(SVG + "title") is not None]
    assert sum("SIGKILL" in ln.find(SVG + "title").text for ln in lines) == 13


def test_queue_chart_draws_depth_and_unacked_against_prefetch():
    hist = events(backlog_history(50))
    root = parse(plots.queue_chart(hist))
    series = plots.queue_series(hist)
    assert series["prefetch"] == 2 and max(v for _, v in series["work_ready"]) == 50
    paths = [p.find(SVG + "title").text for p in root.iter(SVG + "path")]
    assert any(p.startswith("work queue ready") for p in paths)
    assert any(p.startswith("work queue unacked") for p in paths)
    assert any(p.startswith("dead-letter ready") for p in paths)
    assert any(p.startswith("consumer worker-ctag-1 unacked") for p in paths)
    dashed = [ln for ln in root.iter(SVG + "line") if ln.get("stroke-dasharray") == "5 4"]
    assert len(dashed) == 1 and "prefetch 2" in dashed[0].find(SVG + "title").text
    # Without samples the chart is a one-line note, not an empty box.
    quiet = [e for e in hist if e["type"] not in ("queue", "consumer")]
    root = parse(plots.queue_chart(quiet))
    assert size(root)[1] < 40 and "no queue or consumer samples" in "".join(root.itertext())


def test_phase_bars_stack_each_scenarios_phases_in_run_order():
    rows = [("a-very-long-scenario-name-" * 4, {"setup": 1.0, "start_roles": 0.5, "drain": 10.0, "check": 0.2}),
            ("short", {"setup": 0.5, "faults_and_workload": 3.0, "custom_phase": 1.5})]
    root = parse(plots.phase_bars(rows, links={"short": "#s-short"}))
    width, _ = size(root)
    segments = [r for r in root.iter(SVG + "rect") if r.find(SVG + "title") is not None]
    titles = [r.find(SVG + "title").text for r in segments]
    assert titles[:4] == [f"{rows[0][0]}: setup 1.00s", f"{rows[0][0]}: start_roles 0.50s",
                          f"{rows[0][0]}: drain 10.00s", f"{rows[0][0]}: check 0.20s"]
    assert "short: custom_phase 1.50s" in titles  # a phase the harness adds later still shows
    first = segments[:4]  # stacked: each segment starts where the previous one ends
    for a, b in zip(first, first[1:]):
        assert abs(float(a.get("x")) + float(a.get("width")) - float(b.get("x"))) < 0.2
    assert max(float(r.get("x")) + float(r.get("width")) for r in segments) <= width
    long_label = next(t for t in texts(root) if t.find(SVG + "title") is not None and t.find(SVG + "title").text == rows[0][0])
    assert own_text(long_label).endswith("…") and len(own_text(long_label)) * 11 * plots.CHAR <= float(long_label.get("x"))
    assert any(a.get("href") == "#s-short" for a in root.iter(SVG + "a"))


@pytest.mark.parametrize("value", ['<script>alert("x")</script>', "a & b", "quote ' and \""])
def test_text_from_the_history_is_escaped(value):
    hist = events(backlog_history(3))
    hist.append({"type": "fault", "action": "sigkill", "phase": "start", "role": value, "t": 3.0,
                 "wall": hist[0]["wall"] + 3.0, "line": 99})
    svg = plots.states_chart(hist, title=value)
    parse(svg)
    assert "<script" not in svg


def test_grade_index_page_is_self_contained_with_checklist_timelines_and_plots(tmp_path):
    grade_dir = build(tmp_path)
    page = (grade_dir / "index.html").read_text()
    assert "<script" not in page and "<link" not in page and "src=" not in page
    # phases; states + queue of the backlog; states + a one-line "no queue samples" note of the window scenario
    assert page.count("<svg") == 1 + 2 + 2
    for svg in re.findall(r"<svg.*?</svg>", page, flags=re.S):
        parse(svg)
    # The checklist: every requirement with its status and why.
    for rid, status in (("BE-JOB-001", "fail"), ("BE-JOB-004", "pass"), ("BE-JOB-005", "unknown"),
                        ("BE-JOB-007", "not-required")):  # never a green "valid" (issue 20, item 8)
        assert re.search(rf"<b>{rid}</b></td><td><span class=\"pill {status}\">", page), rid
    assert "required at this level but not exercised: expiry-after-backlog: adapter cannot set job_ttl_seconds" in page
    # Each scenario links its own timeline page and opens (small grade) with its failing check named.
    assert 'href="prefetch-under-backlog/timeline.html"' in page
    assert 'href="window-commit-publish-failpoint/timeline.html"' in page
    assert "<b>lost_accepted_work</b>: 1 accepted upload never reached a terminal state" in page
    assert 'id="s-prefetch-under-backlog"><details open>' in page
    assert "50 attachments (47 ready, 3 failed)" in page
    # `harness check` rewrites it from the stored files: the same page.
    results = json.loads((grade_dir / "results.json").read_text())
    assert grade_page(grade_dir, results) == page


def test_grade_index_folds_valid_scenarios_of_a_big_grade_and_survives_missing_files(tmp_path):
    grade_dir = build(tmp_path)
    results = json.loads((grade_dir / "results.json").read_text())
    first = results["scenarios"][0]
    results["scenarios"] = [first] * 3 + results["scenarios"] + [
        {**first, "name": "gone", "run_dir": "gone"}]  # a scenario folder that was deleted
    page = grade_page(grade_dir, results)
    assert 'id="s-prefetch-under-backlog"><details>' in page  # valid: folded
    assert 'id="s-window-commit-publish-failpoint"><details open>' in page  # invalid: open
    assert "no history.jsonl in this scenario folder" in page


def test_lost_work_history_has_a_crash_a_cut_and_a_stuck_attachment():
    hist, lost = lost_work_history()
    evs = events(hist)
    marks = plots.fault_marks(evs)
    assert [m["label"] for m in marks] == ["armed api", "crash api", "cut s3"]
    assert [m["kind"] for m in marks] == ["line", "line", "band"]
    stuck = next(r for r in plots.attachment_rows(evs) if r["id"] == lost)
    assert [s["state"] for s in stuck["spans"]] == ["queued"]
    assert stuck["spans"][-1]["end"] == pytest.approx(plots.time_base(evs)[1])
