"""Did the scenario's faults actually happen? A failpoint that never fired, a trigger that never came or a
republish with nothing to republish leaves its window untested: the run says `unknown`, not `valid`. A timed
SIGKILL (``exactness="approximate"``) counts as hitting its window only with the evidence ``WINDOW_RULES`` names for
that window, from the history alone."""

from __future__ import annotations

from .base import UNKNOWN, VALID, Verdict, evidence, seed_of

NAME = "fault_coverage"
REQUIREMENTS: list[str] = []


def _happened(step: dict, history, final: dict | None = None) -> tuple[bool, str]:
    action = step.get("action")
    faults = history.of_type("fault")
    if action == "failpoint" and "error" in str(step.get("spec", "")):
        return _errored(step, history)
    if action == "failpoint" and "crash" not in str(step.get("spec", "1*crash")):
        return _paused(step, history)
    if action == "failpoint":
        hit = [e for e in faults if e.get("phase") == "hit" and e.get("window") == step.get("window")]
        return bool(hit), f"failpoint {step.get('window')} fired {len(hit)} times"
    if action in ("sigkill", "sigstop"):
        done = [e for e in faults if e.get("action") == action and e.get("phase") == "start"]
        timed = [e for e in done if e.get("exactness") == "approximate" and e.get("window")]
        if action == "sigkill" and timed:
            return _windows_hit(timed, history, final or {})
        return bool(done), f"{action} sent {len(done)} times"
    if action in ("toxic", "restart_service"):
        done = [e for e in faults if e.get("action") == action and e.get("phase") == "start"
                and e.get("service") == step.get("service")]
        return bool(done), f"{action} on {step.get('service')} {len(done)} times"
    if action in ("kill_broker_node", "partition_broker_node"):
        done = [e for e in faults if e.get("action") == action and e.get("phase") == "start"
                and e.get("target", "leader") == step.get("node", "leader")]
        return bool(done), f"{action} on the {step.get('node', 'leader')} node {len(done)} times"
    if action == "republish":
        done = [e for e in faults if e.get("action") == "republish" and e.get("phase") == "start" and e.get("jobs")]
        return bool(done), f"republished {sum(len(e['jobs']) for e in done)} jobs"
    if action == "inject":
        done = [e for e in faults if e.get("action") == "inject" and e.get("phase") == "publish" and e.get("routed")]
        return bool(done), f"{len(done)} unprocessable messages injected into the work queue"
    if action == "permute":
        done = [e for e in faults if e.get("action") == "permute" and e.get("phase") == "end" and e.get("changed")]
        return bool(done), f"work queue permuted {len(done)} times"
    if action == "replay":
        done = [e for e in history.of_type("invoke") if e.get("f") == "replay"]
        return bool(done), f"{len(done)} replays requested"
    if action == "dlq_replay":
        moved = [e for e in faults if e.get("action") == "dlq_replay" and e.get("phase") == "move" and e.get("routed")]
        asked = [e for e in history.of_type("invoke") if e.get("f") == "dlq_replay"]
        return bool(moved and asked), f"{len(moved)} job messages dead-lettered, {len(asked)} replays requested"
    if action == "hold":
        held = [e for e in history.of_type("phase") if e.get("name") == "hold_end" and e.get("fault") == step.get("index")]
        return bool(held), f"roles held and released {len(held)} times"
    if action == "start_instance":
        return True, "instance started"
    if action in ("start_version", "stop_version"):  # level 5
        done = [e for e in faults if e.get("action") == action and e.get("phase") == "start"
                and e.get("fault") == step.get("index")]
        return bool(done), f"{action}: {len(done)} consumer instances"
    if action == "reprocess":
        done = [e for e in history.of_type("ok") if e.get("f") == "reprocess"
                and e.get("fault", step.get("index")) == step.get("index")]
        return bool(done), f"{len(done)} attachments reprocessed for another pipeline version"
    return False, f"unknown action {action!r}"


# What a timed SIGKILL must have left behind to count as hitting each window (CONTRACT §6), read from the history
# alone; without it the window was not shown hit, and the fault did not happen as scheduled (unknown).
WINDOW_RULES = {
    "after_commit_before_ack": "a job already ready at the kill delivered again afterwards (a redelivered delivery "
                               "of it traced from the work queue, or seen in a peek at the queue)",
    "after_commit_before_publish": "a job accepted before the kill whose message was first seen only after the "
                                   "killed role started again, or a job's message published twice",
    "after_publish_before_confirm": "a job's message published twice (the same job and attempt), once after the kill",
    "after_s3_write_before_commit": "a job processing at the kill claimed again after it",
    "after_staging_before_record": "an upload in flight at the kill that was not accepted",
}


def _windows_hit(kills: list[dict], history, final: dict) -> tuple[bool, str]:
    windows = sorted({w for k in kills for w in str(k["window"]).split(",") if w})
    missing, found = [], []
    for window in windows:
        rule = WINDOW_RULES.get(window)
        hits = [what for kill in kills if rule for what in [_evidence_of(window, kill, history, final)] if what]
        if hits:
            found.append(f"{window}: {hits[0]}")
        else:
            missing.append(f"{window}: no evidence it was hit (needs {rule})" if rule else
                           f"{window}: no rule says what would show it hit")
    text = f"timed sigkill sent {len(kills)} times (approximate); " + "; ".join(missing + found)
    return not missing, text


