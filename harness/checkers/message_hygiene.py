"""Invariant 10 — message hygiene (BE-JOB-002, BE-JOB-005).

Every message the tap saw reach the work queue carries the fields of schemas/jobs.schema.json, valid (extra fields
are allowed: the contract grows additively); nothing anywhere in it — body, headers or properties — is a storage
location, the client's filename, the file's bytes (an image's magic bytes, raw, base64 or hex) or a credential — one
rule set for the body, the headers and the string properties, judged by values, never by names:

* a storage location is any object key the harness saw written (the object watcher's history, the final read of
  every attachment, the final bucket listing: flat keys and staging keys later moved too), the run's bucket, the S3
  endpoint's host:port, a URL of a storage scheme (``s3://``, ``file://``…), of that endpoint, presigned, or naming
  a file (an image extension), and a filesystem path; a URI that names none of these (a CloudEvents ``source``, a
  schema URL) is an identifier;
* a credential is a secret the harness knows (the tenant's passwords and S3 keys, the operator token: kept in
  run.json as hashes only, see :func:`storage_record`), URL userinfo, or a ``Bearer``/``Basic`` value. A field named
  ``fencing_token`` or ``x-dedup-token`` is service data. Its ``job_id`` is the one the 202 gave for that attachment (CONTRACT
§4: it never changes on redelivery, retry or replay, so a replay answering another job_id is a finding too); the 202's
job_id names no other attachment; and an attachment that was processed and whose messages the tap saw carries its
202's job_id on at least one of them. A job_id never names two attachments. The AMQP ``message_id`` is free, and so
are extra fields and headers that carry identifiers or service data.

When uploads were accepted but the tap saw no message at all, observation failed (a topology the tap could not
mirror): the verdict is ``unknown``, never a silent ``valid``; when the tap recorded publishes the broker routed to
no queue (``unroutable``), the reason says so instead: the implementation's topology, not the observation, failed.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import base64
import binascii
import hashlib
import json
import re
import urllib.parse
from functools import lru_cache

from jsonschema import Draft202012Validator

from ..paths import data_dir
from ..history import History
from .base import (
    INVALID,
    UNKNOWN,
    VALID,
    Verdict,
    accepted_attachments,
    evidence,
    seed_of,
    transitions_of, FinalState, RunInfo)

NAME = "message_hygiene"
REQUIREMENTS = ["BE-JOB-002", "BE-JOB-005"]
ALWAYS_COUNTED = True  # its unknown (no message seen) counts everywhere
JOBS_SCHEMA = data_dir("schemas") / "jobs.schema.json"  # the repository's schemas/, or the wheel's copy
# Filesystem paths an implementation might leak (URLs are judged by what they point at: :func:`url_problems`).
PATH_MARKERS = ("../", "/tmp/", "/var/", "/home/", "file:")
URL = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*)://([^\s/?#\"'<>]*)([^\s\"'<>]*)")
STORAGE_SCHEMES = frozenset({"s3", "s3a", "s3n", "gs", "gcs", "az", "abfs", "abfss", "wasb", "wasbs", "minio",
                             "file", "swift", "oss", "cos", "hdfs"})
FILE_EXTENSION = re.compile(r"\.(png|jpe?g|gif|webp|bmp|tiff?|heic|avif|bin|dat|raw|img)$", re.IGNORECASE)
PRESIGNED = re.compile(r"x-amz-(signature|credential)|[?&](signature|awsaccesskeyid|x-goog-signature)=", re.IGNORECASE)
AUTH_VALUE = re.compile(r"^\s*(bearer|basic)\s+\S{6,}", re.IGNORECASE)
TOKEN_SPLIT = re.compile(r"[\s:@/=,;&?\"'<>()\[\]{}]+")
KEY_CHAR = re.compile(r"[A-Za-z0-9._/-]")
MIN_NEEDLE = 6  # a shorter key or bucket name would match ordinary words
# The file's bytes: the magic numbers of the image types the contract accepts (CONTRACT §3), as they start a file.
IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a")
RAW_MAGIC = ("PNG\r\n\x1a\n", "GIF87a", "GIF89a", "WEBPVP8", "\xff\xd8\xff", "JFIF\x00", "Exif\x00\x00")  # as text
BASE64 = re.compile(r"^[A-Za-z0-9+/_-]{16,}={0,2}$")
HEX = re.compile(r"^(?:[0-9a-fA-F]{2}){8,}$")


@lru_cache(maxsize=1)
def validator() -> Draft202012Validator:
    """jobs.schema.json with extra fields allowed at the top level (CONTRACT §4: extra fields are additive)."""
    schema = json.loads(JOBS_SCHEMA.read_text(encoding="utf-8"))
    schema = {**schema, "additionalProperties": True}
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def items_in(value: Any, name: str = "") -> Iterator[tuple[str, str]]:
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
    candidates: list[Callable[[], bytes]] = []
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


def given_job_ids(history: History) -> dict[str, set[str]]:
    """attachment_id -> the job_ids the API's 202 answers to uploads gave the harness (a replay keeps the job_id:
    CONTRACT §4; a replay answering another one is judged apart, see :func:`replay_job_changes`)."""
    out: dict[str, set[str]] = {}
    for e in history.of_type("ok"):
        if e.get("f", "upload") != "replay" and e.get("attachment_id") and e.get("job_id"):
            out.setdefault(e["attachment_id"], set()).add(e["job_id"])
    return out


def replay_job_changes(history: History, given: dict[str, set[str]]) -> list[dict[str, Any]]:
    """Replay answers whose job_id is not the one the upload's 202 gave (CONTRACT §4: it never changes on replay)."""
    return [evidence("replay answered another job_id than the upload's 202 (a job_id never changes on replay)",
                     attachment_id=e["attachment_id"], job_id=e["job_id"], events=[e],
                     returned=sorted(given[e["attachment_id"]]))
            for e in history.of_type("ok") if e.get("f") == "replay" and e.get("job_id")
            and e.get("attachment_id") in given and e["job_id"] not in given[e["attachment_id"]]]


