"""Hand-written SVG charts for the HTML reports: pure functions of stored data, no scripts, no external assets.

Three pictures, each readable offline and in a screenshot:

- ``phase_bars``: where the time went — one stacked horizontal bar per scenario, a segment per phase of
  ``run.json["timings"]`` (setup, start_roles, faults_and_workload, heal, drain, final_read, stop, check);
- ``states_chart``: one compact row per attachment, its states over time (queued / processing / ready / failed)
  from the history's ``transition`` lines (``state`` polls when the implementation has no events), the 202 as a
  dot, faults and held roles across all rows with their labels in a lane of their own (never over a row);
- ``queue_chart``: the work queue's depth (ready) and unacked, the dead-letter queue, and each sampled consumer's
  unacked deliveries over time (``queue`` / ``consumer`` lines), on the same time axis as ``states_chart``.

Every value is also in a ``<title>`` (the browser shows it on hover). Text is escaped for XML: each chart parses
as a standalone SVG document.
"""

from __future__ import annotations

import html
import math

STATE_COLOURS = {"queued": "#f0c24b", "processing": "#4b8bf0", "ready": "#3bb273", "failed": "#d64545"}
OTHER_STATE = "#b8b8b8"
PHASES = ["setup", "start_roles", "faults_and_workload", "heal", "drain", "final_read", "stop", "check"]
PHASE_COLOURS = {"setup": "#8da0cb", "start_roles": "#a6d854", "faults_and_workload": "#fc8d62",
                 "heal": "#e78ac3", "drain": "#66c2a5", "final_read": "#ffd92f", "stop": "#b3b3b3",
                 "check": "#e5c494"}
EXTRA_PHASE_COLOURS = ["#bc80bd", "#80b1d3", "#fb8072", "#ccebc5"]
FAULT = "#d64545"
ARMED = "#e0a030"
HELD = "#7f7f7f"
FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"
CHAR = 0.62  # width of one monospace character, in font sizes


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def text_width(text: str, size: float) -> float:
    return len(text) * size * CHAR


def clip(text: str, size: float, width: float) -> str:
    """``text`` cut (with an ellipsis) to fit ``width`` pixels at ``size``."""
    fits = max(1, int(width / (size * CHAR)))
    return text if len(text) <= fits else text[: max(1, fits - 1)] + "…"


def nice_step(span: float, target: int = 8) -> float:
    """A 1/2/5 × 10^k step giving about ``target`` ticks over ``span``."""
    if span <= 0:
        return 1.0
    raw = span / max(1, target)
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def ticks(lo: float, hi: float, target: int = 8) -> list[float]:
    step = nice_step(hi - lo, target)
    first = math.ceil(lo / step) * step
    out, value = [], first
    while value <= hi + step * 1e-9:
        out.append(round(value, 10))
        value += step
    return out


def tick_label(value: float, unit: str = "") -> str:
    text = f"{value:.0f}" if abs(value - round(value)) < 1e-9 else f"{value:g}"
    return text + unit


def _svg(width: float, height: float, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{esc(label)}" font-family="{FONT}" '
            f'font-size="11">' + "".join(body) + "</svg>")


def _legend(items: list[tuple[str, str]], x: float, y: float, width: float, size: float = 11,
            style: dict | None = None) -> tuple[list[str], float]:
    """Swatch + label pairs flowing left to right, wrapping at ``width``; returns the marks and the height used."""
    out, cx, cy = [], x, y
    for label, colour in items:
        w = 14 + text_width(label, size) + 14
        if cx + w > x + width and cx > x:
            cx, cy = x, cy + size + 7
        extra = (style or {}).get(label, "")
        out.append(f'<rect x="{cx:.1f}" y="{cy - size + 2:.1f}" width="10" height="10" fill="{colour}"{extra}/>'
                   f'<text x="{cx + 14:.1f}" y="{cy:.1f}" fill="#333">{esc(label)}</text>')
        cx += w
    return out, (cy - y) + size + 6


# --- where the time went -------------------------------------------------------------------------------------------

