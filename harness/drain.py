"""The end of a run's workload: the drain (every accepted upload terminal, the work queue empty, the scenario's
settle) and the count of what is left in the work queue once every consumer is stopped (delivery_accounting).
``run`` is the ``harness.runner.ScenarioRun`` under way."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from . import timing
from .broker import amqp_queue_depth, decode_payload

TERMINAL = ("ready", "failed")


def wait_drained(run) -> None:
    """Wait until every accepted upload is terminal. The budget counts from the last progress (a job ending), so
    a backlog that drains slowly on a loaded machine is not mistaken for lost work; a run with no progress for a
    whole budget ends, and so does one past four budgets in all."""
    budget = run.drain_budget()
    began = last_progress = time.monotonic()
    last_report, done_before = 0.0, -1
    while (time.monotonic() - last_progress < budget and time.monotonic() - began < 4 * budget
           and not run.stopping.is_set()):
        states = [run.observer.states.get(a) for a in run.observer.ids]
        pending = [s for s in states if s not in TERMINAL]
        if not pending:
            break
        if len(states) - len(pending) > done_before:
            done_before, last_progress = len(states) - len(pending), time.monotonic()
        if time.monotonic() - last_report > 3:
            last_report = time.monotonic()
            run.log(f"draining: {len(pending)} of {len(states)} not terminal")
        time.sleep(0.2)
    timing.add(run, "drain_wait", time.monotonic() - began)
    deadline = time.monotonic() + budget
    # The work queue must empty too: counted exactly over AMQP, not from the lagging management statistics.
    queue_deadline = min(deadline, time.monotonic() + 10)
    while time.monotonic() < queue_deadline:
        depth = amqp_queue_depth(run.tenant.direct.amqp_url, run.adapter.broker["work_queue"]) or {}
        if not depth.get("ready"):
            break
        time.sleep(0.3)
    timing.add(run, "queue_wait", time.monotonic() - deadline + budget)
    run.faults.stop_sampler()  # the backlog is gone: nothing left to bound
    settle = float(run.scenario.raw.get("settle_seconds", 0.5))
    with timing.split(run, "settle"):  # lets what a fault set off after the last terminal state show
        time.sleep(settle)
    run.observer.tick()
    run.tap.drain_once()
    states = [run.observer.states.get(a) for a in run.observer.ids]
    run.log(f"drained: {sum(s == 'ready' for s in states)} ready, {sum(s == 'failed' for s in states)} failed, "
             f"{sum(s not in TERMINAL for s in states)} other")

def count_left_after_consumers_stop(run) -> None:
    """After the drain and the final read, nothing may be left in the work queue, ready or unacked
    (delivery_accounting). Every consumer instance is stopped — which returns any unacked delivery to ready —
    and the queue is counted exactly (passive declare). When something is left, a late harmless duplicate may
    have been in flight at the stop: the consumers get one bounded settle (``queue_settle_seconds``, running,
    until the queue is empty and a moment more to settle what they took), then are stopped and counted again;
    the second count is the one judged. What is left is named by one look with requeue: the run is over, it
    changes nothing that is judged."""
    if run.stopping.is_set():
        return
    queue, url = run.adapter.broker["work_queue"], run.tenant.direct.amqp_url
    consumers = run.faults.consumers()

    def stop_and_count() -> dict | None:
        run.faults.extra_stopped.update(consumers)  # no restart timer may bring one back now
        if consumers:
            with ThreadPoolExecutor(len(consumers), thread_name_prefix="stop-consumers") as pool:
                list(pool.map(lambda name: run.supervisor.stop(name, 3), consumers))
        return amqp_queue_depth(url, queue)

    after, settle = stop_and_count(), None
    if after and after.get("ready") and not run.stopping.is_set():
        bound = float(run.scenario.raw.get("queue_settle_seconds", 6.0))
        began, emptied = time.monotonic(), None
        run.faults.extra_stopped.difference_update(consumers)
        for name in consumers:
            run.supervisor.ensure_running(name, {"FAILPOINTS": ""})
        while time.monotonic() - began < bound and not run.stopping.is_set():
            exact = amqp_queue_depth(url, queue) or {}
            if exact.get("ready") == 0 and exact.get("consumers"):
                emptied = emptied or time.monotonic()
                if time.monotonic() - emptied >= 1.0:
                    break
            else:
                emptied = None
            time.sleep(0.25)
        settle = {"first_ready": after.get("ready"), "seconds": round(time.monotonic() - began, 2),
                  "emptied": emptied is not None}
        after = stop_and_count()
    left = []
    if after and after.get("ready"):
        try:
            for message in run.management.get(queue, 20, requeue=True):
                body = decode_payload(message)[0] or {}
                left.append({"job_id": body.get("job_id"), "attachment_id": body.get("attachment_id"),
                             "attempt": body.get("attempt"), "redelivered": message.get("redelivered")})
        except Exception as exc:
            run.history.append("note", message="could not name the messages left in the work queue",
                                error=repr(exc))
        run.log(f"{after.get('ready')} messages left in {queue} once every consumer stopped")
    run.history.append("queue", kind="after_consumers_stopped", queue=queue, dead_letter=False,
                        ready=None if after is None else after.get("ready"),
                        consumers=None if after is None else after.get("consumers"),
                        stopped=consumers, **({"settle": settle} if settle else {}),
                        **({"messages": left} if left else {}))