def claimed(history: History, final: FinalState, attachment_id: str) -> bool:
    """Whether a worker claimed the attachment's job at least once (so a message of it reached a consumer)."""
    return any(t.get("to") == "processing" for t in transitions_of(history, final or {}, attachment_id))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def storage_record(env: dict[str, Any], operator_token: str | None = None, *more_envs: dict[str, Any]) -> dict[str, Any]:
    """What run.json keeps for this checker of the storage and secrets a run's roles were given: the bucket, the S3
    endpoints' host:port (the proxied one the roles use, the direct one), and the sha256 of every secret (the S3
    keys, the passwords in the database and broker URLs, the operator token) — never a secret in clear."""
    secrets, endpoints, bucket = set(), [], None
    for e in (env, *more_envs):
        bucket = bucket or e.get("S3_BUCKET")
        for name in ("S3_ENDPOINT_URL",):
            netloc = urllib.parse.urlsplit(e.get(name) or "").netloc.rsplit("@", 1)[-1]
            if netloc and netloc not in endpoints:
                endpoints.append(netloc)
        if e.get("S3_SECRET_KEY"):  # the access key is an identifier, the secret key is the secret
            secrets.add(e["S3_SECRET_KEY"])
        for name in ("DATABASE_URL", "AMQP_URL", "AMQP_URLS"):
            for url in (e.get(name) or "").split(","):
                parts = urllib.parse.urlsplit(url.strip())
                # A password equal to its user name is no secret a message could leak (AMQP user_id is that name).
                if parts.password and parts.password != parts.username:
                    secrets.add(urllib.parse.unquote(parts.password))
    if operator_token:
        secrets.add(operator_token)
    return {"bucket": bucket, "endpoints": endpoints,
            "secret_sha256": sorted(_digest(x) for x in secrets if len(x) >= 4)}