def phase_bars(rows: list[tuple[str, dict]], *, width: int = 1100, links: dict[str, str] | None = None,
               title: str = "where the time went, per scenario") -> str:
    """One stacked bar per scenario: ``rows`` = [(scenario name, run.json timings)], phases in run order."""
    names = [name for name, _ in rows]
    extra = []
    for _, timings in rows:
        for key, value in (timings or {}).items():
            if key not in PHASES and key not in extra and isinstance(value, (int, float)):
                extra.append(key)
    order = PHASES + extra
    colours = {**PHASE_COLOURS, **{k: EXTRA_PHASE_COLOURS[i % len(EXTRA_PHASE_COLOURS)] for i, k in enumerate(extra)}}
    totals = {k: sum(float((t or {}).get(k) or 0) for _, t in rows) for k in order}
    used = [k for k in order if totals[k] > 0]
    label_width = min(300, max(120, max((text_width(n, 11) for n in names), default=0) + 12))
    left, right, row_h, bar_h = label_width + 8, 70, 20, 14
    legend, legend_h = _legend([(f"{k} {totals[k]:.1f}s", colours[k]) for k in used], 8, 16, width - 16)
    top = 16 + legend_h + 18
    plot_w = width - left - right
    longest = max((sum(float(v) for k, v in (t or {}).items() if k in used and isinstance(v, (int, float)))
                   for _, t in rows), default=0.0)
    longest = max(longest, 1.0)
    scale = plot_w / longest
    height = top + row_h * max(1, len(rows)) + 8
    body = [f"<title>{esc(title)}</title>", *legend]
    for value in ticks(0, longest, 8):
        x = left + value * scale
        body.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 6}" stroke="#e6e6e6"/>'
                    f'<text x="{x:.1f}" y="{top - 7}" fill="#777" font-size="10" text-anchor="middle">'
                    f'{tick_label(value, "s")}</text>')
    for row, (name, timings) in enumerate(rows):
        y = top + row * row_h
        label = esc(clip(name, 11, label_width))
        text = (f'<text x="{left - 8}" y="{y + bar_h - 3}" text-anchor="end" fill="#222"><title>{esc(name)}</title>'
                f'{label}</text>')
        if links and links.get(name):
            text = f'<a href="{esc(links[name])}">{text}</a>'
        body.append(text)
        x, total = float(left), 0.0
        for key in used:
            value = float((timings or {}).get(key) or 0)
            if value <= 0:
                continue
            w = value * scale
            body.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.8):.1f}" height="{bar_h}" fill="{colours[key]}">'
                        f'<title>{esc(name)}: {esc(key)} {value:.2f}s</title></rect>')
            if w >= text_width(f"{value:.1f}", 9) + 6:
                body.append(f'<text x="{x + w / 2:.1f}" y="{y + bar_h - 3.5}" text-anchor="middle" font-size="9" '
                            f'fill="#222">{value:.1f}</text>')
            x += w
            total += value
        body.append(f'<text x="{x + 5:.1f}" y="{y + bar_h - 3}" fill="#444" font-size="10">{total:.1f}s</text>')
    return _svg(width, height, body, title)


# --- the history as series -----------------------------------------------------------------------------------------

def _epoch(value) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str) or not value:
        return None
    from ..formats import epoch  # RFC 3339 at any fractional precision

    return epoch(value)


def time_base(events: list[dict]) -> tuple[float, float]:
    """(wall clock of the run start, seconds from it to the last history line)."""
    if not events:
        return 0.0, 1.0
    wall0 = float(events[0]["wall"]) - float(events[0].get("t") or 0)
    end = max(float(e["wall"]) for e in events) - wall0
    return wall0, max(end, 1.0)


