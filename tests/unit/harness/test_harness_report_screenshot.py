"""The grade's index.html renders in a real browser: headless Chromium screenshots a synthetic grade (50 attachments
in one scenario) and the picture must be a page, not a blank or broken one.

Needs the Debian package `chromium` (scripts/bootstrap.sh installs it). The screenshots stay in the test's tmp folder
(kept when the test fails: .run/pytest/...) to be looked at.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image
from synthetic_grade import build

from harness.report import table

pytestmark = pytest.mark.screenshot

CHROMIUM = Path("/usr/bin/chromium")
WIDTH, HEIGHT = 1280, 2000


def screenshot(page: Path, png: Path, height: int = HEIGHT) -> Image.Image:
    assert CHROMIUM.exists() or shutil.which("chromium"), \
        "chromium is missing: scripts/bootstrap.sh installs the Debian package `chromium`"
    done = subprocess.run([str(CHROMIUM if CHROMIUM.exists() else shutil.which("chromium")), "--headless",
                           f"--screenshot={png}", f"--window-size={WIDTH},{height}", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", f"file://{page}"],
                          capture_output=True, text=True, timeout=120)
    assert png.is_file(), f"no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
    image = Image.open(png).convert("RGB")
    assert image.size == (WIDTH, height)
    return image


def colours(image: Image.Image, box=None) -> int:
    region = image.crop(box) if box else image
    return len(region.getcolors(maxcolors=1 << 20) or [])


def dark_pixels(image: Image.Image, box) -> int:
    """Pixels dark enough to be text."""
    grey = image.crop(box).convert("L")
    return sum(count for value, count in enumerate(grey.histogram()) if value < 90)


def pixels_near(image: Image.Image, box, colour: tuple[int, int, int], tolerance: int = 24) -> int:
    region = image.crop(box)
    return sum(count for count, rgb in region.getcolors(maxcolors=1 << 20) or []
               if all(abs(a - b) <= tolerance for a, b in zip(rgb, colour)))


def test_grade_index_renders_checklist_and_charts(tmp_path):
    grade_dir = build(tmp_path / "reports", uploads=50)
    image = screenshot(grade_dir / "index.html", tmp_path / "index.png")
    assert colours(image) > 200, "a blank or single-colour page"
    # The top: title, then the checklist — dark text on white.
    assert dark_pixels(image, (0, 0, WIDTH, 120)) > 1500, "no title"
    assert dark_pixels(image, (0, 120, WIDTH, 560)) > 8000, "the checklist has no text"
    # Status pills in the checklist: the red of a failed requirement and the green of a passed one.
    assert pixels_near(image, (0, 120, WIDTH, 560), (0xc6, 0x28, 0x28)) > 300
    assert pixels_near(image, (0, 120, WIDTH, 560), (0x2e, 0x9e, 0x5b)) > 300
    # Lower down: the attachment rows' state colours (queued yellow, ready green) fill a large area.
    charts = (0, 900, WIDTH, HEIGHT)
    assert pixels_near(image, charts, (0xf0, 0xc2, 0x4b), 12) > 20_000, "no queued bars"
    assert pixels_near(image, charts, (0x3b, 0xb2, 0x73), 12) > 20_000, "no ready bars"
    assert pixels_near(image, charts, (0x4b, 0x8b, 0xf0), 12) > 1_000, "no processing bars"
    # Nothing is cut at the right edge: the page's right margin stays white.
    assert colours(image, (WIDTH - 12, 0, WIDTH, HEIGHT)) <= 3


def test_all_50_attachment_rows_are_on_the_page_with_room_for_each(tmp_path):
    grade_dir = build(tmp_path / "reports", uploads=50)
    image = screenshot(grade_dir / "index.html", tmp_path / "tall.png", height=3200)
    # One state bar per attachment: count the rows whose bars start with the queued yellow, in the chart's bar area.
    rows, previous = [], False
    for y in range(0, 3200):
        line = [image.getpixel((px, y)) for px in range(130, 1140, 4)]
        has = sum(1 for p in line if all(abs(a - b) <= 12 for a, b in zip(p, (0xf0, 0xc2, 0x4b)))) >= 3
        if has and not previous:
            rows.append(y)
        previous = has
    # 50 rows of the backlog scenario plus the 5 of the small one, each separated from the next.
    assert len(rows) >= 55, len(rows)
    gaps = [b - a for a, b in zip(rows, rows[1:])]
    assert min(gaps) >= 10, gaps


def test_grade_many_table_renders(tmp_path):
    rows = [table.Row("alice", "class/alice/adapter.toml", "valid", {f"BE-JOB-00{i}": "pass" for i in range(1, 8)},
                      61.0, "alice/index.html"),
            table.Row("bob", "class/bob/adapter.toml", "invalid", {"BE-JOB-001": "fail", "BE-JOB-002": "pass"}, 40.2,
                      "bob/index.html", "window-commit-publish-failpoint: lost_accepted_work"),
            table.Row("carol", "class/carol/adapter.toml", "timeout", {"BE-JOB-001": "pass"}, 1800.0,
                      "carol/index.html", "time limit of 1800s reached during broker-restart (3 of 17 scenarios)"),
            table.Row("dave", "class/dave/adapter.toml", "invalid adapter", {}, 0.1, None,
                      "roles.api.command[0]: program 'nope' not found")]
    page = tmp_path / "index.html"
    page.write_text(table.html(rows, {"title": "Grades at level 4", "facts": {"level": 4, "base seed": 7}}))
    image = screenshot(page, tmp_path / "table.png", height=700)
    assert colours(image) > 100
    assert dark_pixels(image, (0, 100, WIDTH, 450)) > 5000
    assert pixels_near(image, (0, 100, WIDTH, 450), (0xc6, 0x28, 0x28)) > 200  # the invalid row's pills
    assert colours(image, (WIDTH - 12, 0, WIDTH, 700)) <= 3, "the table overflows the window"
