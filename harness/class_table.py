"""The class table of `harness grade-many`: one row per submission with every checklist row, the level achieved, the
time and the reproduce command (``class.csv``, ``class.html`` sortable by clicking a column, ``class.json``), and per
submission a feedback page a student can act on (``feedback.md`` and ``feedback.html`` in its folder).

A class row is plain data (a dict), so shards of a class graded on several machines merge into the same table as
one run (``harness grade-many merge``): rows are ordered by their place in the sorted submission list (``index``).

Checklist cells are the statuses harness/checklist.py gives a row (``pass``, ``fail``, ``unknown``, ``not proven``,
``missing``, ``not required``, ``tampered``), empty when the submission was not graded.

The level achieved comes from ONE grade at the highest level asked: level L (3, 4 or 5, at most the grade's level)
is achieved when every checklist row required from a level at or below L passed and every scenario of a level at
or below L ran valid; a row set met at level 3 but not at 4 is level 3. A grade that did not run a row (a partial
grade, ``--only``) achieves no level that row belongs to.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from .checklist import ITEMS, ROW_STATUSES
from .report.html import esc, pill, stylesheet

LEVELS = (3, 4, 5)
ROW_IDS = [item.id for item in ITEMS]
CSV_COLUMNS = ["index", "name", "adapter", "verdict", "level_achieved", *ROW_IDS, "seconds", "reproduce", "reason",
               "report", "feedback"]
NOT_PASSING = ("fail", "unknown", "not proven", "missing", "tampered")
GRADED = ("valid", "invalid", "unknown", "tampered")  # a grade's verdicts; any other says why it was not graded


def level_achieved(results: dict | None) -> int | None:
    """The highest level whose every row passed and every scenario ran valid, in this one grade (None: not even 3)."""
    if not results:
        return None
    rows = results.get("checklist") or {}
    if not rows:
        return None
    grade_level = int(results.get("level") or 0)
    scenarios = results.get("scenarios") or []
    achieved = None
    for level in LEVELS:
        if level > grade_level:
            break
        needed = [item for item in ITEMS if item.level <= level]
        if any((rows.get(item.id) or {}).get("status") != "pass" for item in needed):
            break
        if any(s.get("level", 3) <= level and s.get("verdict") != "valid" for s in scenarios):
            break
        achieved = level
    return achieved


def class_row(index: int, row, results: dict | None, folder: str | None = None) -> dict:
    """One class row from a grade-many row (harness/report/table.Row) and the grade's results (None: not graded)."""
    checklist = {item_id: r.get("status", "") for item_id, r in ((results or {}).get("checklist") or {}).items()}
    return {"index": index, "name": row.name, "adapter": row.adapter, "verdict": row.verdict,
            "level_achieved": level_achieved(results), "checklist": checklist, "seconds": row.seconds,
            "reproduce": row.reproduce or "", "reason": row.reason or "", "report": row.report or "",
            "feedback": f"{folder}/feedback.html" if folder else ""}


def ordered(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["index"], r["name"]))


def _level_text(value) -> str:
    return str(value) if value else "—"