def attachment_rows(events: list[dict]) -> list[dict]:
    """Per accepted attachment (in acceptance order): label, the 202 time and its state spans, in seconds from the
    run start. Transitions (GET /events) give the spans; without any, the polled ``state`` lines do."""
    wall0, end = time_base(events)
    invokes = {e.get("op"): e for e in events if e["type"] == "invoke"}
    rows: dict[str, dict] = {}
    for e in events:
        if e["type"] == "ok" and e.get("attachment_id") and e["attachment_id"] not in rows:
            invoke = invokes.get(e.get("op")) or {}
            kind = invoke.get("kind")
            rows[e["attachment_id"]] = {"id": e["attachment_id"], "sample": invoke.get("sample") or e.get("op") or "",
                                        "kind": kind if kind and kind != "good" else "",
                                        "accepted": float(e["wall"]) - wall0, "changes": [], "polls": []}
    for e in events:
        aid = e.get("attachment_id")
        if not aid or e["type"] not in ("transition", "state"):
            continue
        row = rows.setdefault(aid, {"id": aid, "sample": "", "kind": "", "accepted": None, "changes": [], "polls": []})
        if e["type"] == "transition" and e.get("to"):
            server = _epoch(e.get("at_server") or e.get("at"))
            seen = float(e["wall"])
            # The server's clock (same machine) is exact; the poll that saw it may be late. Keep it when sane.
            when = server if server is not None and wall0 - 5 <= server <= seen + 1 else seen
            order = e.get("event_seq") if isinstance(e.get("event_seq"), (int, float)) else None
            row["changes"].append((order, when - wall0, e["to"], e))
        elif e["type"] == "state" and e.get("state"):
            row["polls"].append((None, float(e["wall"]) - wall0, e["state"], e))
    out = []
    for row in rows.values():
        changes = row.pop("changes")
        polls = row.pop("polls")
        if changes:
            changes.sort(key=lambda c: (c[0] if c[0] is not None else math.inf, c[1]))
            points = [(t, state, e) for _, t, state, e in changes]
        else:
            points, last = [], None
            for _, t, state, e in sorted(polls, key=lambda c: c[1]):
                if state != last:
                    points.append((t, state, e))
                    last = state
        spans = []
        for i, (t, state, e) in enumerate(points):
            stop = points[i + 1][0] if i + 1 < len(points) else end
            spans.append({"start": max(0.0, t), "end": max(t, stop), "state": state, "event": e})
        row["spans"] = spans
        out.append(row)
    out.sort(key=lambda r: (r["accepted"] if r["accepted"] is not None else math.inf))
    return out


def fault_marks(events: list[dict]) -> list[dict]:
    """Faults as marks in seconds from the run start: ``line`` (an instant) or ``band`` (a duration), with a label."""
    wall0, end = time_base(events)
    marks, opened = [], {}

    def when(e):
        return float(e["wall"]) - wall0

    for e in events:
        if e["type"] == "phase" and e.get("name") in ("hold_start", "hold_end"):
            key = ("hold", tuple(e.get("instances") or e.get("roles") or []))
            if e["name"] == "hold_start":
                opened[key] = e
            elif key in opened:
                s = opened.pop(key)
                marks.append({"kind": "band", "start": when(s), "end": when(e), "colour": HELD,
                              "label": "held " + ", ".join(key[1]), "title": f"held {', '.join(key[1])} "
                              f"(history lines {s.get('line')}–{e.get('line')})"})
            continue
        if e["type"] != "fault":
            continue
        action, phase = e.get("action"), e.get("phase")
        target = e.get("role") or e.get("service") or ""
        if action in ("toxic", "restart_service", "sigstop") and phase == "start":
            opened[(action, target, e.get("toxic"))] = e
        elif (action in ("toxic", "restart_service") and phase == "end") or action == "sigcont":
            key = ("sigstop", target, None) if action == "sigcont" else (action, target, e.get("toxic"))
            if key in opened:
                s = opened.pop(key)
                name = {"toxic": s.get("toxic") or "toxic", "restart_service": "restart", "sigstop": "SIGSTOP"}[key[0]]
                marks.append({"kind": "band", "start": when(s), "end": when(e), "colour": FAULT,
                              "label": f"{name} {target}".strip(),
                              "title": f"{name} {target} {when(s):.2f}s–{when(e):.2f}s "
                                       f"(history lines {s.get('line')}–{e.get('line')})"})
        elif phase == "hit" or action in ("sigkill", "crash") or phase == "arm" or (
                action == "republish" and phase == "start"):
            label = {"hit": "crash", "arm": "armed"}.get(phase) or {"sigkill": "SIGKILL"}.get(action, action)
            window = f" in {e['window']}" if e.get("window") else ""
            marks.append({"kind": "line", "start": when(e), "end": when(e),
                          "colour": ARMED if phase == "arm" else ("#8e5bd0" if action == "republish" else FAULT),
                          "dashed": phase == "arm", "label": f"{label} {target}".strip(),
                          "title": f"{label} {target}{window} at {when(e):.2f}s (history line {e.get('line')})"})
    for key, s in opened.items():  # never closed: runs to the end of the history
        name = "held " + ", ".join(key[1]) if key[0] == "hold" else f"{key[0]} {key[1]}"
        marks.append({"kind": "band", "start": when(s), "end": end, "colour": HELD if key[0] == "hold" else FAULT,
                      "label": name, "title": f"{name} from {when(s):.2f}s, never ended in the history"})
    marks.sort(key=lambda m: m["start"])
    return marks


