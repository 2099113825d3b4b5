"""timeline.html: one self-contained page (inline CSS and SVG, no scripts) with a row per attachment.

Each row shows the attachment's states as coloured bars (from its /events),
tapped messages as ticks, the upload as a dot; faults are drawn across all
rows as red lines (instant) or bands (durations), held roles as grey bands.
Hovering any mark shows its history line.
"""

from __future__ import annotations

import html

from ..checkers.base import parse_time
from ..checklist import shown_status
from ..paths import data_dir

COLOURS = {"queued": "#f0c24b", "processing": "#4b8bf0", "ready": "#3bb273", "failed": "#d64545", None: "#ccc"}
BADGE = {"valid": "#3bb273", "invalid": "#d64545", "tampered": "#111111"}
WIDTH, LEFT, ROW = 1100, 210, 22
MAX_ROWS = 500  # a long soak's page: every attachment a failing check names, then an even sample of the rest


def _rows(ids: list[str], results: dict) -> list[str]:
    """The attachments drawn: all of them up to MAX_ROWS; beyond, those named in the evidence of a check that is not
    valid, then an even sample of the others, in their order."""
    if len(ids) <= MAX_ROWS:
        return ids
    named = {ev.get("attachment_id") for v in results.get("verdicts", []) if v.get("status") != "valid"
             for ev in v.get("evidence") or [] if isinstance(ev, dict)}
    keep = [a for a in ids if a in named][:MAX_ROWS]
    rest = [a for a in ids if a not in named]
    room = MAX_ROWS - len(keep)
    if room > 0 and rest:
        keep += [rest[round(i * (len(rest) - 1) / max(1, room - 1))] for i in range(min(room, len(rest)))]
    chosen = set(keep)
    return [a for a in ids if a in chosen]