def _evidence_of(window: str, kill: dict, history, final: dict) -> str | None:
    from .base import transitions_of

    after = [e for e in history.events if e["seq"] > kill["seq"]]
    messages = [e for e in history.of_type("message") if isinstance(e.get("body"), dict) and e["body"].get("job_id")]
    if window == "after_commit_before_ack":
        ready_before = {e.get("attachment_id") for e in history.events if e["seq"] < kill["seq"] and (
            (e["type"] == "state" and e.get("state") == "ready") or (e["type"] == "transition" and e.get("to") == "ready"))}
        jobs = {ok.get("job_id") for _, ok in history.accepted() if ok.get("attachment_id") in ready_before}
        jobs |= {m["body"]["job_id"] for m in messages if m["body"].get("attachment_id") in ready_before}
        for e in after:
            if e["type"] == "delivery" and e.get("redelivered") and e.get("job_id") in jobs:
                return f"job {e['job_id']} (ready before the kill) redelivered"
            if e["type"] == "queue" and e.get("kind") == "peek":
                for m in e.get("messages") or []:
                    if m.get("redelivered") and (m.get("job_id") in jobs or m.get("attachment_id") in ready_before):
                        return f"job {m.get('job_id')} (ready before the kill) back in the queue, redelivered"
        return None
    if window in ("after_commit_before_publish", "after_publish_before_confirm"):
        published: dict[tuple, list[dict]] = {}
        for m in messages:
            published.setdefault((m["body"]["job_id"], m["body"].get("attempt")), []).append(m)
        for (job, attempt), copies in published.items():
            if len(copies) > 1 and copies[-1]["seq"] > kill["seq"]:
                return f"job {job} (attempt {attempt}) published {len(copies)} times"
        if window == "after_publish_before_confirm":
            return None
        restart = next((e for e in after if e["type"] == "role" and e.get("action") == "start"
                        and e.get("role") == kill.get("role")), None)
        first = {}
        for m in messages:
            first.setdefault(m["body"]["job_id"], m)
        for _, ok in history.accepted():
            m = first.get(ok.get("job_id"))
            if ok["seq"] < kill["seq"] and m is not None and m["seq"] > (restart or kill)["seq"]:
                return f"job {ok.get('job_id')} accepted before the kill, first published after the restart"
        return None
    if window == "after_s3_write_before_commit":
        for attachment_id in sorted((final.get("attachments") or {})):
            trans = [t for t in transitions_of(history, final, attachment_id) if t["at"] is not None]
            before = [t for t in trans if t["at"] <= kill["wall"]]
            if before and before[-1]["to"] == "processing" and any(
                    t["to"] == "processing" and t["at"] > kill["wall"] for t in trans):
                return f"attachment {attachment_id} processing at the kill, claimed again after it"
            # Without /events: the polled states — processing when last seen before the kill, queued after it.
            states = [e for e in history.of_type("state") if e.get("attachment_id") == attachment_id]
            seen = [e for e in states if e["seq"] < kill["seq"]]
            if seen and seen[-1].get("state") == "processing" and any(
                    e.get("state") == "queued" for e in states if e["seq"] > kill["seq"]):
                return f"attachment {attachment_id} processing when the kill came, given back to the queue after it"
        return None
    if window == "after_staging_before_record":
        for op in history.operations().values():
            invoke, done = op["invoke"], op["complete"]
            if invoke.get("f") == "upload" and invoke["seq"] < kill["seq"] and (done is None or (
                    done["seq"] > kill["seq"] and not (done["type"] == "ok" and done.get("status") == 202))):
                return f"upload {invoke.get('op')} in flight at the kill, not accepted"
        return None
    return None


def _errored(step: dict, history) -> tuple[bool, str]:
    """An error failpoint (a transient error) shows as attempts given back: processing → queued after it was armed."""
    armed = [e.get("t") or 0 for e in history.of_type("fault") if e.get("action") == "failpoint"
             and e.get("phase") == "arm" and e.get("window") == step.get("window")]
    if not armed:
        return False, f"failpoint {step.get('spec')} at {step.get('window')}: never armed"
    retried = [e for e in history.of_type("transition") if e.get("from") == "processing" and e.get("to") == "queued"
               and (e.get("t") or 0) >= min(armed)]
    return bool(retried), (f"failpoint {step.get('spec')} at {step.get('window')}: {len(retried)} attempts given "
                           "back (processing → queued) after it was armed")


def _paused(step: dict, history) -> tuple[bool, str]:
    """A pause failpoint leaves no crash behind: in the upload path (after_staging_before_record) it shows as uploads
    that took at least the pause; elsewhere it is not observable from outside."""
    import re

    match = re.search(r"pause\((\d+(?:\.\d+)?)\)", str(step.get("spec")))
    armed = [e for e in history.of_type("fault") if e.get("action") == "failpoint" and e.get("phase") == "arm"
             and e.get("window") == step.get("window")]
    if not match or not armed or step.get("window") != "after_staging_before_record":
        return False, f"failpoint {step.get('spec')} at {step.get('window')}: armed {len(armed)} times, not observable"
    pause = float(match.group(1)) / 1000
    slow = [o for o in history.operations().values() if o["invoke"].get("f") == "upload" and o["complete"] is not None
            and o["complete"]["t"] - o["invoke"]["t"] >= 0.9 * pause]
    return bool(slow), f"{len(slow)} uploads took at least the {pause:g}s pause at {step.get('window')}"


def check(history, final, run) -> Verdict:
    missing, done = [], []
    for step in run.get("schedule") or []:
        happened, what = _happened(step, history, final)
        (done if happened else missing).append(evidence(f"fault {step.get('index')} ({step.get('action')}): {what}",
                                                        fault=step.get("index")))
    if missing:
        unproven = any("no evidence it was hit" in e["message"] for e in missing)
        return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                       f"{len(missing)} scheduled faults did not happen: their windows were not tested"
                       + (" (a timed kill with no evidence it was hit)" if unproven else ""),
                       evidence=missing, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, f"all {len(done)} scheduled faults happened", exercised=bool(done),
                   evidence=done, seed=seed_of(run))
