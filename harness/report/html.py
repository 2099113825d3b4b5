"""index.html of a grade folder: the page a person opens first.

It shows the requirement checklist (status and why), the scenarios with links to their timeline pages, where the
time went (phases per scenario, a stacked bar each) and, per scenario, its attachments' states over time with the
faults across them and the work queue / consumers over time. One self-contained file: inline CSS (the shared
stylesheet of reports/templates/), inline SVG from ``plots``, no scripts, no external assets. Everything is read
from the grade folder (each scenario's run.json and history.jsonl), so ``harness check`` rewrites it too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..paths import data_dir
from . import plots
from ..checklist import shown_status
from .summary import REQUIREMENT_TITLES

esc = plots.esc
STYLESHEETS = ("timeline.css", "report.css")
OPEN_ALL_UP_TO = 4  # a grade of at most this many scenarios shows every scenario expanded


def stylesheet() -> str:
    """The shared report stylesheet (reports/templates/ in a checkout, package data in a wheel)."""
    folder = data_dir("templates")
    return "\n".join((folder / name).read_text() for name in STYLESHEETS if (folder / name).is_file())


def anchor(name: str) -> str:
    return "s-" + re.sub(r"[^a-zA-Z0-9_-]+", "-", name)


def pill(status: str, text: str | None = None) -> str:
    cls = re.sub(r"[^a-z0-9-]+", "-", str(status).lower())
    return f'<span class="pill {esc(cls)}">{esc(text if text is not None else status)}</span>'


def _load_events(path: Path) -> list[dict]:
    events = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, raw in enumerate(f, start=1):
                if raw.strip():
                    try:
                        event = json.loads(raw)
                    except json.JSONDecodeError:
                        continue  # a line cut short by a killed harness: the rest still draws
                    if isinstance(event, dict) and "wall" in event and "type" in event:
                        event.setdefault("line", number)
                        events.append(event)
    except OSError:
        pass
    return events


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _requirements_table(results: dict) -> str:
    rows = []
    for rid, req in sorted((results.get("requirements") or {}).items()):
        scenarios = ", ".join(f'<a href="#{anchor(s)}">{esc(s)}</a>' for s in req.get("scenarios") or [])
        rows.append(f'<tr><td><b>{esc(rid)}</b></td><td>{pill(req["status"])}</td>'
                    f'<td>{esc(REQUIREMENT_TITLES.get(rid, ""))}<div class="meta">{scenarios}</div></td>'
                    f'<td class="why">{esc(req["why"])}</td></tr>')
    return ('<table class="checklist"><tr><th>requirement</th><th>status</th><th>what (scenarios)</th>'
            f'<th>why</th></tr>{"".join(rows)}</table>')


def _items_table(results: dict) -> str:
    """The seeds' verification items, one row each (empty for results written before the checklist existed)."""
    rows = []
    for item_id, row in (results.get("checklist") or {}).items():
        scenarios = ", ".join(f'<a href="#{anchor(s)}">{esc(s)}</a>' for s in row.get("scenarios") or [])
        rows.append(f'<tr><td><b>{esc(item_id)}</b></td><td>{pill(row["status"])}</td>'
                    f'<td>{esc(row["meaning"])}<div class="meta">{esc(row.get("seed", ""))} · from level '
                    f'{esc(row["level"])}</div><div class="meta">{scenarios}</div></td>'
                    f'<td class="why">{esc(row["why"])}</td></tr>')
    if not rows:
        return ""
    return ('<h2>Checklist: the seeds\' verification items</h2><table class="checklist"><tr><th>row</th><th>status</th>'
            f'<th>what (scenarios)</th><th>why</th></tr>{"".join(rows)}</table>')


def _scenario_table(results: dict) -> str:
    rows = []
    for s in results.get("scenarios") or []:
        windows = ", ".join(s.get("windows") or []) or "—"
        rows.append(f'<tr><td><a href="#{anchor(s["name"])}">{esc(s["name"])}</a></td><td>{pill(s["verdict"])}</td>'
                    f'<td class="num">{esc(s.get("level"))}</td><td>{esc(", ".join(s.get("requirements") or []))}</td>'
                    f'<td>{esc(windows)} <span class="meta">({esc(s.get("exactness") or "n/a")})</span></td>'
                    f'<td class="num">{esc(s.get("seed"))}</td><td class="num">{float(s.get("seconds") or 0):.1f}s</td>'
                    f'<td><a href="{esc(s["run_dir"])}/timeline.html">timeline</a></td></tr>')
    for s in results.get("skipped") or []:
        rows.append(f'<tr><td>{esc(s["name"])}</td><td>{pill("skipped")}</td><td class="num">{esc(s.get("level", ""))}'
                    f'</td><td>{esc(", ".join(s.get("requirements") or []))}</td><td colspan="4" class="why">'
                    f'{esc(s.get("reason", ""))}</td></tr>')
    return ('<table><tr><th>scenario</th><th>verdict</th><th>level</th><th>requirements</th><th>windows</th>'
            f'<th>seed</th><th>time</th><th></th></tr>{"".join(rows)}</table>')


