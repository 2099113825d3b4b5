"""harness/formats.py: timestamps per RFC 3339 at any fractional precision, UUIDs case-insensitive — wherever the
harness reads them (checkers' parse_time, the report's plots, a loaded history, the final state)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from harness.checkers import run_checks
from harness.checkers.base import parse_time
from harness.formats import canonical_ids, epoch, has_upper_uuid, parse_rfc3339
from harness.history import History
from harness.report.plots import _epoch

BASE = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("text, expected", [
    ("2026-11-29T12:00:00Z", BASE),
    ("2026-11-29T12:00:00.5Z", BASE + 0.5),
    ("2026-11-29T12:00:00.123456Z", BASE + 0.123456),
    ("2026-11-29T12:00:00.1234567Z", BASE + 0.123456),  # .NET: 7 digits, cut to the microsecond
    ("2026-11-29T12:00:00.123456789Z", BASE + 0.123456),  # Java: 9 digits
    ("2026-11-29t12:00:00z", BASE),  # RFC 3339 §5.6 allows lower case
    ("2026-11-29T15:00:00+03:00", BASE),
    ("2026-11-29T07:30:00.250-04:30", BASE + 0.25),
    ("2026-11-29 12:00:00+00", BASE),  # PostgreSQL's hour-only offset: read, as before
    ("2026-11-29 12:00:00.1234567+00:00", BASE + 0.123456),  # PostgreSQL's text form (space)
    ("2026-11-29T11:59:60Z", BASE),  # a leap second: the instant after :59
    ("2026-11-29", None),
    ("yesterday", None),
    ("2026-13-01T00:00:00Z", None),
])
def test_rfc3339_at_any_precision(text, expected):
    for parse in (epoch, parse_time, _epoch):
        got = parse(text)
        if expected is None:
            assert got is None, (parse, text)
        else:
            assert got == pytest.approx(expected, abs=1e-6), (parse, text)


def test_numbers_pass_through_and_aware_datetimes_come_back():
    assert epoch(12.5) == 12.5 and parse_time(3) == 3.0 and epoch(None) is None and epoch(True) is None
    assert parse_rfc3339("2026-11-29T12:00:00.1234567Z").tzinfo is not None


UPPER = "5F1D2C3B-8A9E-4B7C-9D0E-1F2A3B4C5D6E"
LOWER = UPPER.lower()


def test_uuids_are_canonical_in_lower_case_everywhere_in_a_value():
    value = {"attachment_id": UPPER, UPPER: [UPPER, {"job_id": UPPER}], "name": "Not-A-UUID", "n": 1}
    assert canonical_ids(value) == {"attachment_id": LOWER, LOWER: [LOWER, {"job_id": LOWER}], "name": "Not-A-UUID",
                                    "n": 1}
    assert has_upper_uuid(json.dumps(value)) and not has_upper_uuid(json.dumps(canonical_ids(value)))
    assert canonical_ids("ABCDEF") == "ABCDEF"  # only UUIDs


def test_a_loaded_history_compares_uuids_case_insensitively_and_the_file_keeps_them(tmp_path):
    path = tmp_path / "history.jsonl"
    lines = [{"seq": 1, "type": "ok", "op": "u1", "attachment_id": UPPER, "t": 0, "wall": 0},
             {"seq": 2, "type": "message", "body": {"attachment_id": LOWER}, "t": 0, "wall": 0}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    history = History.load(path)
    assert history.of_attachment("ok", LOWER) and history.events[1]["body"]["attachment_id"] == LOWER
    assert UPPER in path.read_text()  # the evidence on disk is what the implementation wrote
    assert History.from_events([{"type": "ok", "attachment_id": UPPER}]).events[0]["attachment_id"] == LOWER


def test_the_final_state_is_read_with_canonical_uuids():
    from harness.checkers import CHECKERS

    seen = {}

    class Probe:
        REQUIREMENTS = []

        @staticmethod
        def check(history, final, run):
            seen["final"] = final
            raise RuntimeError("probe")

    CHECKERS["__probe__"] = Probe
    try:
        run_checks(History(()), {"attachments": {UPPER: {"state": "ready"}}}, {"seed": 1}, names=["__probe__"])
    finally:
        del CHECKERS["__probe__"]
    assert seen["final"] == {"attachments": {LOWER: {"state": "ready"}}}
