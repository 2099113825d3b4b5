"""The grade-many table: one row per submission, written as Markdown, CSV and HTML.

A row carries the submission's name, its adapter path, the verdict — a grade's ``valid`` / ``invalid`` /
``unknown``, or why it was not graded: ``invalid adapter``, ``did not start``, ``timeout``, ``error`` — each
requirement's status (``pass`` / ``fail`` / ``unknown`` / ``not required``, empty when nothing was graded), the time it
took, a link to its grade report (relative to the table) and the reason in a few words.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field

from .html import esc, pill, stylesheet
from .summary import MARK, REQUIREMENT_TITLES

REQUIREMENTS = sorted(REQUIREMENT_TITLES)  # BE-JOB-001 … BE-JOB-007
GRADED = ("valid", "invalid", "unknown", "tampered")
NOT_GRADED = ("invalid adapter", "did not start", "timeout", "error")
VERDICT_MARK = {**{k: MARK[k] for k in GRADED}, "invalid adapter": "⛔ invalid adapter",
                "did not start": "⛔ did not start", "timeout": "⏱ timeout", "error": "⚠ error"}
STATUS_SYMBOL = {"pass": "✅", "fail": "❌", "unknown": "❔", "skipped": "⏭", "not required": "⏭", "tampered": "🚫",
                 "": "—"}
CSV_COLUMNS = ["name", "adapter", "verdict", *REQUIREMENTS, "seconds", "report", "reason"]


@dataclass
class Row:
    name: str
    adapter: str
    verdict: str
    requirements: dict[str, str] = field(default_factory=dict)  # requirement id -> pass / fail / unknown / not required
    seconds: float | None = None
    report: str | None = None  # the grade's index.html, relative to the table's folder
    reason: str = ""
    reproduce: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def failing_summary(results: dict, limit: int = 4) -> str:
    """What made a grade not valid, in one line: each failing scenario with its failing checks."""
    parts = []
    for s in results.get("scenarios") or []:
        if s.get("verdict") == "valid":
            continue
        checks = [v["invariant"] for v in s.get("verdicts") or [] if v.get("status") == s["verdict"]]
        what = ", ".join(checks) or s.get("error") or s["verdict"]
        parts.append(f"{s['name']}: {what}")
    if not parts:
        parts = [f"{rid}: {r['why']}" for rid, r in sorted((results.get("requirements") or {}).items())
                 if r.get("status") in ("fail", "unknown")]
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def row_from_grade(name: str, adapter: str, results: dict, seconds: float | None, report: str | None, *,
                   verdict: str | None = None, reason: str | None = None, reproduce: str | None = None) -> Row:
    """A row from a grade's results (as in its results.json); ``verdict``/``reason`` override for a partial grade."""
    statuses = {rid: r.get("status", "") for rid, r in (results.get("requirements") or {}).items()}
    final = verdict or results.get("verdict", "unknown")
    if reason is None:
        reason = "" if final == "valid" else failing_summary(results)
    return Row(name, adapter, final, statuses, seconds, report, reason, reproduce)


def _cell(text) -> str:
    """Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text if text is not None else "").split()).replace("|", "\\|")


def _seconds(value) -> str:
    return f"{value:.1f}s" if isinstance(value, (int, float)) else ""


def markdown(rows: list[Row], meta: dict) -> str:
    lines = [f"# {meta.get('title') or 'Grades'}", ""]
    lines += [f"- {_cell(k)}: {_cell(v)}" for k, v in (meta.get("facts") or {}).items()]
    lines += ["- requirement cells: " + ", ".join(f"{STATUS_SYMBOL[s]} {s}" for s in ("pass", "fail", "unknown",
                                                                                      "not required")) +
              ", — not graded", ""]
    header = ["#", "submission", "adapter", "verdict", *REQUIREMENTS, "time", "report", "reason"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in enumerate(rows, start=1):
        cells = [str(index), _cell(row.name), f"`{_cell(row.adapter)}`", VERDICT_MARK.get(row.verdict, row.verdict),
                 *(STATUS_SYMBOL.get(row.requirements.get(rid, ""), row.requirements.get(rid, ""))
                   for rid in REQUIREMENTS),
                 _seconds(row.seconds), f"[report]({row.report})" if row.report else "", _cell(row.reason)]
        lines.append("| " + " | ".join(cells) + " |")
    counts = _counts(rows)
    lines += ["", "Totals: " + ", ".join(f"{n} {v}" for v, n in counts.items()), ""]
    return "\n".join(lines)


def csv_text(rows: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow([row.name, row.adapter, row.verdict, *(row.requirements.get(rid, "") for rid in REQUIREMENTS),
                         f"{row.seconds:.1f}" if isinstance(row.seconds, (int, float)) else "", row.report or "",
                         " ".join(row.reason.split())])
    return out.getvalue()


def _requirement_pill(status: str) -> str:
    """A compact status pill for a requirement cell (the full word on hover)."""
    if not status:
        return '<span class="pill none" title="not graded">—</span>'
    short = {"unknown": "unkn.", "skipped": "skip", "not required": "n/req"}.get(status, status)
    return pill(status, short).replace("<span ", f'<span title="{esc(status)}" ', 1)


def _counts(rows: list[Row]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    return counts


def html(rows: list[Row], meta: dict) -> str:
    head = "".join(f'<th class="req" title="{esc(rid)}: {esc(REQUIREMENT_TITLES[rid])}">{esc(rid[-3:])}</th>'
                   for rid in REQUIREMENTS)
    body = []
    for index, row in enumerate(rows, start=1):
        reqs = "".join(f'<td class="req">{_requirement_pill(row.requirements.get(rid, ""))}</td>'
                       for rid in REQUIREMENTS)
        adapter = esc(row.adapter).replace("/", "/<wbr/>")  # long paths wrap after a slash
        link = f'<a href="{esc(row.report)}">report</a>' if row.report else ""
        title = f' title="{esc(row.reproduce)}"' if row.reproduce else ""
        body.append(f'<tr class="row-{esc(row.verdict.replace(" ", "-"))}"><td class="num">{index}</td>'
                    f'<td{title}><b>{esc(row.name)}</b></td><td class="adapter"><code>{adapter}</code></td>'
                    f'<td>{pill(row.verdict)}</td>{reqs}<td class="num">{esc(_seconds(row.seconds))}</td>'
                    f'<td>{link}</td><td class="why">{esc(row.reason)}</td></tr>')
    facts = " · ".join(f"{esc(k)} <b>{esc(v)}</b>" for k, v in (meta.get("facts") or {}).items())
    counts = "".join(f"<span>{pill(v)}× {n}</span>" for v, n in _counts(rows).items())
    title = meta.get("title") or "Grades"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>
{stylesheet()}
</style></head><body class="report wide">
<h1>{esc(title)}</h1>
<p class="meta">{facts}</p>
<p class="meta counts">{counts}</p>
<table class="many"><tr><th rowspan="2">#</th><th rowspan="2">submission</th><th rowspan="2">adapter</th>
<th rowspan="2">verdict</th><th colspan="{len(REQUIREMENTS)}" class="req">requirements BE-JOB-…</th>
<th rowspan="2">time</th><th rowspan="2">report</th><th rowspan="2">reason</th></tr>
<tr>{head}</tr>
{''.join(body)}
</table>
<p class="meta">Each grade ran on one shared stack, every scenario on a fresh tenant, with the same base seed.
A requirement passes only when every scenario naming it ran valid and exercised it (see each report). Hover a
submission for the command that reproduces its grade.</p>
</body></html>
"""
