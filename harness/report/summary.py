"""summary.md: the grader's checklist by level and requirement id, plus where the time went."""

from __future__ import annotations

from ..checkers import counts
from ..checklist import ROW_STATUSES, shown_status

REQUIREMENT_TITLES = {
    "BE-JOB-001": "ack after result",
    "BE-JOB-002": "idempotent redelivery (sequential, concurrent, restart between effect and ack)",
    "BE-JOB-003": "bounded retries, terminal result, DLQ + controlled replay",
    "BE-JOB-004": "order/concurrency contract, finite prefetch",
    "BE-JOB-005": "expiry before effect, own metric, clock skew",
    "BE-JOB-006": "lease ownership, renewal, fencing, pause longer than lease",
    "BE-JOB-007": "per-item batch results",
}
MARK = {"valid": "✅ valid", "invalid": "❌ invalid", "unknown": "❔ unknown", "pass": "✅ pass", "fail": "❌ fail",
        "skipped": "⏭ skipped", "not required": "⏭ not required", "not proven": "❓ not proven",
        "not exercised": "⚪ not exercised", "missing": "⛔ missing",
        "tampered": "🚫 TAMPERED"}  # the harness's faults changed by someone else (checkers/tamper_evidence.py)


def _evidence_lines(v: dict, limit: int = 5) -> list[str]:
    out = []
    for e in v.get("evidence", [])[:limit]:
        ids = " ".join(f"{k}={e[k]}" for k in ("attachment_id", "job_id", "key") if e.get(k))
        when = f"t={e['t']:.2f}s, " if isinstance(e.get("t"), (int, float)) else ""
        lines = f" ({when}history lines {e['lines']})" if e.get("lines") else ""
        out.append(f"  - {e['message']} {ids}{lines}")
    return out


def scenario_md(r: dict) -> str:
    s = r["scenario"]
    lines = [f"# {s['name']} — {MARK[r['verdict']]}", "",
             f"{s.get('description') or ''}", "",
             f"- implementation: **{r['sut']['name']}** (claims level {r['sut']['level']}), graded at level {r['level']}",
             f"- seed: **{r['seed']}** — reproduce: `{r.get('reproduce')}`",
             f"- windows: {', '.join(s.get('windows') or []) or '—'} ({s.get('exactness') or 'n/a'})",
             f"- requirements: {', '.join(s.get('requirements') or [])}"]
    if r.get("error"):
        lines.append(f"- run error: `{r['error']}`")
    hits = r.get("window_hits") or []
    if hits:
        lines.append("- window hits: " + "; ".join(f"{h['role']} {','.join(h['windows'])} ({h['exactness']})" for h in hits))
    lines += ["", "| invariant | verdict | exercised | summary |", "|---|---|---|---|"]
    declared = s.get("checks")
    for v in r["verdicts"]:
        status = MARK[shown_status(v)] + ("" if counts(v, declared) else " (not counted: the scenario does not rely on it)")
        lines.append(f"| {v['invariant']} | {status} | {'yes' if v.get('exercised') else 'no'} | {v['summary']} |")
    bad = [v for v in r["verdicts"] if v["status"] != "valid"]
    if bad:
        lines += ["", "## Evidence"]
        for v in bad:
            lines += ["", f"**{v['invariant']}** ({', '.join(v['requirements'])}): {v['summary']}"] + _evidence_lines(v)
    lines += ["", "## Where the time went", ""] + [f"- {k}: {v:.1f}s" for k, v in (r.get("timings") or {}).items()
                                                    if isinstance(v, (int, float))]
    return "\n".join(lines) + "\n"


def checklist_md(r: dict) -> list[str]:
    """The seeds' verification items, one row each, grouped by requirement (absent from older results)."""
    rows = r.get("checklist")
    if not rows:
        return []
    tally = {status: sum(row["status"] == status for row in rows.values())
             for status in (*ROW_STATUSES, "skipped")}
    lines = ["", "## Checklist: the seeds' verification items", "",
             ", ".join(f"{n} {status}" for status, n in tally.items() if n) + f" (of {len(rows)} rows; rows above "
             f"level {r['level']} are not required)", "",
             "| row | what the seed asks | from level | status | scenarios | why |", "|---|---|---|---|---|---|"]
    for item_id, row in rows.items():
        lines.append(f"| {item_id} | {row['meaning']} <br>*{row.get('seed', '')}* | {row['level']} | "
                     f"{MARK[row['status']]} | {', '.join(row['scenarios']) or '—'} | {row['why']} |")
    return lines


def grade_md(r: dict) -> str:
    lines = [f"# Grade of {r['sut']['name']} at level {r['level']} — {MARK[r['verdict']]}", "",
             f"- adapter: `{r['sut'].get('path')}` (claims level {r['sut']['level']})",
             f"- base seed: {r.get('seed')}; each scenario's seed is listed below", "",
             "## Requirements", "", "| id | what | status | why |", "|---|---|---|---|"]
    for rid, req in sorted(r["requirements"].items()):
        lines.append(f"| {rid} | {REQUIREMENT_TITLES.get(rid, '')} | {MARK[req['status']]} | {req['why']} |")
    lines += checklist_md(r)
    for level in sorted({s["level"] for s in r["scenarios"]} | {s.get("level", 0) for s in r.get("skipped", [])} - {0}):
        lines += ["", f"## Level {level}", "", "| scenario | windows | requirements | verdict | seed | time |",
                  "|---|---|---|---|---|---|"]
        for s in r["scenarios"]:
            if s["level"] == level:
                lines.append(f"| [{s['name']}]({s['run_dir']}/summary.md) | {', '.join(s.get('windows') or []) or '—'} "
                             f"({s.get('exactness') or 'n/a'}) | {', '.join(s['requirements'])} | {MARK[s['verdict']]} | "
                             f"{s['seed']} | {s.get('seconds', 0):.1f}s |")
        for s in r.get("skipped", []):
            if s.get("level") == level:
                lines.append(f"| {s['name']} | | {', '.join(s.get('requirements', []))} | {MARK['skipped']} — {s['reason']} | | |")
    failing = [s for s in r["scenarios"] if s["verdict"] != "valid"]
    if failing:
        lines += ["", "## Failures and how to reproduce"]
        for s in failing:
            lines += ["", f"### {s['name']} — {MARK[s['verdict']]}", f"`{s.get('reproduce')}`"]
            for v in s.get("verdicts", []):
                if v["status"] != "valid":
                    lines += [f"- **{v['invariant']}**: {v['summary']}"] + _evidence_lines(v, 3)
    lines += ["", "## Where the time went", ""]
    from ..timing import table_lines

    table = table_lines(r.get("time_went") or {})
    if table:  # per phase and part, over every scenario (harness/timing.py)
        lines += ["```"] + table + ["```", ""]
    for k, v in (r.get("timings") or {}).items():
        if isinstance(v, (int, float)):
            lines.append(f"- {k}: {v:.1f}s")
    return "\n".join(lines) + "\n"