def queue_series(events: list[dict]) -> dict:
    """Sampled queue depths and consumer unacked counts in seconds from the run start (``None`` samples skipped)."""
    wall0, _ = time_base(events)
    work_ready, work_unacked, dead, consumers, prefetch = [], [], [], {}, set()
    for e in events:
        t = float(e["wall"]) - wall0
        if e["type"] == "queue" and e.get("kind") != "peek" and not e.get("final"):
            if e.get("dead_letter"):
                if isinstance(e.get("ready"), (int, float)):
                    dead.append((t, float(e["ready"])))
            else:
                if isinstance(e.get("ready"), (int, float)):
                    work_ready.append((t, float(e["ready"])))
                if isinstance(e.get("unacked"), (int, float)):
                    work_unacked.append((t, float(e["unacked"])))
        elif e["type"] == "consumer" and e.get("consumer_tag") and isinstance(e.get("unacked"), (int, float)):
            consumers.setdefault(str(e["consumer_tag"]), []).append((t, float(e["unacked"])))
            if isinstance(e.get("prefetch"), (int, float)) and e["prefetch"] > 0:
                prefetch.add(int(e["prefetch"]))
    return {"work_ready": work_ready, "work_unacked": work_unacked, "dead_letter": dead, "consumers": consumers,
            "prefetch": max(prefetch) if prefetch else None}


# --- charts over time ----------------------------------------------------------------------------------------------

class TimeAxis:
    def __init__(self, end: float, left: float, width: float):
        self.end, self.left, self.width = max(end, 1.0), left, width
        self.scale = width / self.end

    def x(self, t: float) -> float:
        return self.left + min(max(t, 0.0), self.end) * self.scale

    def grid(self, top: float, bottom: float, labels_at: float | None) -> list[str]:
        out = []
        for value in ticks(0, self.end, 10):
            x = self.x(value)
            out.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="#ececec"/>')
            if labels_at is not None:
                out.append(f'<text x="{x:.1f}" y="{labels_at:.1f}" fill="#777" font-size="10" '
                           f'text-anchor="middle">{tick_label(value, "s")}</text>')
        return out


def _lanes(marks: list[dict], axis: TimeAxis, size: float = 10) -> tuple[list[tuple[dict, int]], int]:
    """Greedy placement of mark labels in lanes so that no two overlap; returns (mark, lane) and the lane count."""
    lane_ends: list[float] = []
    placed = []
    for m in marks:
        x0 = axis.x(m["start"]) + 2
        x1 = x0 + text_width(m["label"], size) + 6
        for lane, last in enumerate(lane_ends):
            if x0 >= last:
                lane_ends[lane] = x1
                placed.append((m, lane))
                break
        else:
            if len(lane_ends) < 6:
                lane_ends.append(x1)
                placed.append((m, len(lane_ends) - 1))
            else:  # too crowded: the mark stays, its label only in the tooltip
                placed.append((m, -1))
    return placed, len(lane_ends)


def _marks_body(marks: list[dict], axis: TimeAxis, top: float, bottom: float) -> list[str]:
    out = []
    for m in marks:
        x0 = axis.x(m["start"])
        if m["kind"] == "band":
            w = max(2.0, axis.x(m["end"]) - x0)
            out.append(f'<rect x="{x0:.1f}" y="{top:.1f}" width="{w:.1f}" height="{bottom - top:.1f}" '
                       f'fill="{m["colour"]}" opacity="{0.10 if m["colour"] == HELD else 0.14}">'
                       f'<title>{esc(m["title"])}</title></rect>')
        else:
            dash = ' stroke-dasharray="4 3"' if m.get("dashed") else ""
            out.append(f'<line x1="{x0:.1f}" y1="{top:.1f}" x2="{x0:.1f}" y2="{bottom:.1f}" stroke="{m["colour"]}" '
                       f'stroke-width="1.6"{dash}><title>{esc(m["title"])}</title></line>')
    return out


