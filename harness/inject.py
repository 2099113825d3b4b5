"""Messages no consumer can process, injected by the harness into the work queue (scenario fault ``inject``).

Each is published to the default exchange with the work queue's name as routing key, which reaches the work queue
whatever the implementation's own topology (CONTRACT §4, §10), and carries a marker of its own — its AMQP
``message_id`` and, where the body has room, inside the body — so a checker can follow it: onto the work queue
(the tap), to a consumer (the firehose's deliveries) and into the dead-letter queue. Kinds:

* ``not_json`` — text that is not JSON at all;
* ``schema_invalid`` — a JSON object that fails ``schemas/jobs.schema.json`` (no valid ids, attempt 0);
* ``unknown_job`` — a well-formed message (a copy of a real one, same shape) naming a job and an attachment that
  do not exist.

None of them names an accepted attachment: they cannot touch the work the uploads asked for.
"""

from __future__ import annotations

import hashlib
import json
import random

from .seeding import seeded_uuid

KINDS = ("not_json", "schema_invalid", "unknown_job")


def build(kind: str, marker: str, template: dict | None, rng: random.Random) -> tuple[str | None, dict | None]:
    """(raw text, parsed body or None) of one injected message; (None, None) when it cannot be built (an
    ``unknown_job`` needs a real message to copy the shape of)."""
    if kind == "not_json":
        return f"{marker}: this is not JSON {{\"job_id\": ", None
    if kind == "schema_invalid":
        body = {"schema_version": (template or {}).get("schema_version", 1), "job_id": marker, "attempt": 0,
                "attachment_id": marker, "variants": "all"}
        return json.dumps(body), body
    if kind == "unknown_job":
        if not isinstance(template, dict):
            return None, None
        # Only the ids change: every other field keeps the value and the shape the implementation itself produces.
        body = {**template, "job_id": seeded_uuid(rng), "attachment_id": seeded_uuid(rng)}
        return json.dumps(body), body
    raise ValueError(f"unknown injected message kind {kind!r}")


def digest(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def properties(marker: str, body: dict | None) -> dict:
    return {"message_id": marker, "delivery_mode": 2,
            "content_type": "application/json" if body is not None else "text/plain"}