def _stylesheet() -> str:
    # reports/templates/timeline.css in a checkout, package data in a wheel (paths.py).
    return (data_dir("templates") / "timeline.css").read_text()


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def build(history, final: dict, run: dict, results: dict) -> str:
    events = list(history)
    if not events:
        return "<html><body>empty history</body></html>"
    wall0 = events[0]["wall"] - events[0]["t"]
    end = max(e["wall"] for e in events) - wall0 + 0.5
    scale = (WIDTH - LEFT - 20) / max(end, 1.0)
    x = lambda wall: LEFT + max(0.0, (wall - wall0)) * scale  # noqa: E731

    ops = {}
    for e in events:
        if e["type"] == "ok" and e.get("attachment_id"):
            ops.setdefault(e["attachment_id"], e)
    invokes = {e["op"]: e for e in events if e["type"] == "invoke"}
    every_id = list(dict.fromkeys(list(ops) + list((final or {}).get("attachments", {}))))
    ids = _rows(every_id, results)
    messages: dict[str, list[dict]] = {}  # tapped messages per attachment, indexed once (not a pass per row)
    for e in events:
        if e["type"] == "message" and isinstance(e.get("body"), dict) and e["body"].get("attachment_id"):
            messages.setdefault(e["body"]["attachment_id"], []).append(e)
    height = 52 + ROW * (len(ids) + 1)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" font-size="11">']
    # time axis
    step = max(1, round(end / 12))
    for s in range(0, int(end) + 1, step):
        svg.append(f'<line x1="{LEFT + s * scale:.1f}" y1="20" x2="{LEFT + s * scale:.1f}" y2="{height}" stroke="#eee"/>'
                   f'<text x="{LEFT + s * scale:.1f}" y="14" fill="#666">{s}s</text>')
    # holds and duration faults as bands
    opened: dict = {}
    for e in events:
        if e["type"] == "phase" and e.get("name") in ("hold_start", "hold_end"):
            key = ("hold", tuple(e.get("roles") or []))
            if e["name"] == "hold_start":
                opened[key] = e
            elif key in opened:
                s = opened.pop(key)
                svg.append(f'<rect x="{x(s["wall"]):.1f}" y="20" width="{max(1, x(e["wall"]) - x(s["wall"])):.1f}" '
                           f'height="{height - 20}" fill="#999" opacity="0.12"><title>{_esc("held: " + ", ".join(key[1]))} '
                           f'(lines {s["line"]}–{e["line"]})</title></rect>')
        if e["type"] == "fault":
            key = (e.get("action"), e.get("role") or e.get("service"), e.get("toxic"))
            if e.get("phase") == "start" and e.get("action") in ("toxic", "sigstop", "restart_service"):
                opened[key] = e
            elif e.get("phase") == "end" and key[0] in ("toxic", "restart_service") or e.get("action") == "sigcont":
                k = ("sigstop", key[1], None) if e.get("action") == "sigcont" else key
                if k in opened:
                    s = opened.pop(k)
                    svg.append(f'<rect x="{x(s["wall"]):.1f}" y="20" width="{max(2, x(e["wall"]) - x(s["wall"])):.1f}" '
                               f'height="{height - 20}" fill="#d64545" opacity="0.15"><title>{_esc(_fault_label(s))} '
                               f'(lines {s["line"]}–{e["line"]})</title></rect>'
                               f'<text x="{x(s["wall"]) + 3:.1f}" y="{height - 16}" fill="#a03030" font-size="10">'
                               f'{_esc(" ".join(str(p) for p in (s.get("toxic") or s.get("action"), s.get("service") or s.get("role")) if p))}</text>')
            if e.get("phase") in ("hit",) or e.get("action") in ("sigkill",) or e.get("phase") == "arm" or e.get("action") == "republish" and e.get("phase") == "start":
                colour = "#d64545" if e.get("phase") != "arm" else "#e0a030"
                svg.append(f'<line x1="{x(e["wall"]):.1f}" y1="20" x2="{x(e["wall"]):.1f}" y2="{height}" stroke="{colour}" '
                           f'stroke-width="2"><title>{_esc(_fault_label(e))} (line {e["line"]}, t={e["t"]:.2f}s)</title></line>'
                           f'<text x="{x(e["wall"]) + 3:.1f}" y="{height - 4}" fill="{colour}" font-size="10">'
                           f'{_esc(_short_label(e))}</text>')
    # rows
    for row, attachment_id in enumerate(ids):
        y = 30 + ROW * row
        ok = ops.get(attachment_id)
        sample = invokes.get(ok["op"], {}).get("sample") if ok else None
        kind = invokes.get(ok["op"], {}).get("kind") if ok else None
        svg.append(f'<text x="4" y="{y + 12}"><title>{_esc(attachment_id)}</title>{_esc(attachment_id[:8])} '
                   f'{_esc(sample or "")} {_esc(kind if kind and kind != "good" else "")}</text>')
        record = (final or {}).get("attachments", {}).get(attachment_id) or {}
        trans = sorted(record.get("events") or [], key=lambda t: t.get("seq") or 0)
        for i, t in enumerate(trans):
            start = parse_time(t.get("at"))
            if start is None:
                continue
            stop = parse_time(trans[i + 1].get("at")) if i + 1 < len(trans) else wall0 + end
            colour = COLOURS.get(t.get("to"), "#ccc")
            svg.append(f'<rect x="{x(start):.1f}" y="{y}" width="{max(1.5, x(stop) - x(start)):.1f}" height="14" '
                       f'fill="{colour}"><title>{_esc(t.get("from"))}→{_esc(t.get("to"))} attempt {t.get("attempt")} '
                       f'by {_esc(t.get("actor"))} at {_esc(t.get("at"))} {_esc(t.get("reason") or "")}</title></rect>')
        if ok:
            svg.append(f'<circle cx="{x(ok["wall"]):.1f}" cy="{y + 7}" r="3" fill="#000"><title>202 accepted '
                       f'(line {ok["line"]})</title></circle>')
        for e in messages.get(attachment_id, ()):
            svg.append(f'<line x1="{x(e["wall"]):.1f}" y1="{y - 2}" x2="{x(e["wall"]):.1f}" y2="{y + 16}" '
                       f'stroke="#222" stroke-width="1.5"><title>message attempt {e["body"].get("attempt")} '
                       f'(line {e["line"]}, t={e["t"]:.2f}s)</title></line>')
    svg.append("</svg>")
    verdict_rows = "".join(
        f'<tr class="{_esc(shown_status(v).replace(" ", "-"))}"><td>{_esc(v["invariant"])}</td><td>{_esc(shown_status(v))}</td>'
        f'<td>{_esc(", ".join(v["requirements"]))}</td><td>{_esc(v["summary"])}'
        + "".join(f'<div class="ev">{_esc(ev.get("message"))} {_esc(ev.get("attachment_id") or "")} '
                  f'{_esc("lines " + str(ev.get("lines")) if ev.get("lines") else "")}</div>'
                  for ev in (v.get("evidence") or [])[:5] if v["status"] != "valid")
        + "</td></tr>" for v in results.get("verdicts", []))
    legend = "".join(f'<span class="sw" style="background:{c}"></span>{_esc(s)} ' for s, c in COLOURS.items() if s)
    scenario = run.get("scenario", {})
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{_esc(scenario.get('name'))} seed {_esc(run.get('seed'))}</title>
<style>
{_stylesheet()}</style></head><body>
<h1>{_esc(scenario.get('name'))} <span class="badge" style="background:{BADGE.get(results.get('verdict'), '#c09000')}">{_esc(results.get('verdict'))}</span></h1>
<p>{_esc(scenario.get('description', ''))}</p>
<p>implementation <b>{_esc(run.get('adapter', {}).get('name'))}</b> at level {_esc(run.get('level'))} · seed <b>{_esc(run.get('seed'))}</b>
· windows {_esc(', '.join(scenario.get('windows') or []) or '—')} · reproduce: <code>{_esc(results.get('reproduce', ''))}</code></p>
<p>{legend}<span class="sw" style="background:#d64545;opacity:.4"></span>fault <span class="sw" style="background:#999;opacity:.4"></span>role held
· black dot = 202 · tick = message on the exchange</p>
{f"<p>showing {len(ids)} of {len(every_id)} attachments: every one a failing check names, then an even sample of the others</p>" if len(ids) < len(every_id) else ""}
{''.join(svg)}
<table><tr><th>invariant</th><th>verdict</th><th>requirements</th><th>summary / evidence</th></tr>{verdict_rows}</table>
</body></html>
"""


def _short_label(e: dict) -> str:
    what = {"hit": "crash", "arm": "armed"}.get(e.get("phase"), e.get("action"))
    return f"{what} {e.get('role') or e.get('service') or ''}".strip()


def _fault_label(e: dict) -> str:
    parts = [e.get("action"), e.get("phase"), e.get("role") or e.get("service"), e.get("window"), e.get("toxic")]
    return " ".join(str(p) for p in parts if p)


def grade_index(results: dict) -> str:
    rows = "".join(
        f'<tr class="{_esc(s["verdict"])}"><td><a href="{_esc(s["run_dir"])}/timeline.html">{_esc(s["name"])}</a></td>'
        f'<td>{_esc(s["verdict"])}</td><td>{_esc(s["level"])}</td><td>{_esc(", ".join(s["requirements"]))}</td>'
        f'<td>{_esc(s["seed"])}</td><td>{s.get("seconds", 0):.1f}s</td></tr>' for s in results["scenarios"])
    reqs = "".join(f'<tr><td>{_esc(k)}</td><td>{_esc(v["status"])}</td><td>{_esc(v["why"])}</td></tr>'
                   for k, v in sorted(results["requirements"].items()))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>grade {_esc(results['sut']['name'])}</title>
<style>
{_stylesheet()}</style></head><body>
<h1>Grade of {_esc(results['sut']['name'])} at level {_esc(results['level'])}: {_esc(results['verdict'])}</h1>
<h2>Requirements</h2><table><tr><th>id</th><th>status</th><th>why</th></tr>{reqs}</table>
<h2>Scenarios</h2><table><tr><th>scenario</th><th>verdict</th><th>level</th><th>requirements</th><th>seed</th><th>time</th></tr>{rows}</table>
</body></html>
"""
