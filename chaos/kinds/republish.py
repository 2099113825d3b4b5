"""``republish``: copies of tapped messages published again where the originals went, with every property and
header: the redelivery of a ready job (``state = "ready"``), or concurrent duplicates (``state = "any"``)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from . import first_delay

ACTION = "republish"
RECORDS = "fault action=republish phase=start (jobs, copies, state) and phase=end (routed)"
WEIGHT = 2


def _candidates(ctx, target_state: str, limit: int) -> list[dict]:
    """The tapped messages of up to ``limit`` jobs whose attachment is in ``target_state`` now, one per job."""
    seen, unique = set(), []
    for message in ctx.broker.tap.tapped():
        body = message.get("body") or {}
        if target_state != "any" and ctx.observer.states.get(body.get("attachment_id")) != target_state:
            continue
        if body.get("job_id") not in seen:
            seen.add(body.get("job_id"))
            unique.append(message)
    return unique[:limit]


def _wait_for_consumers(ctx, step, wanted: int) -> None:
    """Until the work queue has ``wanted`` consumers (an exact count), at most 10 s: copies meant to race on two
    consumers prove nothing while the second instance is still starting (seen on a loaded machine: every copy went to
    the one consumer there was). A count that never came is noted; the copies are published all the same."""
    from .sigterm import consumers_now

    deadline, now = time.monotonic() + 10.0, None
    while time.monotonic() < deadline and not ctx.stopping.is_set():
        now = consumers_now(ctx)
        if now is not None and now >= wanted:
            return
        time.sleep(0.1)
    ctx.history.append("note", message=f"republish: the work queue had {now} consumers, not {wanted}, after 10 s",
                       fault=step["index"])


def run(ctx, step) -> None:
    # The consumers first, then the trigger: a job seen processing while the second consumer was still starting may
    # be done by the time it is up, leaving nothing to copy.
    if step.get("params", {}).get("consumers"):
        _wait_for_consumers(ctx, step, int(step["params"]["consumers"]))
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    target_state = step.get("params", {}).get("state", "ready")
    copies = int(step.get("count", 1))
    limit = int(step.get("params", {}).get("jobs", 2))
    # The state can be seen before the tap has drained the job's message (an implementation that publishes and
    # consumes within the tap's poll): look again, briefly, rather than republish nothing.
    deadline = time.monotonic() + min(5.0, float(step.get("timeout", 30)))
    unique = _candidates(ctx, target_state, limit)
    while not unique and time.monotonic() < deadline and not ctx.stopping.wait(0.05):
        unique = _candidates(ctx, target_state, limit)
    jobs = [m["body"]["job_id"] for m in unique]
    ctx.history.append("fault", action="republish", phase="start", fault=step["index"], jobs=jobs, copies=copies,
                       state=target_state)
    ctx.log(f"republishing {copies}× {len(unique)} jobs ({target_state})")

    def send(m):  # where the original went, with every property and header it had
        return ctx.broker.management.publish(m["exchange"], m["routing_key"], m["raw"], m["properties"])
    with ThreadPoolExecutor(max(1, copies * len(unique))) as pool:
        routed = list(pool.map(send, [m for m in unique for _ in range(copies)]))
    ctx.history.append("fault", action="republish", phase="end", fault=step["index"], jobs=jobs,
                       routed=sum(routed))


def draw(rng, pick) -> dict:
    state = rng.choice(("ready", "any"))
    return {"action": "republish", "at": pick.at, "when": "ready" if state == "ready" else "message",
            "count": rng.randint(1, 2), "params": {"state": state, "jobs": rng.randint(1, 3)}, "timeout": 60}


def happened(step, history, final) -> tuple[bool, str]:
    done = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "start"
            and e.get("jobs")]
    return bool(done), f"republished {sum(len(e['jobs']) for e in done)} jobs"
