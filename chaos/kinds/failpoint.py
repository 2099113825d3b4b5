"""``failpoint``: the role hosting a failure window restarted with FAILPOINTS set (CONTRACT §7) — before the workload
(armed at first start) or at a trigger — then, for a crash spec, the crash waited for (the role is restarted
``restart_after`` seconds after it, the work queue peeked at while it is down when asked); a pause or error spec
keeps the role running (``until = "idle"``: armed until every accepted job is terminal). Never hit: disarmed."""

from __future__ import annotations

import threading
import time

from . import first_delay, peek_while_down, untimed

ACTION = "failpoint"
RECORDS = ("fault action=failpoint phase=arm (role, window, spec), fault action=crash phase=hit per crash (runner), "
           "phase=disarm; phase=end for an until=idle pause or error; note 'failpoint never hit'")
WEIGHT = 4


def prepare(ctx, step) -> None:
    if untimed(step):
        ctx.hold(step)


def run(ctx, step) -> None:
    name = ctx.failpoint_instance(step)
    ctx.restart_after[name] = float(step.get("restart_after", 0.5))
    if not untimed(step):
        if not ctx.wait_trigger(step, first_delay(step)):
            return
        ctx.hold(step)
        ctx.hits[name] = threading.Event()
        ctx.failpoints.arm(name, step["window"], step.get("spec", "1*crash"))
    if "crash" not in str(step.get("spec", "1*crash")):
        ctx.release(step)  # a pause or an error: the role keeps running, there is no crash to wait for
        if step.get("until") == "idle":
            # Kept armed until every accepted job is terminal (or the step's timeout): the heal disarms it,
            # so a fault that must outlast every job's retry budget ends only here.
            idle = ctx.wait_trigger({**step, "when": "idle"}, 0.0)
            ctx.history.append("fault", action="failpoint", phase="end", role=name, window=step["window"],
                               spec=step.get("spec"), reason="idle" if idle else "timeout")
        return
    hit = ctx.hits.setdefault(name, threading.Event()).wait(float(step.get("timeout", 30)))
    if hit and step.get("peek_queue"):
        peek_while_down(ctx, step)
    if not hit:
        ctx.history.append("note", message="failpoint never hit", window=step["window"], role=name)
        ctx.log(f"failpoint {step['window']} never hit")
        ctx.failpoints.disarm(name)
    time.sleep(float(step.get("hold_seconds", 0)) if hit else 0)
    ctx.release(step)


def windows(adapter) -> list[str]:
    """The failure windows the adapter maps to one of its roles."""
    from harness.defaults import DEFAULT_WINDOW_ROLES

    names = list(dict.fromkeys([*DEFAULT_WINDOW_ROLES, *(adapter.raw.get("failpoints") or {})]))
    return [w for w in names if adapter.window_role(w)]


def allowed(adapter, level: int) -> str | None:
    if not adapter.has("failpoints"):
        return "the adapter declares no failpoints capability"
    if not windows(adapter):
        return "the adapter maps no role to any failure window ([failpoints])"
    return None


def draw(rng, pick) -> dict | None:
    """A crash at a window whose role may take a process fault and is not busy with another one in this seed (an
    arm restarts the role with FAILPOINTS set: a second arm, a kill or a hold would disarm it before its window)."""
    choices = [w for w in windows(pick.adapter) if pick.adapter.window_role(w) in pick.roles
               and pick.adapter.window_role(w) not in pick.busy]
    if not choices:
        return None
    return {"action": "failpoint", "window": rng.choice(choices), "spec": "1*crash", "at": pick.at,
            "restart_after": round(rng.uniform(0.3, 1.5), 2), "timeout": 30}


def happened(step, history, final) -> tuple[bool, str]:
    """A crash failpoint counts only with its window's own evidence, as the harness observed it (``_windows``): the
    failpoint is placed by the implementation, and a crash while armed does not show it sat in its window. An error
    failpoint shows as attempts given back; a pause, in the upload path, as uploads that took the pause."""
    from ._windows import WINDOW_RULES, evidence_of

    spec, window = str(step.get("spec", "1*crash")), step.get("window")
    if "error" in spec:
        return _errored(step, history)
    if "crash" not in spec:
        return _paused(step, history, final)
    hits = [e for e in history.of_type("fault") if e.get("action") == "crash" and e.get("phase") == "hit"
            and e.get("window") == window]
    if not hits:
        return False, f"failpoint {window} fired 0 times"
    rule = WINDOW_RULES.get(window)
    if rule is None:
        return False, f"failpoint {window} fired {len(hits)} times, but no rule says what would show its window hit"
    for hit in hits:
        found = evidence_of(window, hit, history, final or {})
        if found:
            return True, f"failpoint {window} fired {len(hits)} times; its window shown: {found}"
    return False, (f"failpoint {window} fired {len(hits)} times but its window was not shown: no evidence it was hit "
                   f"(needs {rule})")


