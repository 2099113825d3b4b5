"""``replay``: once the system is idle, the operator replays every failed attachment (level 4, capability
``replay``), each first without the operator token (must be refused), then with it."""

from __future__ import annotations

from harness import http_clients

ACTION = "replay"
RECORDS = "invoke f=replay per failed attachment, then ok/fail (status, unauthenticated_status, job_id, attempt)"
WEIGHT = 0.5
ONCE = True


def run(ctx, step) -> None:
    if not ctx.wait_trigger({**step, "when": "idle"}, 0.0):
        return
    token = ctx.adapter.operator_token
    failed = [a for a, s in ctx.observer.states.items() if s == "failed"]
    with http_clients.client(base_url=ctx.base_url, timeout=10) as client:
        for attachment_id in failed:
            op = f"replay-{attachment_id[:8]}"
            path = ctx.adapter.replay_path.format(id=attachment_id)
            ctx.history.append("invoke", op=op, f="replay", attachment_id=attachment_id)
            unauth = client.post(path, json={"reason": "harness check"}).status_code
            response = client.post(path, json={"reason": "harness replay"},
                                   headers={"Authorization": f"Bearer {token}"})
            kind = "ok" if response.status_code == 202 else "fail"
            answer = response.json() if kind == "ok" else {}
            ctx.history.append(kind, op=op, f="replay", attachment_id=attachment_id,
                               status=response.status_code, unauthenticated_status=unauth,
                               job_id=answer.get("job_id"), attempt=answer.get("attempt"))
            ctx.observer.poll_one(attachment_id)  # its state moves on now: no stale "failed" ends the drain
    ctx.log(f"replayed {len(failed)} failed attachments")


def allowed(adapter, level: int) -> str | None:
    if level < 4:
        return "operator replay is required from level 4"
    return None if adapter.has("replay") else "the adapter declares no replay capability"


def draw(rng, pick) -> dict:
    return {"action": "replay", "timeout": 150}


def happened(step, history, final) -> tuple[bool, str]:
    done = [e for e in history.of_type("invoke") if e.get("f") == "replay"]
    return bool(done), f"{len(done)} replays requested"
