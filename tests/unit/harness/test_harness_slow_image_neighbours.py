"""A slow (heavy) image may legitimately fail; the good neighbours it made time out may not (issue 10, defect 1)."""

from __future__ import annotations

import io

from PIL import Image

from harness import workload
from harness.checkers import lost_accepted_work
from harness.checkers.base import INVALID, VALID
from harness_histories import ATT, Builder

HEAVY = "9b2f4e1a-0c3d-4e5f-8a7b-6c5d4e3f2a1b"
NEIGHBOUR = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"


def _failed(b: Builder, attachment_id: str, at: float) -> None:
    b.transitions(attachment_id, [(at, None, "queued", 1, "api"), (at + 0.1, "queued", "processing", 1, "worker"),
                                  (at + 0.9, "processing", "failed", 1, "worker")], error_code="decode_timeout")


def _ready(b: Builder, attachment_id: str, at: float) -> None:
    b.transitions(attachment_id, [(at, None, "queued", 1, "api"), (at + 0.1, "queued", "processing", 1, "worker"),
                                  (at + 0.2, "processing", "ready", 1, "worker")])


def test_a_heavy_image_failed_by_a_time_limit_is_not_lost_work():
    b = Builder()
    b.upload(0.0, HEAVY, job_id="j-heavy", kind="heavy")
    b.upload(0.1, ATT, job_id="j-good")
    _failed(b, HEAVY, 0.0)
    _ready(b, ATT, 0.1)
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == VALID


def test_a_good_neighbour_timed_out_behind_a_heavy_image_is_lost_work():
    b = Builder()
    b.upload(0.0, HEAVY, job_id="j-heavy", kind="heavy")
    b.upload(0.1, NEIGHBOUR, job_id="j-good")
    _failed(b, HEAVY, 0.0)
    _failed(b, NEIGHBOUR, 0.1)  # the unfixed reference: its queue wait counted against the decode limit
    verdict = lost_accepted_work.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    assert [e["attachment_id"] for e in verdict.evidence] == [NEIGHBOUR]
    assert verdict.evidence[0]["error_code"] == "decode_timeout"
    assert "good input ended failed" in verdict.evidence[0]["message"]


def test_a_heavy_image_left_processing_is_lost_work():
    b = Builder()
    b.upload(0.0, HEAVY, job_id="j-heavy", kind="heavy")
    b.transitions(HEAVY, [(0.0, None, "queued", 1, "api"), (0.1, "queued", "processing", 1, "worker")])
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == INVALID


def test_heavy_images_are_valid_large_pngs_spread_through_upload_order_without_changing_other_plans():
    plain = workload.plan(11, 6, bad=1)
    mixed = workload.plan(11, 6, bad=1, heavy=2, heavy_side=300)
    assert workload.fingerprint(workload.plan(11, 6, bad=1)) == workload.fingerprint(plain)
    assert [op.op for op in mixed] == [f"u{i:04d}" for i in range(9)]
    heavy = [i for i, op in enumerate(mixed) if op.kind == "heavy"]
    assert heavy == [2, 6]
    assert [op.sha256 for op in mixed if op.kind != "heavy"] == [op.sha256 for op in plain]
    image = Image.open(io.BytesIO(mixed[2].data))
    assert image.format == "PNG" and image.size == (300, 300)
    assert workload.fingerprint(workload.plan(11, 6, bad=1, heavy=2, heavy_side=300)) == workload.fingerprint(mixed)
