"""Invariant 10 — message hygiene (BE-JOB-002, BE-JOB-005).

Every message the tap saw reach the work queue carries the fields of schemas/jobs.schema.json, valid (extra fields
are allowed: the contract grows additively); nothing anywhere in it — body, headers or properties — is a URL, a
storage path, the client's filename, the file's bytes (an image's magic bytes, raw, base64 or hex) or a credential
(a header, property or field named like a password, secret, token or authorization, with a value) — one rule set for
the body, the headers and the string properties. Its ``job_id`` is the one the 202 gave for that attachment (CONTRACT
§4: it never changes on redelivery, retry or replay, so a replay answering another job_id is a finding too); the 202's
job_id names no other attachment; and an attachment that was processed and whose messages the tap saw carries its
202's job_id on at least one of them. A job_id never names two attachments. The AMQP ``message_id`` is free, and so
are extra fields and headers that carry identifiers or service data.

When uploads were accepted but the tap saw no message at all, observation failed (a topology the tap could not
mirror): the verdict is ``unknown``, never a silent ``valid``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from functools import lru_cache

from jsonschema import Draft202012Validator

from ..paths import data_dir
from .base import INVALID, UNKNOWN, VALID, Verdict, accepted_attachments, evidence, seed_of, transitions_of

NAME = "message_hygiene"
REQUIREMENTS = ["BE-JOB-002", "BE-JOB-005"]
JOBS_SCHEMA = data_dir("schemas") / "jobs.schema.json"  # the repository's schemas/, or the wheel's copy
# Storage paths an implementation might leak: an object key of ours, a filesystem path.
PATH_MARKERS = ("://", "../", "/tmp/", "/var/", "/home/")
# The file's bytes: the magic numbers of the image types the contract accepts (CONTRACT §3), as they start a file.
IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a")
RAW_MAGIC = ("PNG\r\n\x1a\n", "GIF87a", "GIF89a", "WEBPVP8", "\xff\xd8\xff", "JFIF\x00", "Exif\x00\x00")  # as text
BASE64 = re.compile(r"^[A-Za-z0-9+/_-]{16,}={0,2}$")
HEX = re.compile(r"^(?:[0-9a-fA-F]{2}){8,}$")
# A name that says its value is a credential (in a header, a property or a body field).
CREDENTIAL_NAME = re.compile(r"pass(word|wd)?$|passwd|secret|credential|authori[sz]ation|api[-_]?key|access[-_]?key|"
                             r"(^|[-_.])token$|bearer|private[-_]?key", re.I)


@lru_cache(maxsize=1)
def validator() -> Draft202012Validator:
    """jobs.schema.json with extra fields allowed at the top level (CONTRACT §4: extra fields are additive)."""
    schema = json.loads(JOBS_SCHEMA.read_text(encoding="utf-8"))
    schema = {**schema, "additionalProperties": True}
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def items_in(value, name: str = ""):
    """(field or header name, string value) of every string anywhere in ``value``, nested tables and arrays too."""
    if isinstance(value, str):
        yield name, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield "", str(k)  # a name is judged as text too, never as a credential's name
            yield from items_in(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from items_in(v, name)


def carries_file_bytes(text: str) -> bool:
    """Whether ``text`` is (or starts with) an image file: its magic bytes raw, base64 or hex."""
    if any(marker in text for marker in RAW_MAGIC):
        return True
    compact = text.strip()
    if compact.startswith("data:image/"):
        return True
    candidates = []
    if HEX.match(compact):
        candidates.append(lambda: binascii.unhexlify(compact[:32]))
    if BASE64.match(compact):
        head = compact[:32]
        candidates.append(lambda: base64.b64decode(head + "=" * (-len(head) % 4), altchars=b"-_")
                          if ("-" in head or "_" in head) else base64.b64decode(head + "=" * (-len(head) % 4)))
    for decode in candidates:
        try:
            raw = decode()
        except (binascii.Error, ValueError):
            continue
        if raw.startswith(IMAGE_MAGIC) or (raw[:4] == b"RIFF" and raw[8:12] == b"WEBP"):
            return True
    return False


def given_job_ids(history) -> dict[str, set[str]]:
    """attachment_id -> the job_ids the API's 202 answers to uploads gave the harness (a replay keeps the job_id:
    CONTRACT §4; a replay answering another one is judged apart, see :func:`replay_job_changes`)."""
    out: dict[str, set[str]] = {}
    for e in history.of_type("ok"):
        if e.get("f", "upload") != "replay" and e.get("attachment_id") and e.get("job_id"):
            out.setdefault(e["attachment_id"], set()).add(e["job_id"])
    return out


def replay_job_changes(history, given: dict[str, set[str]]) -> list[dict]:
    """Replay answers whose job_id is not the one the upload's 202 gave (CONTRACT §4: it never changes on replay)."""
    return [evidence("replay answered another job_id than the upload's 202 (a job_id never changes on replay)",
                     attachment_id=e["attachment_id"], job_id=e["job_id"], events=[e],
                     returned=sorted(given[e["attachment_id"]]))
            for e in history.of_type("ok") if e.get("f") == "replay" and e.get("job_id")
            and e.get("attachment_id") in given and e["job_id"] not in given[e["attachment_id"]]]


