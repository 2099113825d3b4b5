"""Invariant 10 — message hygiene (BE-JOB-002, BE-JOB-005).

Every message seen on the tap validates against schemas/jobs.schema.json;
no string in it is a URL or carries a client filename; a job_id always names
the same attachment; the AMQP message_id, when set, equals the job_id.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from jsonschema import Draft202012Validator

from .base import INVALID, VALID, Verdict, evidence, seed_of

NAME = "message_hygiene"
REQUIREMENTS = ["BE-JOB-002", "BE-JOB-005"]
JOBS_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "jobs.schema.json"


@lru_cache(maxsize=1)
def validator() -> Draft202012Validator:
    schema = json.loads(JOBS_SCHEMA.read_text(encoding="utf-8"))
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def strings_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


def check(history, final, run) -> Verdict:
    messages = history.of_type("message")
    filenames = {e["filename"].rsplit(".", 1)[0] for e in history.of_type("invoke") if e.get("filename")}
    filenames = {f for f in filenames if len(f) >= 6}
    problems = []
    job_owner: dict[str, tuple[str, dict]] = {}
    for m in messages:
        body = m.get("body")
        if not isinstance(body, dict):
            problems.append(evidence("message body is not a JSON object", events=[m], raw=str(m.get("body_raw"))[:200]))
            continue
        errors = sorted(validator().iter_errors(body), key=lambda err: list(err.path))
        if errors:
            problems.append(evidence("message does not validate against jobs.schema.json", job_id=body.get("job_id"),
                                     events=[m], errors=[f"{list(e.path)}: {e.message}" for e in errors[:5]]))
        for text in strings_in(body):
            if "://" in text:
                problems.append(evidence("message carries a URL", job_id=body.get("job_id"), events=[m], value=text))
            for stem in filenames:
                if stem in text:
                    problems.append(evidence("message carries the client filename", job_id=body.get("job_id"),
                                             events=[m], value=text))
        job_id, attachment_id = body.get("job_id"), body.get("attachment_id")
        if job_id and attachment_id:
            owner = job_owner.setdefault(job_id, (attachment_id, m))
            if owner[0] != attachment_id:
                problems.append(evidence("job_id reused for another attachment", job_id=job_id,
                                         events=[owner[1], m]))
        message_id = (m.get("properties") or {}).get("message_id")
        if message_id and job_id and message_id != job_id:
            problems.append(evidence("AMQP message_id differs from job_id", job_id=job_id, events=[m],
                                     message_id=message_id))
    if problems:
        return Verdict(NAME, INVALID, REQUIREMENTS, f"{len(problems)} hygiene violations in {len(messages)} messages",
                       evidence=problems[:50], seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, f"{len(messages)} tapped messages valid", exercised=bool(messages),
                   seed=seed_of(run))