def object_keys(final: FinalState, history: History | None = None) -> set[str]:
    """Every object key the harness saw: named by the final read (original, variants, versions), in the final bucket
    listing, and written during the run (the object watcher's history: keys later moved or removed too)."""
    keys = set()
    for record in (final or {}).get("attachments", {}).values():
        body = record.get("body") or {}
        version_items = [x for v in body.get("versions") or [] if isinstance(v, dict)
                         for x in v.get("variants") or [] if isinstance(x, dict)]
        for item in [body.get("original") or {}] + list(body.get("variants") or []) + version_items:
            if isinstance(item, dict) and isinstance(item.get("key"), str):
                keys.add(item["key"])
        keys.update(k for k in (record.get("objects") or {}) if isinstance(k, str))
    keys.update(o["key"] for o in (final or {}).get("bucket_objects") or [] if isinstance(o, dict)
                and isinstance(o.get("key"), str))
    if history is not None:
        keys.update(e["key"] for e in history.of_type("object") if isinstance(e.get("key"), str))
    return keys


def storage_of(history: History, run: dict[str, Any]) -> dict[str, Any]:
    """The run's bucket and S3 endpoints (run.json's ``storage``, else the object watcher's start) and secrets."""
    record = dict(run.get("storage") or {})
    if not record.get("bucket"):
        record["bucket"] = next((e.get("bucket") for e in history.of_type("phase")
                                 if e.get("name") == "object_watch_start" and e.get("bucket")), None)
    return record


def location_needles(keys: set[str], identifiers: set[str], free_words: set[str]) -> set[str]:
    """The keys worth searching for: long enough to be no ordinary word, and not an identifier the message must
    carry anyway (an implementation may store an object under its attachment_id) nor a word of the contract (a
    variant's name)."""
    return {k for k in keys if len(k) >= MIN_NEEDLE and k not in identifiers and k.lower() not in free_words}


def _bounded(needle: str, text: str) -> bool:
    """Whether ``needle`` occurs in ``text`` as a whole key (not inside a longer key-like word)."""
    start = text.find(needle)
    while start >= 0:
        end = start + len(needle)
        before = text[start - 1] if start else ""
        after = text[end] if end < len(text) else ""
        if not (before and KEY_CHAR.match(before) and before not in "/") and \
                not (after and KEY_CHAR.match(after) and after not in "/."):
            return True
        start = text.find(needle, start + 1)
    return False


def _endpoint_in(endpoint: str, text: str) -> bool:
    start = text.find(endpoint)
    while start >= 0:
        after = text[start + len(endpoint):start + len(endpoint) + 1]
        if not after.isdigit():
            return True
        start = text.find(endpoint, start + 1)
    return False


def url_problems(text: str, endpoints: list[str]) -> list[str]:
    """What each URL in ``text`` is, when it is a storage location or carries a credential: a storage scheme, the S3
    endpoint, a presigned query, a file (image extension), userinfo. Any other URI is an identifier."""
    found = []
    for match in URL.finditer(text):
        scheme, authority, rest = match.group(1).lower(), match.group(2), match.group(3)
        if "@" in authority and ":" in authority.split("@", 1)[0]:
            found.append("credential (URL userinfo)")
        host = authority.rsplit("@", 1)[-1]
        path = urllib.parse.urlsplit("x://h" + rest).path
        if scheme in STORAGE_SCHEMES:
            found.append(f"storage location ({scheme}:// URL)")
        elif host and any(host == e or host.endswith("." + e) for e in endpoints):
            found.append("storage endpoint (a URL of the S3 endpoint)")
        elif PRESIGNED.search(rest):
            found.append("storage location (a presigned URL)")
        elif FILE_EXTENSION.search(path):
            found.append("storage location (a URL of a file)")
    return found


def secret_in(text: str, secret_digests: frozenset[str]) -> bool:
    if not secret_digests:
        return False
    if _digest(text) in secret_digests or _digest(text.strip()) in secret_digests:
        return True
    return any(_digest(part) in secret_digests for part in TOKEN_SPLIT.split(text) if len(part) >= 4)


_NEEDLES: dict[int, tuple[set[str], int, int, dict[str, list[str]]]] = {}


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