def states_chart(events: list[dict], *, width: int = 1100, title: str = "attachment states over time") -> str:
    """One row per attachment: its states as coloured bars over time, faults across all rows."""
    _, end = time_base(events)
    rows = attachment_rows(events)
    marks = fault_marks(events)
    n = len(rows)
    row_h = 12 if n <= 80 else 7
    bar_h = row_h - 3
    label_size = 9.5 if row_h >= 12 else 0  # very many rows: ids only in the tooltip
    labels = [" ".join(p for p in (r["sample"], r["kind"], r["id"][:8]) if p) for r in rows]
    left = 12 + max((text_width(lbl, 9.5) for lbl in labels), default=60) if label_size else 40
    left = min(max(left, 90), 240)
    axis = TimeAxis(end, left, width - left - 16)
    legend, legend_h = _legend([(s, c) for s, c in STATE_COLOURS.items()] +
                               [("fault", FAULT), ("armed", ARMED), ("role held", HELD), ("202 accepted", "#111")],
                               8, 16, width - 16, style={"fault": ' opacity="0.5"', "role held": ' opacity="0.35"'})
    placed, lanes = _lanes(marks, axis)
    lane_h = 12
    top_axis = 16 + legend_h + 8
    lanes_top = top_axis + 8
    rows_top = lanes_top + lanes * lane_h + 6
    bottom = rows_top + row_h * max(1, n) + 4
    height = bottom + (18 if n > 15 else 4)
    body = [f"<title>{esc(title)}</title>", *legend]
    body += axis.grid(lanes_top - 2, bottom, top_axis)
    if n > 15:  # a tall chart: the tick labels again below the rows
        body += axis.grid(bottom, bottom, bottom + 13)[1::2]
    body += _marks_body(marks, axis, lanes_top - 2, bottom)
    for m, lane in placed:
        if lane < 0:
            continue
        y = lanes_top + lane * lane_h + 9
        body.append(f'<text x="{axis.x(m["start"]) + 3:.1f}" y="{y:.1f}" fill="{m["colour"]}" font-size="10">'
                    f'<title>{esc(m["title"])}</title>{esc(m["label"])}</text>')
    if not rows:
        body.append(f'<text x="{left}" y="{rows_top + 10}" fill="#777">no accepted attachment in the history</text>')
    for i, (row, label) in enumerate(zip(rows, labels)):
        y = rows_top + i * row_h
        if i % 2:
            body.append(f'<rect x="0" y="{y - 1.5:.1f}" width="{width}" height="{row_h}" fill="#f7f7f7"/>')
        if label_size:
            body.append(f'<text x="{left - 6:.1f}" y="{y + bar_h - 1:.1f}" text-anchor="end" font-size="{label_size}" '
                        f'fill="#333"><title>{esc(row["id"])}</title>{esc(label)}</text>')
        for span in row["spans"]:
            x0, x1 = axis.x(span["start"]), axis.x(span["end"])
            e = span["event"]
            detail = " ".join(str(p) for p in (
                f"attempt {e.get('attempt')}" if e.get("attempt") is not None else "",
                f"by {e.get('actor')}" if e.get("actor") else "", e.get("reason") or e.get("error_code") or "",
                f"(history line {e.get('line')})" if e.get("line") else "") if p)
            body.append(f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(1.2, x1 - x0):.1f}" height="{bar_h}" '
                        f'fill="{STATE_COLOURS.get(span["state"], OTHER_STATE)}"><title>{esc(row["id"][:8])} '
                        f'{esc(span["state"])} {span["start"]:.2f}s–{span["end"]:.2f}s {esc(detail)}</title></rect>')
        if row["accepted"] is not None:
            body.append(f'<circle cx="{axis.x(row["accepted"]):.1f}" cy="{y + bar_h / 2:.1f}" r="2.2" fill="#111">'
                        f'<title>202 accepted at {row["accepted"]:.2f}s</title></circle>')
    return _svg(width, height, body, title)


def _step_path(points: list[tuple[float, float]], axis: TimeAxis, y) -> str:
    """A step line: each sample holds until the next one."""
    out = []
    for i, (t, v) in enumerate(points):
        out.append(f"M{axis.x(t):.1f},{y(v):.1f}" if i == 0 else f"H{axis.x(t):.1f}V{y(v):.1f}")
    return "".join(out)


