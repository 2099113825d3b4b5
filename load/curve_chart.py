"""The prefetch curve as a picture: four panels over time since release (max unacked per consumer, consumer RSS,
jobs finished per second, work queue left), one line per prefetch. Drawn once into primitives, rendered to SVG by
hand (as harness/report/plots.py does) and to PNG with Pillow (already a dependency): no plotting library."""
from __future__ import annotations

from harness.report.plots import esc, tick_label, ticks as axis_ticks

from .curve import Tick, rates

COLOURS = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666"]
PANELS = (("max unacked per consumer", lambda k: k.max_unacked if k.channels else None),
          ("consumer RSS (MiB)", lambda k: round(k.rss_kib / 1024, 1) if k.rss_kib else None),
          ("jobs finished / s (5 s window)", lambda k: k.jobs_per_s),
          ("work queue left (ready + unacked)", lambda k: None if k.ready is None else k.ready + (k.unacked or 0)))
WIDTH, PANEL_H, LEFT, RIGHT, TOP, GAP = 900, 170, 70, 20, 40, 50


def primitives(by_prefetch: dict[int, list[Tick]], title: str) -> dict:
    """Lines and texts in pixel coordinates: {"size": (w, h), "lines": [(points, colour, width)],
    "texts": [(x, y, text, colour, anchor)]}."""
    height = TOP + len(PANELS) * (PANEL_H + GAP) + 10
    lines, texts = [], [(LEFT, 22, title, "#000", "start")]
    t_max = max((k.t for ks in by_prefetch.values() for k in ks), default=1.0) or 1.0
    for ks in by_prefetch.values():
        rates(ks)
    for i, (label, value) in enumerate(PANELS):
        top = TOP + i * (PANEL_H + GAP)
        bottom = top + PANEL_H
        values = [value(k) for ks in by_prefetch.values() for k in ks]
        v_max = max([v for v in values if v is not None] + [1])
        if i == 0:
            v_max = max(v_max, max(by_prefetch, default=1))
        y_ticks = axis_ticks(0, v_max, 4)
        v_top = max(y_ticks[-1] if y_ticks else v_max, v_max)

        def x(t):
            return LEFT + (WIDTH - LEFT - RIGHT) * t / t_max

        def y(v, bottom=bottom, v_top=v_top):  # this panel's own frame
            return bottom - PANEL_H * v / v_top

        texts.append((LEFT, top - 6, label, "#000", "start"))
        lines.append(([(LEFT, top), (LEFT, bottom), (WIDTH - RIGHT, bottom)], "#444", 1))
        for v in y_ticks:
            lines.append(([(LEFT - 4, y(v)), (WIDTH - RIGHT, y(v))], "#e0e0e0", 1))
            texts.append((LEFT - 6, y(v) + 4, tick_label(v), "#444", "end"))
        for t in axis_ticks(0, t_max, 8):
            texts.append((x(t), bottom + 14, tick_label(t, "s"), "#444", "middle"))
        for j, (prefetch, ks) in enumerate(sorted(by_prefetch.items())):
            colour = COLOURS[j % len(COLOURS)]
            points = [(x(k.t), y(value(k))) for k in ks if value(k) is not None]
            if len(points) > 1:
                lines.append((points, colour, 2))
            if i == 0:  # the limit each line must stay under
                lines.append(([(LEFT, y(prefetch)), (WIDTH - RIGHT, y(prefetch))], colour, 1))
            if i == 0:
                texts.append((WIDTH - RIGHT - 90 * (len(by_prefetch) - j), top - 6, f"prefetch {prefetch}", colour,
                              "start"))
    return {"size": (WIDTH, height), "lines": lines, "texts": texts}


def to_svg(prims: dict) -> str:
    w, h = prims["size"]
    body = [f'<rect width="{w}" height="{h}" fill="#fff"/>']
    for points, colour, width in prims["lines"]:
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="{width}"/>')
    for px, py, text, colour, anchor in prims["texts"]:
        body.append(f'<text x="{px:.1f}" y="{py:.1f}" fill="{colour}" font-size="11" text-anchor="{anchor}">'
                    f'{esc(text)}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            f'font-family="DejaVu Sans, sans-serif">' + "".join(body) + "</svg>")


def to_png(prims: dict) -> bytes:
    import io

    from PIL import Image, ImageDraw

    w, h = prims["size"]
    image = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(image)
    for points, colour, width in prims["lines"]:
        draw.line([(round(px), round(py)) for px, py in points], fill=colour, width=width)
    for px, py, text, colour, anchor in prims["texts"]:
        length = draw.textlength(text)
        left = px - length if anchor == "end" else px - length / 2 if anchor == "middle" else px
        draw.text((left, py - 10), text, fill=colour)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
