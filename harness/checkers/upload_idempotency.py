"""Invariant — idempotent uploads (BE-JOB-001, BE-JOB-002; CONTRACT §3).

* The same Idempotency-Key with the same bytes returns the same ``attachment_id`` and ``job_id``: a repeat of an
  accepted upload (the workload's ``repeat_keys`` probes) answered with another attachment or job is ``invalid``,
  and so is a repeat refused with a 4xx.
* The same key with other bytes is refused with ``409`` (``conflicting_keys`` probes): a 202 (a new attachment, or
  the earlier one answered for bytes it does not hold) or another status is ``invalid``.
* A good upload refused with a 4xx counts against the implementation (only a ``503`` — a dependency down, or the
  API at its own limit — means "retry later"; the client retries it with the same key).

A probe whose every try ended with an unknown outcome (timeout, 5xx), or whose original never got its 202, is
not judged (noted). Nothing judged — no probe, no good upload answered — is ``unknown`` where the scenario relies on
this check, else not exercised.
"""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import INVALID, VALID, Verdict, evidence, seed_of, undecided, FinalState, RunInfo

NAME = "upload_idempotency"
REQUIREMENTS = ["BE-JOB-001", "BE-JOB-002"]


def probes(history: History) -> dict[str, dict[str, Any]]:
    """(of, probe) -> {"invoke": first try, "answer": the last known answer (ok / fail) or None, "tries": [...]}."""
    out: dict[str, dict[str, Any]] = {}
    for o in history.operations().values():
        invoke = o["invoke"]
        if invoke.get("f") != "idempotency":
            continue
        item = out.setdefault(f"{invoke.get('of')}|{invoke.get('probe')}", {"invoke": invoke, "answer": None,
                                                                           "tries": []})
        item["tries"].append(invoke)
        if o["complete"] is not None and o["complete"]["type"] in ("ok", "fail"):
            item["answer"] = o["complete"]
    return out


def good_uploads_refused(history: History) -> tuple[list[dict[str, Any]], int]:
    """(evidence of each good upload whose answer was a 4xx refusal, number of good uploads answered at all)."""
    samples: dict[str, dict[str, Any]] = {}
    for o in history.operations().values():
        invoke = o["invoke"]
        if invoke.get("f") != "upload" or invoke.get("kind") != "good":
            continue
        entry = samples.setdefault(invoke.get("sample") or invoke["op"], {"invoke": invoke, "answers": []})
        if o["complete"] is not None and o["complete"]["type"] in ("ok", "fail"):
            entry["answers"].append(o["complete"])
    found = []
    for sample, item in sorted(samples.items()):
        refusals = [a for a in item["answers"] if a["type"] == "fail" and 400 <= int(a.get("status") or 0) < 500]
        if refusals and not any(a["type"] == "ok" for a in item["answers"]):
            found.append(evidence("a good upload was refused with a 4xx (only a 503 means retry later)",
                                  events=[item["invoke"], refusals[0]], sample=sample,
                                  status=refusals[0].get("status"), error_code=refusals[0].get("error_code")))
    return found, sum(1 for item in samples.values() if item["answers"])


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    asked = NAME in ((run.get("scenario") or {}).get("checks") or [])
    problems, answered_good = good_uploads_refused(history)
    notes = []
    originals = {invoke.get("sample") or invoke["op"]: ok for invoke, ok in history.accepted()
                 if invoke.get("f") == "upload"}
    judged = 0
    for _key, item in sorted(probes(history).items()):
        invoke, answer = item["invoke"], item["answer"]
        original = originals.get(invoke.get("of"))
        kind = invoke.get("probe")
        if answer is None:
            notes.append(evidence(f"{kind} probe: every try's outcome stayed unknown, not judged", events=item["tries"][:3],
                                  of=invoke.get("of")))
            continue
        if original is None:
            notes.append(evidence(f"{kind} probe of an upload that never got its 202, not judged",
                                  events=[invoke, answer], of=invoke.get("of")))
            continue
        judged += 1
        base: dict[str, Any] = dict(attachment_id=original.get("attachment_id"), job_id=original.get("job_id"),
                    events=[original, invoke, answer], of=invoke.get("of"),
                    idempotency_key=invoke.get("idempotency_key"), status=answer.get("status"))
        if kind == "repeat":
            if answer["type"] == "fail":
                problems.append(evidence("the same Idempotency-Key with the same bytes was refused (the same "
                                         "attachment_id must come back)", error_code=answer.get("error_code"), **base))
            elif answer.get("attachment_id") != original.get("attachment_id"):
                problems.append(evidence("the same Idempotency-Key with the same bytes created another attachment",
                                         answered=answer.get("attachment_id"), **base))
            elif original.get("job_id") and answer.get("job_id") and answer["job_id"] != original["job_id"]:
                problems.append(evidence("the same Idempotency-Key with the same bytes answered another job_id",
                                         answered=answer.get("job_id"), **base))
        elif kind == "conflict":
            if answer["type"] == "ok":
                same = answer.get("attachment_id") == original.get("attachment_id")
                problems.append(evidence(
                    "the same Idempotency-Key with other bytes was accepted: "
                    + ("the earlier attachment was answered for bytes it does not hold" if same
                       else "another attachment was created"), answered=answer.get("attachment_id"), **base))
            elif answer.get("status") != 409:
                problems.append(evidence("the same Idempotency-Key with other bytes was refused with "
                                         f"{answer.get('status')}, not 409", error_code=answer.get("error_code"), **base))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} idempotency or refusal violations",
                       evidence=problems + notes, seed=seed_of(run))
    if not judged and not answered_good:
        return undecided(NAME, REQUIREMENTS, "no idempotency probe answered and no good upload answered", asked,
                         seed_of(run), notes)
    if asked and not judged:
        return undecided(NAME, REQUIREMENTS, f"{answered_good} good uploads answered, none refused, but no "
                         "Idempotency-Key probe was judged", asked, seed_of(run), notes,
                         unknown_prefix="idempotency not proven")
    return Verdict(NAME, VALID, REQUIREMENTS,
                   (f"{judged} Idempotency-Key probes answered as the contract says; " if judged else
                    "no Idempotency-Key probe in this run; ") + f"none of {answered_good} good uploads refused",
                   exercised=True, evidence=notes, seed=seed_of(run))
