"""Did the scenario's faults actually happen? A failpoint that never fired, a trigger that never came or a
republish with nothing to republish leaves its window untested: the run says `unknown`, not `valid`."""

from __future__ import annotations

from .base import UNKNOWN, VALID, Verdict, evidence, seed_of

NAME = "fault_coverage"
REQUIREMENTS: list[str] = []


def _happened(step: dict, history) -> tuple[bool, str]:
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
        return bool(done), f"{action} sent {len(done)} times"
    if action in ("toxic", "restart_service"):
        done = [e for e in faults if e.get("action") == action and e.get("phase") == "start"
                and e.get("service") == step.get("service")]
        return bool(done), f"{action} on {step.get('service')} {len(done)} times"
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
    if action == "hold":
        held = [e for e in history.of_type("phase") if e.get("name") == "hold_end" and e.get("fault") == step.get("index")]
        return bool(held), f"roles held and released {len(held)} times"
    if action == "start_instance":
        return True, "instance started"
    return False, f"unknown action {action!r}"


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
        happened, what = _happened(step, history)
        (done if happened else missing).append(evidence(f"fault {step.get('index')} ({step.get('action')}): {what}",
                                                        fault=step.get("index")))
    if missing:
        return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                       f"{len(missing)} scheduled faults did not happen: their windows were not tested",
                       evidence=missing, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, f"all {len(done)} scheduled faults happened", exercised=bool(done),
                   evidence=done, seed=seed_of(run))