def _panel(lines, axis: TimeAxis, top: float, height: float, width: int, left: float, label: str,
           reference: tuple[float, str] | None = None) -> list[str]:
    """One panel of step lines with its own y scale (integer ticks) and an optional dashed reference line."""
    bottom = top + height
    peak = max([v for _, _, pts, _ in lines for _, v in pts] + [reference[0] if reference else 0, 1])
    step = max(1.0, nice_step(peak, 4 if height >= 90 else 2))  # counts: integer ticks, the top one at or above
    y_max = math.ceil(peak / step) * step
    y_ticks = ticks(0, y_max, max(1, round(y_max / step)))

    def y(value: float) -> float:
        return bottom - value / y_max * height

    out = [f'<text x="{left:.1f}" y="{top - 5:.1f}" fill="#555" font-size="10">{esc(label)}</text>']
    for value in y_ticks:
        out.append(f'<line x1="{left:.1f}" y1="{y(value):.1f}" x2="{width - 16}" y2="{y(value):.1f}" stroke="#ececec"/>'
                   f'<text x="{left - 6:.1f}" y="{y(value) + 3.5:.1f}" text-anchor="end" fill="#777" '
                   f'font-size="10">{tick_label(value)}</text>')
    out.append(f'<line x1="{left:.1f}" y1="{bottom:.1f}" x2="{width - 16}" y2="{bottom:.1f}" stroke="#999"/>')
    if reference:
        ry = y(reference[0])
        out.append(f'<line x1="{left:.1f}" y1="{ry:.1f}" x2="{width - 16}" y2="{ry:.1f}" stroke="#555" '
                   f'stroke-dasharray="5 4"><title>{esc(reference[1])}</title></line>')
    for name, colour, points, stroke in lines:
        out.append(f'<path d="{_step_path(points, axis, y)}" fill="none" stroke="{colour}" stroke-width="{stroke}" '
                   f'stroke-linejoin="round"><title>{esc(name)}: {len(points)} samples, max '
                   f'{max(v for _, v in points):g}</title></path>')
    return out


def queue_chart(events: list[dict], *, width: int = 1100, left: float | None = None,
                title: str = "work queue and consumers over time") -> str:
    """Two panels on the time axis of ``states_chart``: the queues' depth (work queue ready, dead-letter ready), then
    unacked deliveries (the work queue's, each sampled consumer's) against the largest sampled prefetch (dashed)."""
    _, end = time_base(events)
    series = queue_series(events)
    if left is None:
        rows = attachment_rows(events)
        labels = [" ".join(p for p in (r["sample"], r["kind"], r["id"][:8]) if p) for r in rows]
        left = min(max(12 + max((text_width(lbl, 9.5) for lbl in labels), default=60), 90), 240)
    axis = TimeAxis(end, left, width - left - 16)
    palette = ["#7b3fb5", "#1f9e89", "#b5651d", "#3d5a98", "#c2185b", "#5d8a00"]
    depth = [line for line in (("work queue ready", "#2c6fd6", series["work_ready"], 2),
                               ("dead-letter ready", FAULT, series["dead_letter"], 2)) if line[2]]
    unacked = [("work queue unacked", "#f08a24", series["work_unacked"], 2)] if series["work_unacked"] else []
    for i, (tag, points) in enumerate(sorted(series["consumers"].items())):
        unacked.append((f"consumer {clip(tag, 10, 150)} unacked", palette[i % len(palette)], points, 1.4))
    if not depth and not unacked:  # e.g. a short scenario: the management API had no statistics yet
        return _svg(width, 26, [f"<title>{esc(title)}</title>",
                                f'<text x="{left:.1f}" y="16" fill="#777">no queue or consumer samples in the history '
                                f'(the management API had no statistics yet)</text>'], title)
    items = [(name, colour) for name, colour, _, _ in depth + unacked]
    if series["prefetch"]:
        items.append((f"prefetch {series['prefetch']} (largest sampled)", "#555"))
    legend, legend_h = _legend(items, 8, 16, width - 16)
    body = [f"<title>{esc(title)}</title>", *legend]
    top = 16 + legend_h + 16
    panels = []
    if depth:
        panels.append((depth, 100, "messages ready", None))
    if unacked:
        ref = (series["prefetch"], f"largest sampled prefetch {series['prefetch']}") if series["prefetch"] else None
        panels.append((unacked, 60, "unacked deliveries", ref))
    marks = fault_marks(events)
    for lines, height, label, ref in panels:
        body += axis.grid(top, top + height, None)
        body += _marks_body(marks, axis, top, top + height)
        body += _panel(lines, axis, top, height, width, left, label, ref)
        top += height + 24
    bottom = top - 24
    body += [t for t in axis.grid(bottom, bottom, bottom + 14) if t.startswith("<text")]
    return _svg(width, bottom + 20, body, title)
