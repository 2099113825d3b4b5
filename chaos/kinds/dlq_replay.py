"""``dlq_replay``: a real job's message reaches the dead-letter queue, and the operator replays it — twice.

Needs ``[broker] dead_letter_queue`` and ``[admin] dlq_replay_path`` (capability ``dlq_replay``). While the
consumers are held (a ``hold`` of ``@consumers`` from before the workload), the first job message of the work queue
is taken off it (management API get, no requeue) and published unchanged into the declared dead-letter queue,
through the default exchange: what a delivery limit leaves there (the broker keeps the body and properties). The
job is then ``queued`` with no message in flight. Once every other upload is terminal (or the step's timeout),
the operator replays the job's dead letters through ``dlq_replay_path`` (``{job_id}``): first without the operator
token (must be refused), then with it, then with it once more (idempotent: a 2xx that does nothing). With
``dlq_replay_all_path`` declared, one replay of every dead letter follows (unmappable ones must stay).
"""

from __future__ import annotations

import json
import time

import httpx

from harness import http_clients

ACTION = "dlq_replay"
RECORDS = ("fault action=dlq_replay phase=move (job_id, attachment_id, moved) | phase=skip (why); "
           "invoke/ok/fail f=dlq_replay per request (scope, status, unauthenticated_status; the invoke: state_before)")
TERMINAL = ("ready", "failed")


def _job_message(ctx) -> dict | None:
    """The head message of the work queue when it is one of ours (its body names an accepted attachment, as
    jobs.schema.json requires), taken off the queue."""
    queue = ctx.adapter.broker["work_queue"]
    for _ in range(100):
        taken = ctx.broker.management.get(queue, 1, requeue=False)
        if not taken:
            time.sleep(0.05)
            continue
        message = taken[0]
        try:
            body = json.loads(message.get("payload") or "") if message.get("payload_encoding") == "string" else None
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else {}
        if body.get("job_id") and body.get("attachment_id") in ctx.observer.ids:
            return {**message, "job_id": str(body["job_id"]), "attachment_id": str(body["attachment_id"])}
        # Not ours (a message the harness injected, say): back to the queue, unchanged.
        ctx.broker.management.publish("", queue, message.get("payload") or "", message.get("properties") or {})
        time.sleep(0.05)
    return None


def prepare(ctx, step) -> None:
    # Roles named by ``hold`` (the scenario: ``@recovers_work``) stay down from before the workload until the replay
    # was asked for: a safety net that republishes a queued job's lost message would otherwise finish the job first,
    # and the replay would revive nothing.
    if step.get("hold"):
        ctx.hold(step)


def run(ctx, step) -> None:
    try:
        _move_and_replay(ctx, step)
    finally:
        ctx.release(step)


def _move_and_replay(ctx, step) -> None:
    dlq = (ctx.adapter.broker or {}).get("dead_letter_queue")
    admin = ctx.adapter.raw.get("admin") or {}
    path, all_path = admin.get("dlq_replay_path"), admin.get("dlq_replay_all_path")
    if not dlq or not path:
        ctx.history.append("fault", action=ACTION, phase="skip", fault=step["index"],
                           why="the adapter declares no [broker] dead_letter_queue or no [admin] dlq_replay_path")
        return
    if not ctx.wait_trigger(step, 0.0):
        return
    deadline = time.monotonic() + float(step.get("timeout", 40))
    moved = _job_message(ctx)
    if moved is None:
        ctx.history.append("fault", action=ACTION, phase="skip", fault=step["index"],
                           why="no message of an accepted job could be taken off the work queue")
        return
    routed = ctx.broker.management.publish("", dlq, moved.get("payload") or "", moved.get("properties") or {})
    ctx.history.append("fault", action=ACTION, phase="move", fault=step["index"], job_id=moved["job_id"],
                       attachment_id=moved["attachment_id"], queue=dlq, routed=routed,
                       message_id=(moved.get("properties") or {}).get("message_id"))
    attachment_id = moved["attachment_id"]
    while time.monotonic() < deadline and not ctx.stopping.is_set():  # the rest of the work first
        states = ctx.observer.states
        others = [a for a in ctx.observer.ids if a != attachment_id]
        if ctx.workload_done.is_set() and all(states.get(a) in TERMINAL for a in others):
            break
        time.sleep(0.1)
    token = ctx.adapter.operator_token
    auth = {"Authorization": f"Bearer {token}"}
    with http_clients.client(base_url=ctx.base_url, timeout=30) as client:
        requests = [("job", path.format(job_id=moved["job_id"]), 1), ("job", path.format(job_id=moved["job_id"]), 2)]
        if all_path:
            requests.append(("all", all_path, 1))
        for n, (scope, url, round_) in enumerate(requests):
            op = f"dlq-replay-{n}"
            ctx.history.append("invoke", op=op, f="dlq_replay", scope=scope, round=round_, job_id=moved["job_id"],
                               attachment_id=attachment_id, state_before=ctx.observer.states.get(attachment_id))
            unauth = client.post(url, json={"reason": "harness check"}).status_code if n == 0 else None
            try:
                response = client.post(url, json={"reason": f"harness dead-letter replay {n + 1}"}, headers=auth)
                status, text = response.status_code, response.text[:2000]
            except httpx.HTTPError as exc:
                status, text = None, f"{type(exc).__name__}: {exc}"
            kind = "ok" if status is not None and 200 <= status < 300 else "fail"
            ctx.history.append(kind, op=op, f="dlq_replay", scope=scope, round=round_, job_id=moved["job_id"],
                               attachment_id=attachment_id, status=status, unauthenticated_status=unauth,
                               answer=text)
            ctx.observer.poll_one(attachment_id)
    ctx.log(f"dead-lettered the message of job {moved['job_id']} and replayed it {len(requests)} times")


WEIGHT = 0.3
ONCE = True


def allowed(adapter, level: int) -> str | None:
    # Never drawn by `harness soak`: the move needs every consumer held from before the workload and the rest of the
    # work done first, which a random schedule does not give (scenario dead-letter-replay runs it).
    return "needs the consumers held from before the workload: scenario dead-letter-replay only"


def draw(rng, pick) -> dict:
    """The scenario's step, for a schedule that holds the consumers itself (soak never draws it: ``allowed``)."""
    return {"action": ACTION, "when": "message", "timeout": 40, "hold": ["@recovers_work"]}


def happened(step, history, final) -> tuple[bool, str]:
    moved = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "move"
             and e.get("routed")]
    asked = [e for e in history.of_type("invoke") if e.get("f") == "dlq_replay"]
    return bool(moved and asked), f"{len(moved)} job messages dead-lettered, {len(asked)} replays requested"