def forbidden_content(m: dict[str, Any], filenames: set[str], keys: set[str], storage: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(what, value) for every storage location, client filename, file bytes or credential anywhere in the message:
    one rule set for the body (or its raw text), the headers and every string property, judged by values."""
    storage = storage or {}
    bucket = storage.get("bucket") if len(storage.get("bucket") or "") >= MIN_NEEDLE else None
    endpoints = list(storage.get("endpoints") or [])
    secrets = frozenset(storage.get("secret_sha256") or ())
    found = []
    where = {"body": m.get("body") if m.get("body") is not None else m.get("body_raw"),
             "properties": m.get("properties") or {}}
    for part, value in where.items():
        for _name, text in items_in(value):
            if AUTH_VALUE.match(text) or secret_in(text, secrets):
                found.append((f"{part} carries a credential", text))
            if carries_file_bytes(text):
                found.append((f"{part} carries the file's bytes", text))
            if any(marker in text for marker in PATH_MARKERS):
                found.append((f"{part} carries a filesystem path", text))
            for what in url_problems(text, endpoints):
                found.append((f"{part} carries a {what}", text))
            if any(_endpoint_in(e, text) for e in endpoints):
                found.append((f"{part} carries the storage endpoint's host:port", text))
            if bucket and _bounded(bucket, text):
                found.append((f"{part} carries the storage bucket's name", text))
            if any(_bounded(key, text) for key in _contained(keys, text)):
                found.append((f"{part} carries a storage object key", text))
            for _stem in _contained(filenames, text):
                found.append((f"{part} carries the client filename", text))
    return found


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    from .dead_letter import injected_as, injections

    # Messages the harness injected itself (scenario fault ``inject``: unprocessable on purpose) are not the
    # implementation's: dead_letter judges what becomes of them.
    injected = injections(history)
    messages = [m for m in history.of_type("message") if not injected or injected_as(m, injected) is None]
    accepted = accepted_attachments(history)
    if accepted and not messages:
        observed = history.of_type("observe")
        mirrored = [e for e in observed if e.get("source") == "binding"]
        dropped = history.of_type("unroutable")
        if dropped:
            # Not the tap's failure: the implementation published into no queue (lost_accepted_work names it).
            return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                           f"{len(accepted)} uploads accepted and no message reached the work queue: the broker "
                           f"routed {len(dropped)} publish(es) to no queue (unroutable: the topology did not exist "
                           "when they were published, docs/CONTRACT.md §4); no message to judge, hygiene not judged",
                           evidence=[evidence("publishes routed to no queue", events=dropped[:5])], seed=seed_of(run))
        return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                       f"{len(accepted)} uploads accepted but the tap saw no message reach the work queue "
                       f"({len(mirrored)} bindings mirrored, firehose {'on' if any(e.get('firehose') for e in observed) else 'off'}): "
                       "observation failed, hygiene not judged",
                       evidence=[evidence("what the tap mirrored", events=observed[:5])], seed=seed_of(run))
    filenames = {e["filename"].rsplit(".", 1)[0] for e in history.of_type("invoke") if e.get("filename")}
    filenames = {f for f in filenames if len(f) >= 6}
    given = given_job_ids(history)
    identifiers = set(given) | {j for jobs in given.values() for j in jobs} | {
        str(v) for m in messages if isinstance(m.get("body"), dict)
        for v in (m["body"].get("job_id"), m["body"].get("attachment_id")) if v}
    variants = {str(v).lower() for m in messages if isinstance(m.get("body"), dict)
                for v in m["body"].get("variants") or [] if isinstance(v, (str, int))}
    keys = location_needles(object_keys(final, history), identifiers, variants)
    storage = storage_of(history, run)
    owner_of_202 = {job_id: attachment_id for attachment_id, jobs in given.items() for job_id in jobs}
    problems = replay_job_changes(history, given)
    notes = []
    job_owner: dict[str, tuple[str, dict[str, Any]]] = {}
    named: dict[str, list[dict[str, Any]]] = {}  # attachment_id -> the tapped messages naming it
    for m in messages:
        body = m.get("body")
        for what, value in forbidden_content(m, filenames, keys, storage):
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