def csv_text(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in ordered(rows):
        seconds = r.get("seconds")
        writer.writerow([r["index"], r["name"], r["adapter"], r["verdict"], r.get("level_achieved") or "",
                         *((r.get("checklist") or {}).get(item_id, "") for item_id in ROW_IDS),
                         f"{seconds:.1f}" if isinstance(seconds, (int, float)) else "", r.get("reproduce", ""),
                         " ".join(str(r.get("reason", "")).split()), r.get("report", ""), r.get("feedback", "")])
    return out.getvalue()


# Click a header to sort by that column (again: the other way); numbers compare as numbers. No external asset.
SORT_JS = """<script>
document.querySelectorAll('table.sortable th').forEach(function (th, col) {
  th.style.cursor = 'pointer';
  th.addEventListener('click', function () {
    var body = th.closest('table').tBodies[0], rows = Array.from(body.rows), up = th.dataset.dir !== 'up';
    th.dataset.dir = up ? 'up' : 'down';
    rows.sort(function (a, b) {
      var x = a.cells[col].dataset.key || a.cells[col].textContent, y = b.cells[col].dataset.key || b.cells[col].textContent;
      var nx = parseFloat(x), ny = parseFloat(y), c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return up ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
</script>"""


def _cell_status(status: str) -> str:
    if not status:
        return '<td data-key="~" title="not graded">—</td>'
    symbol = ROW_STATUSES.get(status, ("", None))[0]
    return f'<td class="req" data-key="{esc(status)}" title="{esc(status)}">{pill(status, symbol or status)}</td>'


def html(rows: list[dict], meta: dict) -> str:
    by_id = {item.id: item for item in ITEMS}
    head = "".join(f'<th title="{esc(i)}: {esc(by_id[i].meaning)}">{esc(i.removeprefix("BE-JOB-"))}</th>'
                   for i in ROW_IDS)
    body = []
    for r in ordered(rows):
        seconds = r.get("seconds")
        links = " ".join(f'<a href="{esc(r[k])}">{k}</a>' for k in ("report", "feedback") if r.get(k))
        cells = "".join(_cell_status((r.get("checklist") or {}).get(i, "")) for i in ROW_IDS)
        body.append(f'<tr><td class="num">{r["index"]}</td><td title="{esc(r.get("reproduce", ""))}"><b>'
                    f'{esc(r["name"])}</b></td><td data-key="{esc(r["verdict"])}">{pill(r["verdict"])}</td>'
                    f'<td class="num" data-key="{r.get("level_achieved") or 0}">{_level_text(r.get("level_achieved"))}'
                    f'</td>{cells}<td class="num">'
                    f'{f"{seconds:.1f}" if isinstance(seconds, (int, float)) else ""}</td><td>{links}</td>'
                    f'<td><code>{esc(r.get("reproduce", ""))}</code></td><td class="why">{esc(r.get("reason", ""))}'
                    f'</td></tr>')
    facts = " · ".join(f"{esc(k)} <b>{esc(v)}</b>" for k, v in class_facts(meta).items())
    legend = ", ".join(f"{symbol} {status}" for status, (symbol, _) in ROW_STATUSES.items())
    title = f"Class table at level {meta.get('level')}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
{stylesheet()}
</style></head><body class="report wide">
<h1>{esc(title)}</h1>
<p class="meta">{facts}</p>
<p class="meta">Checklist cells: {esc(legend)}; — not graded. Click a column to sort by it.</p>
<table class="many sortable"><thead><tr><th>#</th><th>submission</th><th>verdict</th><th>level</th>{head}
<th>seconds</th><th>pages</th><th>reproduce</th><th>reason</th></tr></thead>
<tbody>
{chr(10).join(body)}
</tbody></table>
{SORT_JS}
</body></html>
"""


def class_facts(meta: dict) -> dict:
    """The facts a table shows: the same for one run and for merged shards (no shard, no start time)."""
    facts = {"level": meta.get("level"), "base seed": meta.get("seed"), "submissions": meta.get("submissions")}
    if meta.get("only"):
        facts["scenarios"] = ",".join(meta["only"])
    if meta.get("profile"):
        facts["course profile"] = meta["profile"]
    return facts


def write(out: Path, rows: list[dict], meta: dict) -> None:
    """class.csv, class.html and class.json in ``out``."""
    out = Path(out)
    (out / "class.csv").write_text(csv_text(rows))
    (out / "class.html").write_text(html(rows, meta))
    (out / "class.json").write_text(json.dumps({"kind": "class-table", "meta": meta, "rows": ordered(rows)},
                                               indent=1, default=str))


# --- feedback a student can act on ----------------------------------------------------------------------------------

def _laptop_command(scenario: dict, level: int) -> str:
    """The one command that reruns a scenario on a laptop, from the submission's own folder."""
    return f"harness run {scenario['name']} --seed {scenario['seed']} --sut adapter.toml --level {level}"


def _evidence_lines(scenario: dict, checks: list[str], limit: int = 5) -> list[str]:
    lines = []
    for v in scenario.get("verdicts") or []:
        if v.get("invariant") not in checks or v.get("status") == "valid":
            continue
        lines.append(f"{v['invariant']} ({v['status']}): {v.get('summary', '')}")
        for e in (v.get("evidence") or [])[:limit]:
            ids = " ".join(str(e[k]) for k in ("attachment_id", "job_id") if e.get(k))
            lines.append(f"  - {e.get('message', '')}" + (f" [{ids}]" if ids else ""))
    return lines


def feedback(name: str, row: dict, results: dict | None) -> list[dict]:
    """Per checklist row not passing: what it means in plain English, why, the evidence, the scenario and the one
    command that reproduces it. Empty when every required row passed (or nothing was graded)."""
    if not results:
        return []
    level = int(results.get("level") or 3)
    scenarios = {s["name"]: s for s in results.get("scenarios") or []}
    by_id = {item.id: item for item in ITEMS}
    out = []
    for item_id, r in (results.get("checklist") or {}).items():
        if r.get("status") not in NOT_PASSING:
            continue
        item = by_id.get(item_id)
        ran = [scenarios[n] for n in r.get("scenarios") or [] if n in scenarios]
        bad = [s for s in ran if s.get("verdict") != "valid"] or ran
        out.append({"row": item_id, "status": r["status"], "meaning": r.get("meaning") or (item.meaning if item else ""),
                    "why": r.get("why", ""),
                    "scenarios": [{"name": s["name"], "seed": s["seed"], "verdict": s.get("verdict"),
                                   "command": _laptop_command(s, level),
                                   "evidence": _evidence_lines(s, list(item.checks) if item else [])}
                                  for s in bad]})
    return out


def feedback_markdown(name: str, row: dict, items: list[dict]) -> str:
    lines = [f"# Feedback for {name}", "",
             f"Verdict: **{row['verdict']}**; level achieved: **{_level_text(row.get('level_achieved'))}**.", ""]
    if row.get("reason") and (not items or row["verdict"] not in GRADED):
        lines += [f"Why: {row['reason']}", ""]
    if not items:
        lines += ["Every checklist row this grade required passed." if row["verdict"] == "valid"
                  else "No checklist row could be judged: see the reason above.", ""]
    else:
        lines += ["Each item below is a checklist row that did not pass. Run its command from your submission's "
                  "folder (where adapter.toml is) to see the same run on your laptop: the seed fixes the workload "
                  "and the fault schedule.", ""]
    for it in items:
        lines += [f"## {it['row']}: {it['status']}", "", f"What it checks: {it['meaning']}.", "",
                  f"What went wrong: {it['why']}", ""]
        for s in it["scenarios"]:
            lines += [f"Scenario `{s['name']}` (seed {s['seed']}, {s['verdict']}):", ""]
            lines += [f"    {line}" for line in s["evidence"]] + ([""] if s["evidence"] else [])
            lines += ["Reproduce:", "", f"    {s['command']}", ""]
    if row.get("reproduce"):
        lines += ["The whole grade again:", "", f"    {row['reproduce']}", ""]
    return "\n".join(lines)


def feedback_html(name: str, row: dict, items: list[dict]) -> str:
    parts = [f"<h1>Feedback for {esc(name)}</h1>",
             f"<p>Verdict {pill(row['verdict'])} · level achieved <b>{esc(_level_text(row.get('level_achieved')))}"
             f"</b></p>"]
    if row.get("reason") and (not items or row["verdict"] not in GRADED):
        parts.append(f"<p>Why: {esc(row['reason'])}</p>")
    for it in items:
        parts.append(f"<h2>{esc(it['row'])} {pill(it['status'])}</h2><p>What it checks: {esc(it['meaning'])}.</p>"
                     f"<p>What went wrong: {esc(it['why'])}</p>")
        for s in it["scenarios"]:
            evidence = "\n".join(s["evidence"])
            parts.append(f"<h3>Scenario <code>{esc(s['name'])}</code> (seed {s['seed']}, {esc(s['verdict'])})</h3>"
                         + (f"<pre>{esc(evidence)}</pre>" if evidence else "")
                         + f"<p>Reproduce from your submission's folder:</p><pre>{esc(s['command'])}</pre>")
    if row.get("reproduce"):
        parts.append(f"<p>The whole grade again:</p><pre>{esc(row['reproduce'])}</pre>")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>Feedback for {esc(name)}</title>'
            f"<style>\n{stylesheet()}\n</style></head><body class=\"report\">\n" + "\n".join(parts) + "\n</body></html>\n")


