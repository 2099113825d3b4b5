"""``reprocess`` (level 5): at the trigger, the operator asks for attachments to be processed for pipeline version
``params.version`` through the adapter's ``[versions] reprocess_path``: ``params.count`` of them (default all, drawn
with the run's seed) among those whose observed state is in ``params.states`` (default ``["ready"]``). Each is asked
first without the operator token (must be refused), then with it (202: a new job for that version), then once more
(idempotent: 200 or 202 with the same job). Then the step waits (at most its timeout) until each asked version is
terminal in the API's ``versions[]`` (not with ``params.wait = false``) — or, with ``params.then_stop``, until ``params.stop_after_ready`` (default 1) of
them are ready, and then stops that version's consumers (a rollback, as ``stop_version``)."""

from __future__ import annotations

import random
import time

from harness import http_clients

from . import first_delay
from .start_version import allowed, stop  # noqa: F401 - allowed is this kind's too

ACTION = "reprocess"
RECORDS = ("invoke f=reprocess per attachment, then ok/fail (status, unauthenticated_status, repeat_status, job_id, "
           "repeat_job_id, pipeline_version); info f=reprocess_wait; with then_stop, fault action=stop_version")
WEIGHT = 0.3
ONCE = True
TERMINAL = ("ready", "failed")


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    params = step.get("params") or {}
    version = int(params.get("version", 2))
    states = tuple(params.get("states") or ("ready",))
    chosen = sorted(a for a, s in list(ctx.observer.states.items()) if s in states)
    count = params.get("count")
    if count is not None and len(chosen) > int(count):
        chosen = sorted(random.Random(f"{ctx.seed}/reprocess/{step['index']}").sample(chosen, int(count)))
    path_of = ctx.adapter.reprocess_path
    token = ctx.adapter.operator_token
    asked = []
    with http_clients.client(base_url=ctx.base_url, timeout=10) as client:
        for attachment_id in chosen:
            op = f"reprocess-{attachment_id[:8]}-v{version}"
            path = path_of.format(id=attachment_id)
            body = {"pipeline_version": version, "reason": "harness: roll-out of a pipeline version"}
            ctx.history.append("invoke", op=op, f="reprocess", attachment_id=attachment_id, pipeline_version=version,
                               fault=step["index"])
            unauth = client.post(path, json=body).status_code
            first = client.post(path, json=body, headers={"Authorization": f"Bearer {token}"})
            again = client.post(path, json=body, headers={"Authorization": f"Bearer {token}"})
            kind = "ok" if first.status_code in (200, 202) else "fail"
            answer = _json(first) if kind == "ok" else {}
            ctx.history.append(kind, op=op, f="reprocess", attachment_id=attachment_id, pipeline_version=version,
                               status=first.status_code, unauthenticated_status=unauth,
                               repeat_status=again.status_code, job_id=answer.get("job_id"),
                               repeat_job_id=_json(again).get("job_id"), fault=step["index"])
            if kind == "ok":
                asked.append(attachment_id)
            ctx.observer.poll_one(attachment_id)
    ctx.log(f"asked {len(asked)} of {len(chosen)} attachments for pipeline version {version}")
    if params.get("wait", True) or params.get("then_stop"):
        wait_for_versions(ctx, step, asked, version, params)


def _json(response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def version_state(body: dict, version: int) -> str | None:
    for v in body.get("versions") or []:
        if isinstance(v, dict) and v.get("pipeline_version") == version:
            return v.get("state")
    return None


def wait_for_versions(ctx, step, asked: list[str], version: int, params: dict) -> None:
    then_stop = bool(params.get("then_stop"))
    enough = int(params.get("stop_after_ready", 1))
    deadline = time.monotonic() + float(step.get("timeout", 60))
    states: dict[str, str | None] = {}
    with http_clients.client(base_url=ctx.base_url, timeout=5) as client:
        while asked and time.monotonic() < deadline and not ctx.stopping.is_set():
            for attachment_id in asked:
                try:
                    words = ctx.adapter.vocabulary  # the service's own status path and state names
                    states[attachment_id] = version_state(words.body(client.get(words.status_path(attachment_id))
                                                                     .json()),
                                                          version)
                except Exception:
                    states[attachment_id] = None
                ctx.observer.poll_one(attachment_id)
            ready = sum(1 for s in states.values() if s == "ready")
            if then_stop and ready >= min(enough, len(asked)):
                break
            if not then_stop and all(s in TERMINAL for s in states.values()):
                break
            time.sleep(0.2)
    ctx.history.append("info", f="reprocess_wait", pipeline_version=version, states=states,
                       done=all(s in TERMINAL for s in states.values()))
    if then_stop:
        stop(ctx, version, step)


def draw(rng, pick) -> dict:
    return {"action": "reprocess", "when": "idle", "params": {"version": 2}, "timeout": 60}


def happened(step, history, final) -> tuple[bool, str]:
    done = [e for e in history.of_type("ok") if e.get("f") == "reprocess"
            and e.get("fault", step.get("index")) == step.get("index")]
    return bool(done), f"{len(done)} attachments reprocessed for another pipeline version"
