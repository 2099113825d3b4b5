"""Where a run's and a grade's time went.

A run keeps two layers of timings in run.json:

- ``timings``: its top-level phases (setup, start_roles, faults_and_workload, heal, drain, final_read, stop, check),
  as before;
- ``timings_detail``: the parts of those phases (``split(run, "tenant")`` inside setup, ...), named in
  ``PARTS`` below. A part not listed there still shows, under "other".

A grade sums both over its scenarios (``summarise``): per phase and part, the seconds in all, the mean and the
slowest scenario, and the share of the scenario-seconds. With scenarios side by side the scenario-seconds add up to
more than the wall time; the table says so. ``table_lines`` prints it (the CLI, summary.md), ``html_table`` shows
it in index.html; the summary itself is kept in results.json["time_went"].
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from html import escape

# top-level phase -> its parts, in run order (a part is timed inside its phase)
PARTS: dict[str, tuple[str, ...]] = {
    "setup": ("tenant", "setup_command", "tap_prepare"),
    "start_roles": ("role_spawn", "role_healthy", "topology", "observers"),
    "faults_and_workload": ("faults_after_workload",),
    "heal": (),
    "drain": ("drain_wait", "queue_wait", "settle"),
    "final_read": ("retention_wait", "consumers_stop_count"),
    "stop": ("role_stop", "teardown"),
    "check": (),
}

LABELS = {
    "setup": "tenant setup", "tenant": "database, vhost, bucket, proxies", "setup_command": "adapter setup command",
    "tap_prepare": "tap and tracing", "start_roles": "role start", "role_spawn": "processes spawned",
    "role_healthy": "until healthy", "topology": "work queue declared", "observers": "observers started",
    "faults_and_workload": "workload and faults", "faults_after_workload":
    "faults after the uploads", "heal": "heal (verified)", "drain": "drain and settle", "drain_wait":
    "until every accepted upload is terminal", "queue_wait": "until the work queue is empty", "settle":
    "scenario settle (lets a fault be observed)", "final_read": "final read", "retention_wait":
    "staging retention waited out", "consumers_stop_count":
    "consumers stopped, queue counted", "stop": "role stop and teardown", "role_stop": "roles stopped",
    "teardown": "pollers, tenant proxies", "check": "checkers",
}
# What a phase does besides its timed parts (the "other" row under it).
REST = {"setup": "the run's environment, skew", "start_roles": "roles defined, faults prepared",
        "faults_and_workload": "uploads (faults under way meanwhile)", "drain": "the drain's last look",
        "final_read": "state read (API, database, objects, queue)", "stop": "samplers"}


@contextmanager
def split(run, name: str):
    """Time one part of a phase into ``run.timings_detail[name]`` (added up when entered again)."""
    detail = run.__dict__.setdefault("timings_detail", {})
    began = time.monotonic()
    try:
        yield
    finally:
        detail[name] = round(detail.get(name, 0.0) + time.monotonic() - began, 3)


def add(run, name: str, seconds: float) -> None:
    """Add ``seconds`` to one part of a phase (for a part that is a loop already under way)."""
    detail = run.__dict__.setdefault("timings_detail", {})
    detail[name] = round(detail.get(name, 0.0) + max(0.0, seconds), 3)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summarise(runs: list[tuple[str, dict, dict]], wall: float | None = None, parallel: int = 1,
              extra: dict | None = None) -> dict:
    """``runs``: (scenario, run.json timings, run.json timings_detail). Returns rows per phase and part: seconds in
    all, mean, the slowest scenario and its seconds, share of the scenario-seconds."""
    rows: list[dict] = []
    grand = sum(v for _, timings, _ in runs for v in (timings or {}).values() if _number(v) is not None)

    def row(level: int, key: str, values: list[tuple[str, float]]) -> dict:
        total = sum(v for _, v in values)
        slowest = max(values, key=lambda p: p[1]) if values else (None, 0.0)
        return {"level": level, "key": key, "label": LABELS.get(key, key), "seconds": round(total, 2),
                "mean": round(total / len(values), 2) if values else 0.0, "slowest": slowest[0],
                "slowest_seconds": round(slowest[1], 2), "share": round(total / grand, 3) if grand else 0.0,
                "runs": len(values)}

    phases = list(PARTS) + sorted({k for _, t, _ in runs for k in (t or {}) if k not in PARTS})
    for phase in phases:
        values = [(name, _number(t.get(phase))) for name, t, _ in runs if _number((t or {}).get(phase)) is not None]
        if not values:
            continue
        rows.append(row(0, phase, values))
        parts = PARTS.get(phase, ())
        for part in parts:
            got = [(name, _number(d.get(part))) for name, _, d in runs if _number((d or {}).get(part)) is not None]
            if got:
                rows.append(row(1, part, got))
        if parts:  # what the parts do not cover: the phase's own bookkeeping
            rest = []
            for name, t, d in runs:
                if _number((t or {}).get(phase)) is None or not any(_number((d or {}).get(p)) is not None for p in parts):
                    continue
                rest.append((name, max(0.0, float(t[phase]) - sum(_number((d or {}).get(p)) or 0.0 for p in parts))))
            if rest and sum(v for _, v in rest) >= 0.05:
                rows.append({**row(1, "other", rest), "label": REST.get(phase, "the rest of the phase")})
    return {"scenarios": len(runs), "scenario_seconds": round(grand, 2), "wall": None if wall is None else round(wall, 2),
            "parallel": parallel, "rows": rows, **(extra or {})}


def table_lines(summary: dict) -> list[str]:
    """The summary as fixed-width text lines (the CLI and summary.md)."""
    if not summary or not summary.get("rows"):
        return []
    out = [f"{'phase':44} {'all runs':>9} {'mean':>7} {'share':>6}  slowest"]
    for r in summary["rows"]:
        name = ("  " * r["level"]) + f"{r['key']} ({r['label']})" if r["label"] != r["key"] else ("  " * r["level"]) + r["key"]
        out.append(f"{name[:44]:44} {r['seconds']:8.1f}s {r['mean']:6.2f}s {100 * r['share']:5.1f}%  "
                   f"{r['slowest'] or '—'} {r['slowest_seconds']:.1f}s")
    tail = f"{summary['scenarios']} scenarios, {summary['scenario_seconds']:.1f} scenario-seconds"
    if summary.get("wall") is not None:
        tail += f" in {summary['wall']:.1f}s of wall time, up to {summary.get('parallel', 1)} side by side"
    beside = summary.get("beside")
    if beside and beside.get("scenarios"):
        tail += (f"; on a second stack beside them (it restarts a service): {', '.join(beside['scenarios'])}"
                 + (f" (its start {beside['stack_start']:.1f}s)" if beside.get("stack_start") is not None else ""))
    ahead = summary.get("tenants_ahead")
    if ahead:
        tail += (f"; tenants prepared ahead: {ahead.get('used', 0)} used, {ahead.get('missed', 0)} made on the spot, "
                 f"{ahead.get('seconds', 0):.1f}s of preparation off the scenarios' paths"
                 + (f" ({ahead['setup_seconds']:.1f}s of it the setup command)" if "setup_seconds" in ahead else ""))
    templates = summary.get("templates") or []  # [setup] template = true (harness/stack/stack.py DatabaseTemplate)
    made = [t for t in templates if t.get("ok")]
    if made:  # one per stack and environment the setup command sees (a scenario's [timings] may change it)
        clones = sum(t.get("clones", 0) for t in made)
        cloned = sum(t.get("clone_seconds", 0) for t in made)
        tail += (f"; database templates: the setup command ran {len(made)} time{'s' if len(made) != 1 else ''} ("
                 f"{sum(t.get('setup_seconds', 0) for t in made):.1f}s, "
                 f"{sum(t.get('make_seconds', 0) for t in made):.1f}s with their tenants), {clones} tenants cloned "
                 f"from them in {cloned:.1f}s" + (f" ({cloned / clones:.2f}s each)" if clones else ""))
    for tpl in templates:
        if not tpl.get("ok"):
            tail += (f"; database template {tpl.get('database')} not used ({tpl.get('error', 'not made')}): "
                     "the setup command ran in each of its tenants")
    out.append(tail)
    return out


def html_table(summary: dict) -> str:
    if not summary or not summary.get("rows"):
        return ""
    body = "".join(
        f"<tr><td style=\"padding-left:{0.3 + 1.2 * r['level']}em\">{'<b>' if r['level'] == 0 else ''}{escape(r['key'])}"
        f"{'</b>' if r['level'] == 0 else ''} <span class=\"meta\">{escape(r['label']) if r['label'] != r['key'] else ''}"
        f"</span></td><td>{r['seconds']:.1f}s</td><td>{r['mean']:.2f}s</td><td>{100 * r['share']:.1f}%</td>"
        f"<td>{escape(str(r['slowest'] or '—'))} {r['slowest_seconds']:.1f}s</td></tr>"
        for r in summary["rows"])
    return ("<table><thead><tr><th>phase / part</th><th>all runs</th><th>mean</th><th>share</th><th>slowest</th>"
            f"</tr></thead><tbody>{body}</tbody></table><p class=\"meta\">{escape(table_lines(summary)[-1])}</p>")
