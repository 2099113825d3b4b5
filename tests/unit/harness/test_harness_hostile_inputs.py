"""Hostile decoder inputs: the seeded workload kinds, and the hostile_inputs checker on hand-made histories."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from harness import workload
from harness.checkers import hostile_inputs, lost_accepted_work
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness_histories import Builder

KINDS = list(workload.HOSTILE_KINDS)


# --- workload ---------------------------------------------------------------------------------------------------

def test_hostile_plan_is_deterministic_small_and_labelled():
    ops = workload.plan(4242, 6, hostile=KINDS)
    again = workload.plan(4242, 6, hostile=KINDS)
    assert workload.fingerprint(ops) == workload.fingerprint(again)
    assert workload.fingerprint(ops) != workload.fingerprint(workload.plan(7, 6, hostile=KINDS))
    assert sorted(op.kind for op in ops if op.kind != "good") == sorted(KINDS)
    assert all(len(op.data) < 200_000 for op in ops), [(op.kind, len(op.data)) for op in ops]
    # Adding hostile uploads leaves the good ones of the seed as they were (a stream of their own).
    plain = workload.plan(4242, 6)
    assert [op.sha256 for op in ops if op.kind == "good"] == [op.sha256 for op in plain]
    positions = [i for i, op in enumerate(ops) if op.kind != "good"]  # spread, not bunched at one end
    assert positions[0] < len(ops) // 2 < positions[-1]
    with pytest.raises(ValueError):
        workload.plan(1, 2, hostile=["nonsense"])


@pytest.mark.parametrize("seed", [1, 2, 3, 4242])
def test_each_hostile_kind_is_what_it_claims(seed):
    ops = {op.kind: op for op in workload.plan(seed, 0, hostile=KINDS)}
    magic = {"png": b"\x89PNG", "jpeg": b"\xff\xd8\xff", "gif": b"GIF8", "webp": b"RIFF"}
    for op in ops.values():
        assert op.data.startswith(magic[op.fmt]), op.kind
    Image.MAX_IMAGE_PIXELS = None  # read headers only; nothing below decodes pixels of a bomb
    try:
        bomb = Image.open(io.BytesIO(ops["bomb"].data))
        assert bomb.width * bomb.height > 60_000_000
        huge = Image.open(io.BytesIO(ops["huge_dims"].data))
        assert huge.width * huge.height > 1_000_000_000 and len(ops["huge_dims"].data) < 4096
    finally:
        Image.MAX_IMAGE_PIXELS = 178956970
    assert Image.open(io.BytesIO(ops["frame_bomb"].data)).n_frames >= 2000
    truncated = Image.open(io.BytesIO(ops["truncated_progressive"].data))
    assert truncated.info.get("progressive") and not ops["truncated_progressive"].data.endswith(b"\xff\xd9")
    with pytest.raises(OSError):
        truncated.load()
    Image.open(io.BytesIO(ops["polyglot"].data)).load()  # a genuinely decodable image ...
    assert b"<html" in ops["polyglot"].data or b"PK\x05\x06" in ops["polyglot"].data  # ... and something else
    mislabeled = ops["mislabeled"]
    assert not mislabeled.filename.endswith("." + mislabeled.fmt)
    assert mislabeled.content_type != workload.FORMATS[mislabeled.fmt][1]
    Image.open(io.BytesIO(mislabeled.data)).load()


def test_two_frame_bombs_are_one_gif_and_one_animated_webp():
    bombs = [op for op in workload.plan(4242, 2, hostile=["frame_bomb", "frame_bomb"]) if op.kind == "frame_bomb"]
    assert sorted(op.fmt for op in bombs) == ["gif", "webp"]
    for op in bombs:
        image = Image.open(io.BytesIO(op.data))
        assert image.format == op.fmt.upper() and image.n_frames >= 2000 and len(op.data) < 160_000
        image.seek(image.n_frames - 1)
        image.load()  # every frame is valid: the cost is the count


# --- checker ----------------------------------------------------------------------------------------------------

def _upload(b: Builder, at: float, kind: str, fmt: str, op: str, answer: tuple, **extra) -> dict:
    b.add(at, "invoke", op=op, f="upload", kind=kind, sample=op, format=fmt, filename=f"x.{fmt}", size=100)
    status = answer[0]
    if status == 202:
        return b.add(at + 0.05, "ok", op=op, f="upload", status=202, attachment_id=answer[1], job_id=answer[2])
    return b.add(at + 0.05, "fail" if status < 500 else "info", op=op, f="upload", status=status, **extra)


def _accepted(b: Builder, at: float, kind: str, fmt: str, n: int, end: str, error_code=None, content_type=None):
    att, job = f"00000000-0000-4000-8000-{n:012d}", f"00000000-0000-4000-9000-{n:012d}"
    _upload(b, at, kind, fmt, f"u{n:04d}", (202, att, job))
    steps = [(at + 0.1, None, "queued", 1, "api")]
    if end != "queued":
        steps.append((at + 0.3, "queued", "processing", 1, "worker"))
    if end in ("ready", "failed"):
        steps.append((at + 0.6, "processing", end, 1, "worker"))
    body = b.transitions(att, steps, error_code=error_code)
    body["original"]["content_type"] = content_type or workload.FORMATS[fmt][1]
    return att


def _clean(b: Builder) -> None:
    _upload(b, 0, "bomb", "png", "u0001", (422,), error_code="too_many_pixels")
    _upload(b, 1, "huge_dims", "gif", "u0002", (422,), error_code="too_many_pixels")
    _accepted(b, 2, "frame_bomb", "gif", 3, "failed", error_code="too_many_frames")
    _upload(b, 3, "truncated_progressive", "jpeg", "u0004", (422,), error_code="truncated_image")
    _accepted(b, 4, "polyglot", "jpeg", 5, "ready")
    _accepted(b, 5, "mislabeled", "webp", 6, "ready")
    _accepted(b, 6, "good", "png", 7, "ready")


def test_clean_handling_is_valid_and_lost_work_tolerates_hostile_failures():
    b = Builder()
    _clean(b)
    verdict = hostile_inputs.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict
    assert lost_accepted_work.check(b.history(), b.final, b.run).status == VALID


def test_no_hostile_uploads_is_valid_but_not_exercised():
    b = Builder()
    _accepted(b, 0, "good", "png", 1, "ready")
    verdict = hostile_inputs.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and not verdict.exercised


@pytest.mark.parametrize("kind, fmt", [("bomb", "png"), ("huge_dims", "png"), ("frame_bomb", "gif")])
def test_a_capped_input_rendered_ready_is_invalid(kind, fmt):
    """The bug of tests/broken/pixel_cap_too_high: a 64 MP bomb decoded and rendered."""
    b = Builder()
    _clean(b)
    att = _accepted(b, 10, kind, fmt, 11, "ready")
    verdict = hostile_inputs.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID
    assert any(e.get("attachment_id") == att and "ready" in e["message"] for e in verdict.evidence)


def test_accepted_hostile_input_never_terminal_is_invalid():
    b = Builder()
    _clean(b)
    att = _accepted(b, 10, "truncated_progressive", "jpeg", 11, "processing")
    verdict = hostile_inputs.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and verdict.evidence[0]["attachment_id"] == att
    assert "never terminal" in verdict.evidence[0]["message"]


def test_failed_without_error_code_is_invalid():
    b = Builder()
    _accepted(b, 0, "frame_bomb", "gif", 1, "failed", error_code=None)
    assert hostile_inputs.check(b.history(), b.final, b.run).status == INVALID


def test_mislabeled_good_image_refused_or_failed_is_invalid():
    b = Builder()
    _upload(b, 0, "mislabeled", "png", "u0001", (415,), error_code="unsupported_media_type")
    verdict = hostile_inputs.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "magic bytes" in verdict.evidence[0]["message"]
    b = Builder()
    _accepted(b, 0, "mislabeled", "png", 1, "failed", error_code="decode_failed")
    assert hostile_inputs.check(b.history(), b.final, b.run).status == INVALID


def test_original_typed_from_the_client_claim_is_invalid():
    b = Builder()
    _accepted(b, 0, "mislabeled", "webp", 1, "ready", content_type="image/png")
    verdict = hostile_inputs.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "magic bytes say 'image/webp'" in verdict.evidence[0]["message"]


def test_server_error_is_not_a_clean_refusal_but_503_is_retryable():
    b = Builder()
    _upload(b, 0, "bomb", "png", "u0001", (500,))
    b.add(0.5, "fail", op="u0001", f="upload", status=422, error_code="too_many_pixels")
    assert hostile_inputs.check(b.history(), b.final, b.run).status == INVALID
    b = Builder()
    _upload(b, 0, "bomb", "png", "u0001", (503,))
    b.add(0.5, "fail", op="u0001", f="upload", status=422, error_code="too_many_pixels")
    assert hostile_inputs.check(b.history(), b.final, b.run).status == VALID


def test_no_known_outcome_is_unknown():
    b = Builder()
    b.add(0, "invoke", op="u0001", f="upload", kind="bomb", sample="u0001", format="png")
    b.add(10, "info", op="u0001", f="upload", error="ReadTimeout")
    verdict = hostile_inputs.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN


def test_unreadable_final_state_is_unknown():
    b = Builder()
    _clean(b)
    b.final["read_ok"] = False
    assert hostile_inputs.check(b.history(), b.final, b.run).status == UNKNOWN
