"""Invariant 10 — message hygiene (BE-JOB-002, BE-JOB-005).

Every message the tap saw reach the work queue carries the fields of schemas/jobs.schema.json, valid (extra fields
are allowed: the contract grows additively); nothing anywhere in it — body, headers or properties — is a URL, a
storage path or the client's filename; its ``job_id`` is the one the harness was given for that attachment (by the
202, or by a replay), and a job_id never names two attachments. The AMQP ``message_id`` is free.

When uploads were accepted but the tap saw no message at all, observation failed (a topology the tap could not
mirror): the verdict is ``unknown``, never a silent ``valid``.
"""

from __future__ import annotations

import json
from functools import lru_cache

from jsonschema import Draft202012Validator

from ..paths import data_dir
from .base import INVALID, UNKNOWN, VALID, Verdict, accepted_attachments, evidence, seed_of

NAME = "message_hygiene"
REQUIREMENTS = ["BE-JOB-002", "BE-JOB-005"]
JOBS_SCHEMA = data_dir("schemas") / "jobs.schema.json"  # the repository's schemas/, or the wheel's copy
# Storage paths an implementation might leak: an object key of ours, a filesystem path.
PATH_MARKERS = ("://", "../", "/tmp/", "/var/", "/home/")


@lru_cache(maxsize=1)
def validator() -> Draft202012Validator:
    """jobs.schema.json with extra fields allowed at the top level (DESIGN §4: extensions are additive)."""
    schema = json.loads(JOBS_SCHEMA.read_text(encoding="utf-8"))
    schema = {**schema, "additionalProperties": True}
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def strings_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


def given_job_ids(history) -> dict[str, set[str]]:
    """attachment_id -> the job_ids the implementation gave the harness (202 answers, replay answers)."""
    out: dict[str, set[str]] = {}
    for e in history.of_type("ok"):
        if e.get("attachment_id") and e.get("job_id"):
            out.setdefault(e["attachment_id"], set()).add(e["job_id"])
    return out


def object_keys(final: dict) -> set[str]:
    keys = set()
    for record in (final or {}).get("attachments", {}).values():
        body = record.get("body") or {}
        for item in [body.get("original") or {}] + list(body.get("variants") or []):
            if item.get("key") and "/" in item["key"]:
                keys.add(item["key"])
    return keys


def forbidden_content(m: dict, filenames: set[str], keys: set[str]) -> list[tuple[str, str]]:
    """(what, value) for every URL, storage path or client filename anywhere in the message."""
    found = []
    where = {"body": m.get("body") if m.get("body") is not None else m.get("body_raw"),
             "properties": m.get("properties") or {}}
    for part, value in where.items():
        for text in strings_in(value):
            if any(marker in text for marker in PATH_MARKERS):
                found.append((f"{part} carries a URL or path", text))
            for key in keys:
                if key in text:
                    found.append((f"{part} carries a storage object key", text))
            for stem in filenames:
                if stem in text:
                    found.append((f"{part} carries the client filename", text))
    return found


def check(history, final, run) -> Verdict:
    from .dead_letter import injected_as, injections

    # Messages the harness injected itself (scenario fault ``inject``: unprocessable on purpose) are not the
    # implementation's: dead_letter judges what becomes of them.
    injected = injections(history)
    messages = [m for m in history.of_type("message") if not injected or injected_as(m, injected) is None]
    accepted = accepted_attachments(history)
    if accepted and not messages:
        observed = history.of_type("observe")
        mirrored = [e for e in observed if e.get("source") == "binding"]
        return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                       f"{len(accepted)} uploads accepted but the tap saw no message reach the work queue "
                       f"({len(mirrored)} bindings mirrored, firehose {'on' if any(e.get('firehose') for e in observed) else 'off'}): "
                       "observation failed, hygiene not judged",
                       evidence=[evidence("what the tap mirrored", events=observed[:5])], seed=seed_of(run))
    filenames = {e["filename"].rsplit(".", 1)[0] for e in history.of_type("invoke") if e.get("filename")}
    filenames = {f for f in filenames if len(f) >= 6}
    keys = object_keys(final)
    given = given_job_ids(history)
    problems = []
    job_owner: dict[str, tuple[str, dict]] = {}
    for m in messages:
        body = m.get("body")
        for what, value in forbidden_content(m, filenames, keys):
            problems.append(evidence(what, job_id=(body or {}).get("job_id"), events=[m], value=value[:300]))
        if not isinstance(body, dict):
            problems.append(evidence("message body is not a JSON object", events=[m], raw=str(m.get("body_raw"))[:200]))
            continue
        errors = sorted(validator().iter_errors(body), key=lambda err: list(err.path))
        if errors:
            problems.append(evidence("message does not validate against jobs.schema.json", job_id=body.get("job_id"),
                                     events=[m], errors=[f"{list(e.path)}: {e.message}" for e in errors[:5]]))
        job_id, attachment_id = body.get("job_id"), body.get("attachment_id")
        if job_id and attachment_id:
            owner = job_owner.setdefault(job_id, (attachment_id, m))
            if owner[0] != attachment_id:
                problems.append(evidence("job_id reused for another attachment", job_id=job_id,
                                         events=[owner[1], m]))
            if attachment_id in given and job_id not in given[attachment_id]:
                problems.append(evidence("message job_id differs from the job_id the API returned for the attachment",
                                         attachment_id=attachment_id, job_id=job_id, events=[m],
                                         returned=sorted(given[attachment_id])))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} hygiene violations in {len(messages)} messages",
                       evidence=problems[:50], seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, f"{len(messages)} tapped messages valid", exercised=bool(messages),
                   seed=seed_of(run))