def _scenario_section(grade_dir: Path, s: dict, open_: bool) -> str:
    run_dir = grade_dir / s["run_dir"]
    run = _json(run_dir / "run.json")
    events = _load_events(run_dir / "history.jsonl")
    rows = plots.attachment_rows(events) if events else []
    last = [r["spans"][-1]["state"] if r["spans"] else "?" for r in rows]
    counts = ", ".join(f"{last.count(state)} {state}" for state in ("ready", "failed", "processing", "queued")
                       if last.count(state)) or "none"
    note = (f'{len(rows)} attachment{"s" if len(rows) != 1 else ""} ({counts}) · {float(s.get("seconds") or 0):.1f}s '
            f'· seed {esc(s.get("seed"))}')
    failing = [v for v in s.get("verdicts") or [] if v.get("status") != "valid"]
    items = "".join(f'<li>{pill(shown_status(v))} <b>{esc(v["invariant"])}</b>: {esc(v.get("summary", ""))}</li>'
                    for v in failing)
    if s.get("error"):
        items = f'<li>{pill("error")} run error: <code>{esc(s["error"])}</code></li>' + items
    description = (run.get("scenario") or {}).get("description") or ""
    links = " ".join(f'<a href="{esc(s["run_dir"])}/{href}">{label}</a>' for href, label in (
        ("timeline.html", "timeline (every transition, message and fault)"), ("summary.md", "summary.md"),
        ("history.jsonl", "history.jsonl"), ("logs/", "logs/")))
    charts = ""
    if events:
        charts = (f'<div class="chart-box">{plots.states_chart(events, title=s["name"] + ": attachment states")}</div>'
                  f'<div class="chart-box">{plots.queue_chart(events, title=s["name"] + ": queue and consumers")}</div>')
    else:
        charts = '<p class="meta">no history.jsonl in this scenario folder: nothing to draw</p>'
    return (f'<section class="scenario" id="{anchor(s["name"])}"><details{" open" if open_ else ""}><summary>'
            f'<h3>{esc(s["name"])}</h3> {pill(s["verdict"])}<span class="summary-note">{note}</span></summary>'
            f'<div class="body"><p class="meta">{esc(description)}</p>'
            f'<p class="meta">windows {esc(", ".join(s.get("windows") or []) or "—")} ({esc(s.get("exactness") or "n/a")})'
            f' · requirements {esc(", ".join(s.get("requirements") or []))} · reproduce: <code>{esc(s.get("reproduce") or "")}'
            f'</code></p>{f"<ul class=failing>{items}</ul>" if items else ""}<p class="links">{links}</p>{charts}'
            f'</div></details></section>')


def _time_went(results: dict) -> str:
    """Per phase and part, summed over the scenarios (results.json["time_went"], harness/timing.py)."""
    from ..timing import html_table

    table = html_table(results.get("time_went") or {})
    return f'<h3>Per phase and part, over every scenario</h3>\n{table}' if table else ""


def grade_page(grade_dir: Path, results: dict) -> str:
    """The grade's index.html, from its results (as in results.json) and its scenario folders."""
    grade_dir = Path(grade_dir)
    scenarios = results.get("scenarios") or []
    verdicts = [s["verdict"] for s in scenarios]
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in ("tampered", "valid", "invalid", "unknown") if verdicts.count(v))
    timings = results.get("timings") or {}
    phases = [(s["name"], _json(grade_dir / s["run_dir"] / "run.json").get("timings") or {}) for s in scenarios]
    bars = plots.phase_bars(phases, links={s["name"]: "#" + anchor(s["name"]) for s in scenarios}) if scenarios else ""
    overall = " · ".join(f"{label} {timings[key]:.1f}s" for key, label in (
        ("stack_start", "stack start"), ("stack_stop", "stack stop"), ("total", "total"))
        if isinstance(timings.get(key), (int, float)))
    open_all = len(scenarios) <= OPEN_ALL_UP_TO
    sections = "".join(_scenario_section(grade_dir, s, open_all or s["verdict"] != "valid") for s in scenarios)
    sut = results.get("sut") or {}
    verdict = results.get("verdict", "unknown")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>grade {esc(sut.get('name'))} level {esc(results.get('level'))}: {esc(verdict)}</title>
<style>
{stylesheet()}
</style></head><body class="report">
<h1>Grade of {esc(sut.get('name'))} at level {esc(results.get('level'))} <span class="badge {esc(verdict)}">{esc(verdict)}</span></h1>
<p class="meta">adapter <code>{esc(sut.get('path'))}</code> (claims level {esc(sut.get('level'))}) · base seed <b>{esc(results.get('seed'))}</b>
· {len(scenarios)} scenario{'s' if len(scenarios) != 1 else ''} run ({esc(counts or 'none')}), {len(results.get('skipped') or [])} skipped
{('· ' + esc(overall)) if overall else ''}</p>
<p class="links"><a href="summary.md">summary.md</a> <a href="results.json">results.json</a> <a href="junit.xml">junit.xml</a>
<a href="timeline.html">timeline index</a></p>
<h2>Requirements</h2>
{_requirements_table(results)}
{_items_table(results)}
<h2>Scenarios</h2>
{_scenario_table(results)}
<h2>Where the time went</h2>
<p class="meta">each scenario's phases (run.json timings), in run order; hover a segment for its seconds{(' · ' + esc(overall)) if overall else ''}</p>
<div class="chart-box">{bars or '<p class="meta">no scenario ran</p>'}</div>
{_time_went(results)}
<h2>Scenario by scenario</h2>
<p class="meta">each row is one attachment (in upload order): its states over time, the 202 as a dot; red lines and bands are
faults, grey bands roles held; below, the work queue and each sampled consumer over the same time axis. Valid
scenarios are folded when the grade has more than {OPEN_ALL_UP_TO}; click a title to open it.</p>
{sections}
</body></html>
"""
