"""Reading the final state after draining: the API's view of every attachment, S3 objects, queues."""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone

from . import http_clients


def iso_now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def s3_client(env: dict):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=env["S3_ENDPOINT_URL"], aws_access_key_id=env["S3_ACCESS_KEY"],
                        aws_secret_access_key=env["S3_SECRET_KEY"], region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=10,
                                      retries={"max_attempts": 2}, request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required"))


def utc_text(moment) -> str:
    """An object store's timestamp as the history writes it: ISO 8601 in UTC with a ``Z``."""
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def missing_or_error(exc: Exception) -> dict:
    """A failed GET or HEAD of one object: absent (``exists`` False), or not known (``exists`` None, the error)."""
    code = str(getattr(exc, "response", {}).get("Error", {}).get("Code"))
    if code in ("NoSuchKey", "404", "NotFound"):
        return {"exists": False}
    return {"exists": None, "error": repr(exc)[:200]}


def read_object(s3, bucket: str, key: str) -> dict:
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
    except Exception as exc:
        return missing_or_error(exc)
    data = response["Body"].read()
    return {"exists": True, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
            "last_modified": utc_text(response["LastModified"]),
            "etag": response.get("ETag"), "version_id": response.get("VersionId")}


def list_bucket(s3, bucket: str) -> list[dict]:
    out, token = [], None
    while True:
        kwargs = {"Bucket": bucket, **({"ContinuationToken": token} if token else {})}
        page = s3.list_objects_v2(**kwargs)
        for item in page.get("Contents", []):
            out.append({"key": item["Key"], "size": item["Size"],
                        "last_modified": utc_text(item["LastModified"])})
        if not page.get("IsTruncated"):
            return out
        token = page.get("NextContinuationToken")


READ_RETRY_PAUSES = (1.0, 3.0)  # seconds before the second and the third try of one attachment's read
PARALLEL_FROM = 50  # attachments; a catalogue scenario's few are read one after another, as always
READERS = 8


def read_final(base_url: str, attachment_ids: list[str], s3_env: dict, tap=None, events: bool = True,
               vocabulary=None, events_reader=None) -> dict:
    """The API's view of every attachment (status and events, through the adapter's paths and state names, or its
    [events] sql reader, which this closes), their objects, the bucket and the queues."""
    from .vocabulary import DEFAULT

    words = vocabulary or DEFAULT
    try:
        return _read_final(base_url, attachment_ids, s3_env, tap, events, words, events_reader)
    finally:
        if events_reader is not None:
            events_reader.close()


def _read_final(base_url, attachment_ids, s3_env, tap, events, words, events_reader) -> dict:
    final = {"read_ok": True, "errors": [], "attachments": {}, "read_at": iso_now()}
    s3 = s3_client(s3_env)
    bucket = s3_env["S3_BUCKET"]
    with http_clients.client(base_url=base_url, timeout=10) as client:
        def read_api(attachment_id: str) -> dict:
            record: dict = {"status": None}
            response = client.get(words.status_path(attachment_id))
            record["status"] = response.status_code
            if response.status_code >= 500:
                raise RuntimeError(f"GET {words.status_path(attachment_id)} answered {response.status_code}")
            record["body"] = words.body(response.json()) if response.status_code == 200 else None
            if events and response.status_code == 200:
                reported = (events_reader.read(attachment_id) if events_reader is not None else
                            client.get(words.events_path(attachment_id)).json().get("events", []))
                record["events"] = [words.event(e) for e in reported]
            return record

        def read_one(attachment_id: str) -> tuple[dict, str | None]:
            # A read is tried again after a pause: one refused connection or timeout on a loaded machine (an API
            # restarted by the scenario moments before) made a whole run's final state unreadable, so unknown.
            for pause in READ_RETRY_PAUSES + (None,):
                try:
                    record = read_api(attachment_id)
                    break
                except Exception as exc:
                    if pause is None:
                        return {"status": None}, f"{attachment_id}: {exc!r}"
                    final.setdefault("read_retries", []).append(f"{attachment_id}: {exc!r}")
                    time.sleep(pause)
            objects = {}
            body = record.get("body") or {}
            version_items = [x for v in body.get("versions") or [] if isinstance(v, dict)  # level 5
                             for x in v.get("variants") or [] if isinstance(x, dict)]
            for item in [body.get("original") or {}] + list(body.get("variants") or []) + version_items:
                if item.get("key") and item["key"] not in objects:
                    objects[item["key"]] = read_object(s3, bucket, item["key"])
            record["objects"] = objects
            return record, None

        # A long run (thousands of attachments, each two GETs and its objects) is read by a few threads; the
        # records keep the attachments' order either way.
        if len(attachment_ids) > PARALLEL_FROM:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(READERS) as pool:
                outcomes = list(pool.map(read_one, attachment_ids))
        else:
            outcomes = [read_one(a) for a in attachment_ids]
        for attachment_id, (record, error) in zip(attachment_ids, outcomes):
            if error is not None:
                final["read_ok"] = False
                final["errors"].append(error)
            final["attachments"][attachment_id] = record
    try:
        final["bucket_objects"] = list_bucket(s3, bucket)
    except Exception as exc:
        final["bucket_objects"] = None
        final["errors"].append(f"bucket listing: {exc!r}")
    if tap is not None:
        try:
            final["queues"] = tap.sample()
            if tap.dead_letter_queue:
                from .broker import payload_bytes

                final["dead_letters"] = [
                    {"routing_key": m.get("routing_key"), "payload": m.get("payload", "")[:2000],
                     "payload_encoding": m.get("payload_encoding"),
                     "sha256": hashlib.sha256(payload_bytes(m)).hexdigest(),
                     "message_id": (m.get("properties") or {}).get("message_id")}
                    for m in tap.m.get(tap.dead_letter_queue, 50, requeue=True)]
        except Exception as exc:
            final["errors"].append(f"queues: {exc!r}")
    return final


def staging_retention_wait(history_path, timings: dict, checks, now_wall: float, cap: float = 30.0) -> float:
    """How long the final read waits so that the staged original of every upload try that got no 202 (a crash
    between staging and the record, a refusal, an unknown outcome) has outlived the declared staging retention plus
    its grace: only in a scenario relying on ``staging_safety``, at most ``cap`` seconds (staging_safety says
    ``unknown`` for an orphan still younger at the read). 0 when nothing needs it or the timing is not declared."""
    import json

    from .checkers.staging_safety import NAME, grace_of

    grace = grace_of(timings or {})
    if NAME not in (checks or ()) or grace is None:
        return 0.0
    last = None
    try:
        with open(history_path, encoding="utf-8") as lines:
            for line in lines:
                event = json.loads(line)
                if event.get("type") in ("fail", "info") and event.get("f") in ("upload", "idempotency"):
                    last = max(last or 0.0, float(event.get("wall") or 0.0))
    except (OSError, ValueError):
        return 0.0
    if last is None:
        return 0.0
    return max(0.0, min(cap, last + grace + 1.0 - now_wall))