def write_feedback(folder: Path, name: str, row: dict, results: dict | None) -> list[dict]:
    """feedback.md and feedback.html in the submission's folder; returns the items."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    items = feedback(name, row, results)
    (folder / "feedback.md").write_text(feedback_markdown(name, row, items))
    (folder / "feedback.html").write_text(feedback_html(name, row, items))
    return items


# --- shards -----------------------------------------------------------------------------------------------------------

def shard_of(items: list, index: int, count: int) -> list:
    """The ``index``-th (1-based) of ``count`` deterministic slices of ``items`` (round robin over their order)."""
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}: expected 1 ≤ i ≤ n")
    return [x for k, x in enumerate(items) if k % count == index - 1]


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard expects i/n (e.g. 1/4), got {text!r}") from None
    shard_of([], i, n)
    return i, n


class MergeError(ValueError):
    pass


def merge(folders: list[Path]) -> tuple[list[dict], dict]:
    """The rows and meta of one class from the shards' folders (each holding class.json): same level, seed, scenario
    set and class size; every submission once."""
    rows, meta, seen_shards = [], None, []
    for folder in folders:
        path = Path(folder) / "class.json"
        if not path.is_file():
            raise MergeError(f"{folder}: no class.json (is it a grade-many folder?)")
        data = json.loads(path.read_text())
        m = data["meta"]
        key = {k: m.get(k) for k in ("level", "seed", "only", "submissions", "profile")}
        if meta is None:
            meta = {**m}
        elif key != {k: meta.get(k) for k in key}:
            raise MergeError(f"{folder}: graded differently ({key}) from the first shard "
                             f"({ {k: meta.get(k) for k in key} })")
        seen_shards.append(m.get("shard"))
        for r in data["rows"]:
            if r.get("report"):
                r["report"] = str(Path(folder).resolve() / r["report"])
            if r.get("feedback"):
                r["feedback"] = str(Path(folder).resolve() / r["feedback"])
            rows.append(r)
    if meta is None:
        raise MergeError("nothing to merge")
    names = [r["index"] for r in rows]
    if len(names) != len(set(names)):
        raise MergeError("a submission appears in two shards: " + ", ".join(
            sorted({r["name"] for r in rows if names.count(r["index"]) > 1})))
    missing = (meta.get("submissions") or 0) - len(rows)
    if missing > 0:
        shown = sorted({s for s in seen_shards if s})
        raise MergeError(f"{missing} submission(s) missing: shards given {', '.join(shown) or 'none'}")
    meta = {k: v for k, v in meta.items() if k not in ("shard", "started_at")}
    return ordered(rows), meta
