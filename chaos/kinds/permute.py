"""``permute``: the consumers held from before the workload (``hold``); once the workload is done and every accepted
job's message waits in the work queue, they are taken out and put back in a seeded random order
(harness/permute.py: confirmed before the originals go, never a message lost), then every held instance starts at
once (parallel delivery); the work queue's exact consumer and ready counts are sampled until it is empty."""

from __future__ import annotations

import time

ACTION = "permute"
RECORDS = ("fault action=permute phase=start (jobs_seen, accepted), phase=end (changed, original, permuted, order) "
           "or phase=failed; queue kind=consumers lines until the queue is empty")
WEIGHT = 0.5
ONCE = True


def prepare(ctx, step) -> None:
    if step.get("at") is None and step.get("when") is None:
        ctx.hold(step)


def run(ctx, step) -> None:
    from harness.broker import amqp_queue_depth
    from harness.broker import permute_queue
    from harness.seeding import stream

    queue = ctx.adapter.broker["work_queue"]
    deadline = time.monotonic() + float(step.get("timeout", 30))
    while not ctx.workload_done.is_set() and time.monotonic() < deadline and not ctx.stopping.is_set():
        time.sleep(0.1)
    jobs: set = set()
    while time.monotonic() < deadline and not ctx.stopping.is_set():
        jobs = {m["body"].get("job_id") for m in ctx.broker.tap.tapped() if isinstance(m.get("body"), dict)}
        depth = amqp_queue_depth(ctx.broker.amqp_url, queue) or {}
        if ctx.observer.ids and len(jobs) >= len(ctx.observer.ids) and (depth.get("ready") or 0) >= len(jobs):
            break
        time.sleep(0.2)
    time.sleep(float(step.get("settle_seconds", 0.3)))
    ctx.history.append("fault", action="permute", phase="start", queue=queue, jobs_seen=len(jobs),
                       accepted=len(ctx.observer.ids))
    try:
        done = permute_queue(ctx.broker.amqp_url, queue, stream(ctx.seed, f"permute-{step['index']}"))
        changed = [d.get("job_id") for d in done["original"]] != [d.get("job_id") for d in done["permuted"]]
        ctx.history.append("fault", action="permute", phase="end", queue=queue, changed=changed,
                           original=done["original"], permuted=done["permuted"], order=done["order"],
                           published=done["published"])
        ctx.log(f"permuted {len(done['order'])} messages of {queue}" + ("" if changed else " (order unchanged)"))
    except Exception as exc:
        ctx.history.append("fault", action="permute", phase="failed", queue=queue, error=repr(exc))
        ctx.log(f"permutation failed, originals put back: {exc!r}")
    if step.get("sample_consumers"):
        ctx.start_sampler(step)
    ctx.release(step)
    # Exact, real-time consumer and ready counts (a passive declare: the management statistics lag by seconds)
    # until the queue is empty: were several consumers attached while permuted messages still waited?
    until = time.monotonic() + float(step.get("watch_seconds", 20))
    while time.monotonic() < until and not ctx.stopping.is_set():
        depth = amqp_queue_depth(ctx.broker.amqp_url, queue)
        if depth is not None:
            ctx.history.append("queue", kind="consumers", queue=queue, dead_letter=False, **depth)
            if not depth.get("ready"):
                break
        time.sleep(0.1)


def allowed(adapter, level: int) -> str | None:
    return None if adapter.roles_flagged("consumer") else "no role is flagged consumer"


def draw(rng, pick) -> dict:
    return {"action": "permute", "hold": ["@consumers"], "timeout": 60}


def happened(step, history, final) -> tuple[bool, str]:
    done = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "end"
            and e.get("changed")]
    return bool(done), f"work queue permuted {len(done)} times"