def claimed(history, final, attachment_id: str) -> bool:
    """Whether a worker claimed the attachment's job at least once (so a message of it reached a consumer)."""
    return any(t.get("to") == "processing" for t in transitions_of(history, final or {}, attachment_id))


def object_keys(final: dict) -> set[str]:
    keys = set()
    for record in (final or {}).get("attachments", {}).values():
        body = record.get("body") or {}
        for item in [body.get("original") or {}] + list(body.get("variants") or []):
            if item.get("key") and "/" in item["key"]:
                keys.add(item["key"])
    return keys


_NEEDLES: dict = {}


def _contained(needles: set[str], text: str) -> list[str]:
    """Every needle that occurs in ``text`` (in the needles' sorted order). Many needles (a long run: thousands of
    object keys against thousands of messages) are found through an index of their first characters, one pass over
    the text, instead of one scan of the text per needle."""
    if len(needles) < 64:
        return [n for n in sorted(needles) if n in text]
    ident = id(needles)
    entry = _NEEDLES.get(ident)
    if entry is None or entry[0] is not needles or entry[1] != len(needles):
        width = max(1, min(len(n) for n in needles))
        index: dict[str, list[str]] = {}
        for n in sorted(needles):
            index.setdefault(n[:width], []).append(n)
        if len(_NEEDLES) >= 4:  # the checker's few needle sets (keys, filenames), never a growing cache
            _NEEDLES.clear()
        entry = _NEEDLES[ident] = (needles, len(needles), width, index)
    _, _, width, index = entry
    hits = set()
    for i in range(len(text) - width + 1):
        for n in index.get(text[i:i + width], ()):
            if text.startswith(n, i):
                hits.add(n)
    return sorted(hits)


def forbidden_content(m: dict, filenames: set[str], keys: set[str]) -> list[tuple[str, str]]:
    """(what, value) for every URL, storage path, client filename, file bytes or credential anywhere in the message:
    one rule set for the body (or its raw text), the headers and every string property."""
    found = []
    where = {"body": m.get("body") if m.get("body") is not None else m.get("body_raw"),
             "properties": m.get("properties") or {}}
    for part, value in where.items():
        for name, text in items_in(value):
            if name and CREDENTIAL_NAME.search(name) and text.strip():
                found.append((f"{part} carries a credential ({name!r})", text))
            if carries_file_bytes(text):
                found.append((f"{part} carries the file's bytes", text))
            if any(marker in text for marker in PATH_MARKERS):
                found.append((f"{part} carries a URL or path", text))
            for key in _contained(keys, text):
                found.append((f"{part} carries a storage object key", text))
            for stem in _contained(filenames, text):
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
    owner_of_202 = {job_id: attachment_id for attachment_id, jobs in given.items() for job_id in jobs}
    problems = replay_job_changes(history, given)
    notes = []
    job_owner: dict[str, tuple[str, dict]] = {}
    named: dict[str, list[dict]] = {}  # attachment_id -> the tapped messages naming it
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
        if attachment_id:
            named.setdefault(attachment_id, []).append(m)
        if job_id in owner_of_202 and attachment_id != owner_of_202[job_id]:
            problems.append(evidence("message names the job_id the 202 gave one attachment with another attachment",
                                     attachment_id=attachment_id, job_id=job_id, events=[m],
                                     job_of=owner_of_202[job_id]))
        if job_id and attachment_id:
            owner = job_owner.setdefault(job_id, (attachment_id, m))
            if owner[0] != attachment_id:
                problems.append(evidence("job_id reused for another attachment", job_id=job_id,
                                         events=[owner[1], m]))
            if attachment_id in given and job_id not in given[attachment_id]:
                problems.append(evidence("message job_id differs from the job_id the API returned for the attachment",
                                         attachment_id=attachment_id, job_id=job_id, events=[m],
                                         returned=sorted(given[attachment_id])))
    # The 202's job_id is the one every message of that job carries: an attachment that was processed, and whose
    # messages the tap saw, carries it on at least one of them. Processed with no message of it seen at all is a gap
    # in observation (a tap that missed a publish), kept as a note, not a finding.
    for attachment_id, jobs in sorted(given.items()):
        if not claimed(history, final, attachment_id):
            continue
        seen = named.get(attachment_id) or []
        if not seen:
            notes.append(evidence("processed, but the tap saw no message naming it", attachment_id=attachment_id,
                                  job_id=sorted(jobs)[0]))
        elif not any((m.get("body") or {}).get("job_id") in jobs for m in seen):
            problems.append(evidence("the job_id of the 202 was never seen on a message of its attachment, though it "
                                     "was processed", attachment_id=attachment_id, job_id=sorted(jobs)[0],
                                     events=seen[:3], carried=sorted({str((m.get("body") or {}).get("job_id"))
                                                                      for m in seen})))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} hygiene violations in {len(messages)} messages",
                       evidence=problems[:50] + notes[:5], seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, f"{len(messages)} tapped messages valid"
                   + (f"; {len(notes)} processed attachments with no message seen" if notes else ""),
                   exercised=bool(messages), evidence=notes[:10], seed=seed_of(run))
