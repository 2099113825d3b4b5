"""Hostile decoder inputs end cleanly (BE-JOB-003; CONTRACT §3 input safety).

The workload's hostile uploads (harness/workload.py ``HOSTILE_KINDS``) attack the decoder, not the network. Each
kind has the outcomes the contract allows:

- ``bomb`` (a valid image of 64-90 MP), ``huge_dims`` (a header declaring gigapixels over almost no data) and
  ``frame_bomb`` (thousands of frames): past the pixel cap (~40 MP) or any frame cap — a clean 4xx at upload, or
  accepted and ``failed`` with an error_code. ``ready`` means a decoder cap is missing.
- ``truncated_progressive`` (a progressive JPEG cut short) and ``polyglot`` (a valid image with a ZIP or HTML
  appended): a 4xx, ``failed`` with an error_code, or ``ready`` when the implementation decodes what is there.
- ``mislabeled`` (a good image whose filename and claimed content type name another format): the type comes from
  the magic bytes, so it is accepted and ends ``ready``; a refusal is a good upload refused.

For all of them: an answer of 5xx other than 503 is not a clean refusal; an accepted one must be terminal after
draining; its original's recorded ``content_type`` is that of its bytes, never the client's claim. A neighbour
lost to a hostile input is lost_accepted_work's to judge, a role that crashed role_stability's.
"""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import INVALID, TERMINAL_STATES, UNKNOWN, VALID, Verdict, evidence, final_read_ok, seed_of, FinalState, RunInfo

NAME = "hostile_inputs"
REQUIREMENTS = ["BE-JOB-003"]

NEVER_READY = frozenset({"bomb", "huge_dims", "frame_bomb"})
MAY_BE_READY = frozenset({"truncated_progressive", "polyglot"})
MUST_BE_READY = frozenset({"mislabeled"})
HOSTILE = NEVER_READY | MAY_BE_READY | MUST_BE_READY
# Kinds whose accepted upload may legitimately end ``failed`` (with an error_code): for the other checkers.
MAY_FAIL = NEVER_READY | MAY_BE_READY
MAGIC_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}


def _samples(history: History) -> dict[str, dict[str, Any]]:
    """sample -> {"invoke": first invoke, "answers": [ok/fail/info events of its tries]} for hostile uploads."""
    samples: dict[Any, dict[str, Any]] = {}
    op_sample: dict[Any, Any] = {}
    for e in history.of_type("invoke"):
        if e.get("f") == "upload" and e.get("kind") in HOSTILE:
            sample = e.get("sample") or e.get("op")
            samples.setdefault(sample, {"invoke": e, "answers": []})
            op_sample[e.get("op")] = sample
    for e in history.of_type("ok", "fail", "info"):
        if e.get("f") == "upload" and e.get("op") in op_sample:
            samples[op_sample[e["op"]]]["answers"].append(e)
    return samples


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    samples = _samples(history)
    if not samples:
        return Verdict(NAME, VALID, REQUIREMENTS, "no hostile uploads in this run", exercised=False,
                       seed=seed_of(run))
    if not final_read_ok(final):
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, "final state could not be read", seed=seed_of(run))
    records = final.get("attachments", {})
    problems, unknowns, outcomes = [], [], []
    for sample, item in sorted(samples.items()):
        invoke, answers = item["invoke"], item["answers"]
        kind = invoke.get("kind")
        base: dict[str, Any] = dict(sample=sample, kind=kind, size=invoke.get("size"), filename=invoke.get("filename"))
        for a in answers:
            status = a.get("status")
            if isinstance(status, int) and status >= 500 and status != 503:
                problems.append(evidence(f"{kind}: answered {status}, not a clean 4xx (nor a 503 to retry)",
                                         events=[invoke, a], **base))
        ok = next((a for a in answers if a.get("type") == "ok"), None)
        refused = next((a for a in answers if a.get("type") == "fail"), None)
        if ok is None:
            if refused is None:
                unknowns.append(evidence(f"{kind}: no try of the upload got an answer", events=[invoke, *answers[:3]],
                                         **base))
            elif kind in MUST_BE_READY:
                problems.append(evidence(f"{kind}: a good image refused ({refused.get('status')} "
                                         f"{refused.get('error_code')}) because its filename and claimed type name "
                                         "another format: the type comes from the magic bytes",
                                         events=[invoke, refused], **base))
            else:
                outcomes.append({"sample": sample, "kind": kind, "outcome": f"refused {refused.get('status')}",
                                 "error_code": refused.get("error_code")})
            continue
        attachment_id = ok.get("attachment_id")
        record = records.get(attachment_id) or {}
        body = record.get("body") or {}
        state = body.get("state")
        ids: dict[str, Any] = dict(attachment_id=attachment_id, job_id=ok.get("job_id"), events=[invoke, ok])
        if record.get("status") != 200 or not body:
            unknowns.append(evidence(f"{kind}: accepted but not read at the end (status {record.get('status')})",
                                     **ids, **base))
            continue
        outcomes.append({"sample": sample, "kind": kind, "attachment_id": attachment_id, "outcome": state,
                         "error_code": body.get("error_code"), "attempt": body.get("attempt")})
        if state not in TERMINAL_STATES:
            problems.append(evidence(f"{kind}: accepted but never terminal: still {state!r} after draining",
                                     attempt=body.get("attempt"), **ids, **base))
        elif state == "failed" and not body.get("error_code"):
            problems.append(evidence(f"{kind}: failed without an error_code", **ids, **base))
        elif state == "ready" and kind in NEVER_READY:
            problems.append(evidence(f"{kind}: rendered ready — the decoder's pixel, side or frame cap did not hold",
                                     **ids, **base))
        elif state == "failed" and kind in MUST_BE_READY:
            problems.append(evidence(f"{kind}: a good image ended failed ({body.get('error_code')}): its type comes "
                                     "from its magic bytes, not its name", **ids, **base))
        claimed = (body.get("original") or {}).get("content_type")
        magic = MAGIC_TYPES.get(invoke.get("format"))
        if claimed and magic and claimed.split(";")[0].strip().lower() != magic:
            problems.append(evidence(f"{kind}: original recorded as {claimed!r}, but its magic bytes say {magic!r}",
                                     **ids, **base))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} hostile inputs not handled cleanly",
                       evidence=problems + unknowns, seed=seed_of(run))
    if unknowns:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS, f"{len(unknowns)} of {len(samples)} hostile uploads have no "
                       "known outcome", evidence=unknowns, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS,
                   f"all {len(samples)} hostile uploads refused cleanly or terminal as allowed "
                   f"({sum(1 for o in outcomes if str(o['outcome']).startswith('refused'))} refused)",
                   evidence=[{"message": "outcomes", "outcomes": outcomes}], seed=seed_of(run))