def _errored(step, history) -> tuple[bool, str]:
    """An error failpoint (a transient error) shows as attempts given back: processing → queued after it was armed."""
    armed = [e.get("t") or 0 for e in history.of_type("fault") if e.get("action") == "failpoint"
             and e.get("phase") == "arm" and e.get("window") == step.get("window")]
    if not armed:
        return False, f"failpoint {step.get('spec')} at {step.get('window')}: never armed"
    retried = [e for e in history.of_type("transition") if e.get("from") == "processing" and e.get("to") == "queued"
               and (e.get("t") or 0) >= min(armed)]
    return bool(retried), (f"failpoint {step.get('spec')} at {step.get('window')}: {len(retried)} attempts given "
                           "back (processing → queued) after it was armed")


def _paused(step, history, final) -> tuple[bool, str]:
    """A pause failpoint leaves no crash behind: in the upload path (after_staging_before_record) it shows as uploads
    that took at least the pause; between the writes and the commit (after_s3_write_before_commit, with the object
    watch on) as a job that left ``processing`` at least 0.9 × the pause after the last object of its own (a key
    naming its attachment id) was seen written during that claim; elsewhere it is not observable from outside."""
    import re

    match = re.search(r"pause\((\d+(?:\.\d+)?)\)", str(step.get("spec")))
    armed = [e for e in history.of_type("fault") if e.get("action") == "failpoint" and e.get("phase") == "arm"
             and e.get("window") == step.get("window")]
    if match and armed and step.get("window") == "after_s3_write_before_commit":
        return _paused_before_commit(float(match.group(1)) / 1000, history, final or {})
    if not match or not armed or step.get("window") != "after_staging_before_record":
        return False, f"failpoint {step.get('spec')} at {step.get('window')}: armed {len(armed)} times, not observable"
    pause = float(match.group(1)) / 1000
    slow = [o for o in history.operations().values() if o["invoke"].get("f") == "upload" and o["complete"] is not None
            and o["complete"]["t"] - o["invoke"]["t"] >= 0.9 * pause]
    return bool(slow), f"{len(slow)} uploads took at least the {pause:g}s pause at {step.get('window')}"


def _paused_before_commit(pause: float, history, final: dict) -> tuple[bool, str]:
    """A pause between the last object write and the commit, as the harness saw it: a claim (``processing``) whose
    job's own objects (keys naming its attachment id, its original aside, seen by the object watch during that claim)
    were all written at least 0.9 × the pause before the job left ``processing`` (harness wall times of both).

    "During that claim" runs from the earliest moment the harness knows the claim had not yet happened to when it saw
    the job leave. The wall at which the API observer saw the claim is only an upper bound: a render is quicker than
    a poll, so the object watch can see a claim's objects before the observer sees the claim. The lower bound is the
    latest of the upload's start and, for every transition of the job up to the claim, the start of the last read
    that did not show it yet (``not_before_wall``). The upload's own write, the original (as the final read names
    it), is never the claim's; without a final read the claim's own wall is the bound, as the original is unknown."""
    objects = history.of_type("object")
    if not objects:
        return False, (f"failpoint pause({pause * 1000:g}) at after_s3_write_before_commit: no object watch in this "
                       "run, not observable")
    uploaded = {o["complete"]["attachment_id"]: o["invoke"]["wall"] for o in history.operations().values()
                if o["invoke"].get("f") == "upload" and o["complete"] is not None
                and o["complete"].get("attachment_id") and "wall" in o["invoke"]}
    trans = sorted((e for e in history.of_type("transition") if e.get("attachment_id")),
                   key=lambda e: (e["wall"], e["seq"]))
    for index, claim in enumerate(trans):
        if claim.get("to") != "processing":
            continue
        aid = claim["attachment_id"]
        left = next((e for e in trans[index + 1:] if e["attachment_id"] == aid and e.get("from") == "processing"),
                    None)
        if left is None:
            continue
        original = (((final.get("attachments") or {}).get(aid) or {}).get("body") or {}).get("original") or {}
        bounds = [e["not_before_wall"] for e in trans[:index + 1] if e["attachment_id"] == aid
                  and e.get("not_before_wall") is not None]
        bounds += [uploaded[aid]] if aid in uploaded else []
        began = max(bounds) if bounds and original.get("key") else claim["wall"]
        own = [o for o in objects if aid in str(o.get("key")) and o.get("key") != original.get("key")
               and began <= o["wall"] <= left["wall"]]
        last = max(own, key=lambda o: o["wall"], default=None)
        if last is not None and left["wall"] - last["wall"] >= 0.9 * pause:
            return True, (f"attachment {aid}: its last object ({last['key']}) seen at t={last['t']:.2f}s, "
                          f"it left processing ({left['to']}) at t={left['t']:.2f}s: at least the {pause:g}s pause "
                          "between its writes and its commit")
    return False, (f"failpoint pause({pause * 1000:g}) at after_s3_write_before_commit: no job seen leaving "
                   f"processing at least {0.9 * pause:.2f}s after its own last object write")
