"""What a crash must have left behind to count as hitting each failure window (docs/CONTRACT.md §3), read from a
recorded history alone — pure functions, imported by the ``happened`` of the ``failpoint`` and ``sigkill`` kinds
(and so by ``fault_coverage``): nothing here runs a fault or imports the runner.

A timed SIGKILL only approximates its window, and a failpoint is placed by the implementation itself: neither its
name nor a crash while armed shows the window was entered. Both count as hitting a window only with the evidence
``WINDOW_RULES`` names for it, as the harness observed it (states it read, deliveries it traced, uploads it sent).
"""

from __future__ import annotations

WINDOW_RULES = {
    "after_commit_before_ack": "a job already ready at the crash delivered again afterwards (a redelivered delivery "
                               "of it traced from the work queue, or seen in a peek at the queue)",
    "after_commit_before_publish": "a job accepted before the crash (or recorded before it for an upload in flight "
                                   "at it, then accepted on the retry) whose message was first seen only after the "
                                   "crashed role started again, or never seen while the job was never claimed, or a "
                                   "job's message published twice",
    "after_publish_before_confirm": "a job's message published twice (the same job and attempt), once after the "
                                    "crash, or — the publish lost with the crashed process before the broker had "
                                    "it — a job accepted (or recorded for an upload in flight) before the crash "
                                    "whose message was first seen only after the crashed role started again",
    "after_s3_write_before_commit": "a job processing at the crash claimed again after it",
    "after_staging_before_record": "an upload in flight at the crash that was not accepted",
}


def windows_hit(kills: list[dict], history, final: dict) -> tuple[bool, str]:
    """Timed SIGKILLs (``fault action=sigkill`` lines with ``window``): did each window they aimed at show hit?"""
    windows = sorted({w for k in kills for w in str(k["window"]).split(",") if w})
    missing, found = [], []
    for window in windows:
        rule = WINDOW_RULES.get(window)
        hits = [what for kill in kills if rule for what in [evidence_of(window, kill, history, final)] if what]
        if hits:
            found.append(f"{window}: {hits[0]}")
        else:
            missing.append(f"{window}: no evidence it was hit (needs {rule})" if rule else
                           f"{window}: no rule says what would show it hit")
    text = f"timed sigkill sent {len(kills)} times (approximate); " + "; ".join(missing + found)
    return not missing, text


def ready_seen_before(crash: dict, history) -> int:
    """The history position before which a job seen ``ready`` was committed before ``crash``: the crash itself for a
    timed kill (its trigger saw the state before it acted); for a failpoint hit, the crashed instance's next start
    (the harness reads every unfinished job while it is down), unless another consumer instance was running at the
    crash (it could have committed a job meanwhile: only what was seen before the crash counts)."""
    if crash.get("action") != "crash" or crash.get("consumers_running") is None or crash.get("consumers_running"):
        return crash["seq"]
    restart = next((e for e in history.events if e["seq"] > crash["seq"] and e["type"] == "role"
                    and e.get("action") == "start" and e.get("role") == crash.get("role")), None)
    return restart["seq"] if restart is not None else crash["seq"]


# A failpoint's crash is written once the harness saw the role exit; a client whose connection the crash broke may
# have said so a moment earlier. Such an ending (no HTTP answer: an ``info`` line) that close to the crash is the crash.
CRASH_SLACK_SECONDS = 1.0


def in_flight_at(kill: dict, history) -> dict[str, dict]:
    """Uploads (op id -> operation) sent before the crash and not answered before it: no answer at all, an answer
    after it, or (a failpoint's crash) a broken connection within ``CRASH_SLACK_SECONDS`` before its line."""
    out = {}
    for op, o in history.operations().items():
        invoke, done = o["invoke"], o["complete"]
        if invoke.get("f") != "upload" or invoke["seq"] >= kill["seq"]:
            continue
        if done is None or done["seq"] > kill["seq"] or (
                kill.get("action") == "crash" and done["type"] == "info"
                and done.get("wall", 0) >= kill.get("wall", 0) - CRASH_SLACK_SECONDS):
            out[op] = o
    return out


