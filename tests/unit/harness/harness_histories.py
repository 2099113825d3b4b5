"""Builders of hand-made histories and final states for checker tests."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from harness.history import History

T0 = 1_800_000_000.0
ATT = "5f1d2c3b-8a9e-4b7c-9d0e-1f2a3b4c5d6e"
JOB = "0b7e7c52-3f0e-4a52-9a57-6d2b7c1f9e01"


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


class Builder:
    """Appends history events at explicit wall times (seconds after T0) and collects the final state."""

    def __init__(self, level=4, lease=4, max_attempts=5, scenario=None, roles=None):
        self.events: list[dict] = []
        self.attachments: dict[str, dict] = {}
        self.run = {
            "seed": 42, "level": level,
            "scenario": scenario or {"name": "hand-made", "checks": {}},
            "adapter": {"name": "fake", "level": level,
                        "timings": {"lease_seconds": lease, "max_attempts": max_attempts, "retry_cap_seconds": 2,
                                    "staging_retention_seconds": 5, "sweep_interval_seconds": 1},
                        "roles": roles or {"api": 1, "relay": 1, "worker": 1, "sweeper": 1}},
        }
        # What adapter.summary() records: the roles flagged consumer / recovers_work (defaults by name).
        self.run["adapter"]["consumers"] = [r for r in self.run["adapter"]["roles"] if r == "worker"]
        self.run["adapter"]["recovers_work"] = [r for r in self.run["adapter"]["roles"] if r == "sweeper"]
        self.final = {"read_ok": True, "attachments": self.attachments, "queues": {"work": {"ready": 0, "unacked": 0}},
                      "bucket_objects": [], "read_at": iso(T0 + 1000)}

    def add(self, at: float, type_: str, **fields) -> dict:
        event = {"seq": len(self.events) + 1, "t": at, "wall": T0 + at, "type": type_, **fields}
        event["line"] = event["seq"]
        self.events.append(event)
        return event

    def upload(self, at, attachment_id=ATT, job_id=JOB, kind="good", op=None):
        op = op or f"u{len(self.events)}"
        self.add(at, "invoke", op=op, f="upload", kind=kind, sample=op, filename="holiday-0000abcd.png")
        self.add(at + 0.05, "ok", op=op, f="upload", status=202, attachment_id=attachment_id, job_id=job_id)

    def transitions(self, attachment_id, steps, variants=("thumbnail", "crop", "optimized"), error_code=None,
                    objects=True):
        """steps: [(at, from, to, attempt, actor)] -> final events + GET body (state = last to)."""
        events = []
        for seq, (at, frm, to, attempt, actor) in enumerate(steps, start=1):
            events.append({"seq": seq, "at": iso(T0 + at), "from": frm, "to": to, "attempt": attempt,
                           "reason": None, "actor": actor})
            self.add(at + 0.2, "transition", attachment_id=attachment_id, event_seq=seq, **{"from": frm, "to": to},
                     attempt=attempt, actor=actor, at_server=iso(T0 + at))
        state = steps[-1][2]
        ready_at = next((s[0] for s in steps if s[2] == "ready"), steps[-1][0])
        variant_list = [{"name": v, "key": f"variants/{attachment_id}/1/{v}", "sha256": "ab" * 32, "size": 10,
                         "content_type": "image/webp"} for v in (variants if state == "ready" else ())]
        body = {"attachment_id": attachment_id, "state": state, "pipeline_version": 1,
                "attempt": max(s[3] for s in steps), "error_code": error_code,
                "original": {"key": f"staging/{attachment_id}", "sha256": "cd" * 32, "size": 99,
                             "content_type": "image/png"},
                "variants": variant_list, "created_at": iso(T0 + steps[0][0]), "updated_at": iso(T0 + steps[-1][0])}
        objs = {}
        if objects:
            objs[body["original"]["key"]] = {"exists": True, "sha256": "cd" * 32, "size": 99,
                                             "last_modified": iso(T0 + steps[0][0])}
            for v in variant_list:
                objs[v["key"]] = {"exists": True, "sha256": v["sha256"], "size": 10, "last_modified": iso(T0 + ready_at - 0.5)}
        self.attachments[attachment_id] = {"status": 200, "body": body, "events": events, "objects": objs}
        return body

    def history(self) -> History:
        return History(tuple(self.events))


def job_message(job_id=JOB, attachment_id=ATT, **overrides) -> dict:
    body = {"schema_version": 1, "job_id": job_id, "attempt": 1, "attachment_id": attachment_id,
            "pipeline_version": 1, "variants": ["thumbnail", "crop", "optimized"],
            "created_at": "2026-11-29T12:00:00Z", "expires_at": "2026-11-30T12:00:00Z"}
    body.update(overrides)
    return body


def happy(at=0.0, attachment_id=ATT, builder=None):
    b = builder or Builder()
    job_id = JOB if attachment_id == ATT else str(uuid.uuid5(uuid.NAMESPACE_URL, attachment_id))
    b.upload(at, attachment_id, job_id=job_id)
    b.add(at + 0.15, "message", body=job_message(job_id, attachment_id), properties={})
    b.transitions(attachment_id, [(at + 0.1, None, "queued", 1, "api"), (at + 1, "queued", "processing", 1, "worker"),
                                  (at + 2, "processing", "ready", 1, "worker")])
    return b


def in_memory_dedup_history_for_recheck():
    """Ready, then a redelivery after a crash between commit and ack re-runs the job: ready twice."""
    b = Builder()
    b.upload(0, ATT)
    b.add(2.5, "fault", action="crash", phase="hit", role="worker", window="after_commit_before_ack")
    b.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                        (2, "processing", "ready", 1, "worker"), (4, "ready", "processing", 1, "worker"),
                        (5, "processing", "ready", 1, "worker")])
    return b