def evidence_of(window: str, kill: dict, history, final: dict) -> str | None:
    """The first piece of ``window``'s evidence after ``kill`` (a ``fault`` line: a timed kill or a failpoint hit,
    with its ``seq``, ``wall`` and ``role``), or None."""
    from harness.transitions import transitions_of

    after = [e for e in history.events if e["seq"] > kill["seq"]]
    messages = [e for e in history.of_type("message") if isinstance(e.get("body"), dict) and e["body"].get("job_id")]
    if window == "after_commit_before_ack":
        bound = ready_seen_before(kill, history)
        ready_before = {e.get("attachment_id") for e in history.events if e["seq"] < bound and (
            (e["type"] == "state" and e.get("state") == "ready") or (e["type"] == "transition" and e.get("to") == "ready"))}
        jobs = {ok.get("job_id") for _, ok in history.accepted() if ok.get("attachment_id") in ready_before}
        jobs |= {m["body"]["job_id"] for m in messages if m["body"].get("attachment_id") in ready_before}
        for e in after:
            if e["type"] == "delivery" and e.get("redelivered") and e.get("job_id") in jobs:
                return f"job {e['job_id']} (ready before the crash) redelivered"
            if e["type"] == "queue" and e.get("kind") == "peek":
                for m in e.get("messages") or []:
                    if m.get("redelivered") and (m.get("job_id") in jobs or m.get("attachment_id") in ready_before):
                        return f"job {m.get('job_id')} (ready before the crash) back in the queue, redelivered"
        return None
    if window in ("after_commit_before_publish", "after_publish_before_confirm"):
        published: dict[tuple, list[dict]] = {}
        for m in messages:
            published.setdefault((m["body"]["job_id"], m["body"].get("attempt")), []).append(m)
        for (job, attempt), copies in published.items():
            if len(copies) > 1 and copies[-1]["seq"] > kill["seq"]:
                return f"job {job} (attempt {attempt}) published {len(copies)} times"
        restart = next((e for e in after if e["type"] == "role" and e.get("action") == "start"
                        and e.get("role") == kill.get("role")), None)
        first = {}
        for m in messages:
            first.setdefault(m["body"]["job_id"], m)
        # Uploads in flight at the crash: their record may have been committed just before it (the window), the
        # client's retry with the same key then accepted as that record once the role is back.
        in_flight = set(in_flight_at(kill, history))
        for invoke, ok in history.accepted():
            m = first.get(ok.get("job_id"))
            trans = [t for t in transitions_of(history, final, ok.get("attachment_id")) if t["at"] is not None]
            # A job never published at all shows the window as well as one published late (the commit came before
            # the crash, the publish never): an implementation with nothing to publish it again loses it. Only when
            # nothing ever claimed it either — a job processed whose message the tap did not see shows nothing.
            never = m is None and window == "after_commit_before_publish" and bool(trans) and not any(
                t["to"] != trans[0]["to"] for t in trans)
            if not never and (m is None or m["seq"] <= (restart or kill)["seq"]):
                continue
            how = "never published, nor claimed" if never else "first published after the restart"
            if ok["seq"] < kill["seq"]:
                return f"job {ok.get('job_id')} accepted before the crash, {how}"
            if invoke.get("retry_of") in in_flight or invoke.get("op") in in_flight:
                # Only a record committed before the crash shows the window: a retry that created it afresh after the
                # restart would be published after it too. Its first transition, as the final read found it.
                if trans and min(t["at"] for t in trans) <= kill["wall"]:
                    return (f"job {ok.get('job_id')} of upload {invoke.get('retry_of') or invoke.get('op')} (in flight "
                            f"at the crash, its record created before it) {how}")
        return None
    if window == "after_s3_write_before_commit":
        for attachment_id in sorted((final.get("attachments") or {})):
            trans = [t for t in transitions_of(history, final, attachment_id) if t["at"] is not None]
            before = [t for t in trans if t["at"] <= kill["wall"]]
            if before and before[-1]["to"] == "processing" and any(
                    t["to"] == "processing" and t["at"] > kill["wall"] for t in trans):
                return f"attachment {attachment_id} processing at the crash, claimed again after it"
            # Without /events: the polled states — processing when last seen before the crash, queued after it.
            states = [e for e in history.of_type("state") if e.get("attachment_id") == attachment_id]
            seen = [e for e in states if e["seq"] < kill["seq"]]
            if seen and seen[-1].get("state") == "processing" and any(
                    e.get("state") == "queued" for e in states if e["seq"] > kill["seq"]):
                return f"attachment {attachment_id} processing when the crash came, given back to the queue after it"
        return None
    if window == "after_staging_before_record":
        for op, o in in_flight_at(kill, history).items():
            done = o["complete"]
            if done is None or not (done["type"] == "ok" and done.get("status") == 202):
                return f"upload {op} in flight at the crash, not accepted"
        return None
    return None
