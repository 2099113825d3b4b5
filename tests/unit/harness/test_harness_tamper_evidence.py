"""Tamper evidence: the harness re-reads the faults it set (chaos/network.py) and a change it did not make is
``tampered`` (harness/checkers/tamper_evidence.py), a verdict of its own that ranks worst and never passes a row."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from chaos import heal_all
from chaos.network import NetworkFaults
from harness.checkers import CHECKERS, TAMPERED, UNKNOWN, VALID, combine, counts, tamper_evidence
from harness.grade import _by_scenarios, checklist_rows, REQUIREMENT_STATUS
from harness.history import History, HistoryWriter
from harness.supervisor import Supervisor
from harness.toxiproxy import probe_refused

RUN = {"seed": 4242, "scenario": {"name": "database-outages-past-lease", "checks": ["lost_accepted_work"]},
       "schedule": [{"index": 0, "action": "toxic", "service": "postgres", "toxic": "cut"},
                    {"index": 1, "action": "toxic", "service": "postgres", "toxic": "cut"}]}


def _start(fault):
    return {"type": "fault", "action": "toxic", "toxic": "cut", "phase": "start", "service": "postgres"}


def _summary(fault, found="intact", checks=8, changes=()):
    return {"type": "tamper", "summary": True, "found": found, "fault": fault, "link": "postgres", "kind": "cut",
            "checks": checks, "unread": 0 if checks else 3, "changes": list(changes), "in_force_seconds": 4.4}


# --- the checker, on hand-built histories ---------------------------------------------------------------------------

def test_a_change_the_harness_did_not_make_is_tampered_with_scenario_fault_and_time():
    history = History.from_events([
        _start(0),
        {"type": "tamper", "found": "changed", "fault": 0, "link": "postgres", "kind": "cut", "what": "proxy re-enabled",
         "expected": {"enabled": False}, "observed": {"enabled": True}, "when": "in force", "in_force_seconds": 0.5},
        _summary(0, "changed", changes=["proxy re-enabled"]), _start(1), _summary(1)])
    verdict = tamper_evidence.check(history, {}, RUN)
    assert verdict.status == TAMPERED
    item = verdict.evidence[0]
    assert item["scenario"] == "database-outages-past-lease" and item["fault"] == 0
    assert item["expected"] == {"enabled": False} and item["observed"] == {"enabled": True}
    assert item["t"] == 2.0 and item["wall"] and item["lines"] == [2]
    assert "proxy re-enabled" in verdict.summary and verdict.seed == 4242


def test_a_refused_attempt_on_the_grader_is_tampered_even_with_every_fault_intact():
    # Under isolation heal_toxiproxy's connections to the Toxiproxy API are refused, so every fault reads back intact
    # and the grade used to be valid; the supervisor's tamper line of the refused loopback ports now makes it tampered.
    history = History.from_events([_start(0), _summary(0), _start(1), _summary(1),
                                   {"type": "tamper", "found": "attempted", "packets": 251, "ports": [8474],
                                    "what": "loopback TCP connections to ports the submission was not given"}])
    verdict = tamper_evidence.check(history, {}, RUN)
    assert verdict.status == TAMPERED and "8474" in verdict.summary and verdict.evidence[0]["packets"] == 251
    intact = History.from_events([_start(0), _summary(0), _start(1), _summary(1)])
    assert tamper_evidence.check(intact, {}, RUN).status == VALID


def test_faults_read_back_unchanged_are_valid_and_exercised():
    history = History.from_events([_start(0), _summary(0), _start(1), _summary(1, checks=9)])
    verdict = tamper_evidence.check(history, {}, RUN)
    assert verdict.status == VALID and verdict.exercised
    assert "17 times" in verdict.summary and [e["fault"] for e in verdict.evidence] == [0, 1]


def test_nothing_read_back_is_unknown():
    unread = History.from_events([_start(0), _summary(0, "unread", checks=0), _start(1), _summary(1, "unread", 0)])
    assert tamper_evidence.check(unread, {}, RUN).status == UNKNOWN
    # A run recorded before the checks existed: faults applied, no tamper line at all.
    assert tamper_evidence.check(History.from_events([_start(0), _start(1)]), {}, RUN).status == UNKNOWN
    # One of two faults never read back: the run cannot vouch for it.
    assert tamper_evidence.check(History.from_events([_start(0), _summary(0), _start(1)]), {}, RUN).status == UNKNOWN


def test_no_network_fault_is_idle_and_valid():
    verdict = tamper_evidence.check(History.from_events([]), {}, {"seed": 1, "schedule": []})
    assert verdict.status == VALID and not verdict.exercised


def test_tampered_ranks_worst_counts_always_and_is_registered():
    assert combine(["valid", "invalid", "tampered", "unknown"]) == TAMPERED
    assert combine(["valid", "invalid", "unknown"]) == "invalid"
    assert "tamper_evidence" in CHECKERS
    assert counts({"invariant": "tamper_evidence", "status": TAMPERED}, ["lost_accepted_work"])


def test_a_tampered_scenario_fails_its_checklist_rows_and_requirements_as_tampered():
    scenario = {"name": "database-outages-past-lease", "verdict": "tampered", "seed": 4242,
                "requirements": ["BE-JOB-003", "BE-JOB-006"], "verifies": ["BE-JOB-003.1"],
                "checks": ["lost_accepted_work", "bounded_retries", "duplicate_effects", "state_regression"],
                "verdicts": [{"invariant": n, "status": "valid", "exercised": True, "summary": "fine", "evidence": []}
                             for n in ("lost_accepted_work", "bounded_retries", "duplicate_effects",
                                       "state_regression")]
                + [{"invariant": "tamper_evidence", "status": "tampered", "exercised": True,
                    "summary": "proxy re-enabled", "evidence": []}]}
    rows = checklist_rows([scenario], [])
    assert rows["BE-JOB-003.1"]["status"] == "tampered" and "proxy re-enabled" in rows["BE-JOB-003.1"]["why"]
    assert _by_scenarios("BE-JOB-006", [scenario], [], True)["status"] == "tampered"
    assert REQUIREMENT_STATUS["tampered"] == "tampered"


# --- the watcher, on a fake Toxiproxy -------------------------------------------------------------------------------

class FakeProxies:
    """The subset of ScopedToxiproxy NetworkFaults uses, in memory; ``heal_everything`` is what a cheat does."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proxies = {s: {"enabled": True, "listen": None, "upstream": f"127.0.0.1:{n}", "toxics": {}}
                        for n, s in enumerate(("postgres", "rabbitmq", "s3"))}
        self.resets = 0

    def states(self):
        with self.lock:
            return {s: {**p, "toxics": dict(p["toxics"])} for s, p in self.proxies.items()}

    def cut(self, service):
        self.proxies[service]["enabled"] = False

    def restore(self, service):
        self.proxies[service]["enabled"] = True

    def latency(self, service, ms, jitter_ms=0, stream="downstream"):
        self.proxies[service]["toxics"][f"latency_{stream}"] = {
            "type": "latency", "stream": stream, "toxicity": 1.0, "attributes": {"latency": ms, "jitter": jitter_ms}}
        return f"latency_{stream}"

    def remove_toxic(self, service, name):
        del self.proxies[service]["toxics"][name]

    def heal_everything(self):
        with self.lock:
            for proxy in self.proxies.values():
                proxy["enabled"], proxy["toxics"] = True, {}

    def is_clean(self):
        return all(p["enabled"] and not p["toxics"] for p in self.proxies.values())

    def reset(self):
        self.resets += 1
        self.heal_everything()


def _lines(path):
    return History.load(path)


def _in_fault_thread(index, fn):
    """Run ``fn`` in a thread named as the runner names a fault step's (``fault-<index>``)."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", fn()), name=f"fault-{index}")
    thread.start()
    thread.join()
    return out.get("r")


def test_the_harness_own_apply_remove_and_heal_are_never_tampering(tmp_path):
    proxies = FakeProxies()
    with HistoryWriter(tmp_path / "h.jsonl") as writer:
        network = NetworkFaults(proxies, writer, verify_every=0.02)
        _in_fault_thread(0, lambda: network.apply("postgres", "cut"))
        name = _in_fault_thread(1, lambda: network.apply("s3", "latency", {"ms": 200}))
        time.sleep(0.2)
        _in_fault_thread(0, lambda: network.remove("postgres", "cut", None))
        time.sleep(0.1)
        sup = Supervisor(tmp_path / "sup")
        heal_all(sup, proxies, set(), writer, timeout=1)  # the heal resets what is still in force: its own change
        assert name == "latency_downstream" and proxies.resets == 1
    history = _lines(tmp_path / "h.jsonl")
    tampers = history.of_type("tamper")
    assert [e for e in tampers if e["found"] != "intact"] == []
    assert {(e["fault"], e["link"], e.get("ended")) for e in tampers} == {(0, "postgres", "removed"),
                                                                          (1, "s3", "at heal")}
    assert all(e["checks"] >= 3 for e in tampers)
    verdict = tamper_evidence.check(history, {}, {"seed": 1, "schedule": [
        {"index": 0, "action": "toxic"}, {"index": 1, "action": "toxic"}]})
    assert verdict.status == VALID and verdict.exercised


@pytest.mark.parametrize("kind,params", [("cut", None), ("latency", {"ms": 150, "jitter_ms": 50})])
def test_a_fault_healed_by_someone_else_is_recorded_with_fault_and_time(tmp_path, kind, params):
    proxies = FakeProxies()
    with HistoryWriter(tmp_path / "h.jsonl") as writer:
        network = NetworkFaults(proxies, writer, verify_every=0.02)
        name = _in_fault_thread(3, lambda: network.apply("postgres", kind, params))
        time.sleep(0.1)
        proxies.heal_everything()  # what tests/cheats/heal_toxiproxy does ten times a second
        time.sleep(0.2)
        _in_fault_thread(3, lambda: network.remove("postgres", kind, name))  # already gone: no error, recorded
    history = _lines(tmp_path / "h.jsonl")
    changed = [e for e in history.of_type("tamper") if not e.get("summary")]
    assert len(changed) == 1 and changed[0]["fault"] == 3 and changed[0]["found"] == "changed"
    assert changed[0]["what"] == ("proxy re-enabled" if kind == "cut" else "toxic deleted")
    assert changed[0]["in_force_seconds"] >= 0.1
    summary = [e for e in history.of_type("tamper") if e.get("summary")]
    assert summary[0]["found"] == "changed" and summary[0]["changes"] == [changed[0]["what"]]
    assert [e["phase"] for e in history.of_type("fault")] == ["start", "end"]
    verdict = tamper_evidence.check(history, {}, {"seed": 7, "scenario": {"name": "s"}, "schedule": [
        {"index": 3, "action": "toxic"}]})
    assert verdict.status == TAMPERED and verdict.evidence[0]["fault"] == 3


def test_a_changed_toxic_and_an_added_one_are_tampering(tmp_path):
    proxies = FakeProxies()
    with HistoryWriter(tmp_path / "h.jsonl") as writer:
        network = NetworkFaults(proxies, writer, verify_every=0.02)
        name = _in_fault_thread(0, lambda: network.apply("s3", "latency", {"ms": 200}))
        with proxies.lock:
            proxies.proxies["s3"]["toxics"][name]["toxicity"] = 0.0  # present, but never applied
            proxies.proxies["s3"]["toxics"]["other"] = {"type": "latency", "stream": "upstream", "toxicity": 1.0,
                                                        "attributes": {}}
        time.sleep(0.15)
        with proxies.lock:
            del proxies.proxies["s3"]["toxics"]["other"]
        _in_fault_thread(0, lambda: network.remove("s3", "latency", name))
    whats = {e["what"] for e in _lines(tmp_path / "h.jsonl").of_type("tamper") if not e.get("summary")}
    assert whats == {"toxic changed", "toxic added"}


# --- the probe through a cut proxy ----------------------------------------------------------------------------------

def test_probe_tells_a_refused_port_from_a_listening_one():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        assert probe_refused(f"127.0.0.1:{port}") is False
    finally:
        listener.close()
    assert probe_refused(f"127.0.0.1:{port}") is True
    assert probe_refused(None) is None


def test_scoped_proxies_read_their_state_and_close():
    from harness.toxiproxy import ScopedToxiproxy

    class Server:
        deleted: list = []

        def proxies(self):
            return {"t-postgres": {"enabled": False, "listen": "127.0.0.1:1", "upstream": "127.0.0.1:2",
                                   "toxics": [{"name": "latency_downstream", "type": "latency", "stream": "downstream",
                                               "toxicity": 1, "attributes": {"latency": 5, "jitter": 0}}]}}

        def delete_proxy(self, name):
            self.deleted.append(name)

    scoped = ScopedToxiproxy(Server(), {"postgres": "t-postgres", "s3": "t-s3"})
    states = scoped.states()
    assert states["s3"] is None and states["postgres"]["enabled"] is False
    assert states["postgres"]["toxics"]["latency_downstream"]["attributes"] == {"latency": 5, "jitter": 0}
    scoped.close()
    assert Server.deleted == ["t-postgres", "t-s3"]


# --- every report shows it, never as valid ---------------------------------------------------------------------------

def test_every_report_of_a_tampered_grade_says_tampered(tmp_path):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from synthetic_grade import SEED, _scenario, _verdict, backlog_history  # noqa: E402

    from harness.grade import aggregate
    from harness.report import junit, summary, write_grade_reports
    from harness.report.table import csv_text, html as table_html, row_from_grade

    grade_dir = tmp_path / "grade"
    entry = _scenario(grade_dir, "database-outages-past-lease", "cut twice", ["BE-JOB-003", "BE-JOB-006"], [],
                      backlog_history(5), {"setup": 1.0},
                      [_verdict("lost_accepted_work", "valid", ["BE-JOB-001"], "all terminal"),
                       _verdict("tamper_evidence", "tampered", [], "proxy re-enabled on postgres",
                                [{"message": "fault 0 (cut on postgres): proxy re-enabled", "fault": 0, "t": 5.2}])])
    entry["verdict"] = "tampered"  # as the runner combines it
    results = aggregate(grade_dir, {"name": "cheat", "path": "/nowhere/adapter.toml", "level": 4}, 4, SEED, [entry],
                        [], {"total": 1.0}, {"BE-JOB-003": ["database-outages-past-lease"]},
                        {"BE-JOB-003.1": ["database-outages-past-lease"]})
    assert results["verdict"] == "tampered"
    assert results["requirements"]["BE-JOB-003"]["status"] == "tampered"
    write_grade_reports(grade_dir, results)  # results.json validated against the report schema on the way
    assert json.loads((grade_dir / "results.json").read_text())["verdict"] == "tampered"
    md = (grade_dir / "summary.md").read_text()
    assert md.startswith("# Grade of cheat at level 4 — 🚫 TAMPERED") and "✅ valid" not in md.split("\n")[0]
    assert 'type="tampered"' in junit.render(results) and 'type="tampered"' in (grade_dir / "junit.xml").read_text()
    assert 'pill tampered' in (grade_dir / "index.html").read_text()
    row = row_from_grade("cheat", "/nowhere/adapter.toml", results, 1.0, None)
    assert row.verdict == "tampered" and "tamper_evidence" in row.reason
    assert ",tampered," in csv_text([row]) and "pill tampered" in table_html([row], {})
    from harness.cli import EXIT
    from harness.grade_many import exit_code

    assert EXIT["tampered"] != 0 and exit_code([row]) == 1
    assert summary.MARK["tampered"] != summary.MARK["valid"]


def test_a_tampered_requirement_says_why_once():
    from harness.grade import requirement_checklist

    scenario = {"name": "database-outages-past-lease", "verdict": "tampered", "seed": 4242,
                "requirements": ["BE-JOB-003"], "verifies": ["BE-JOB-003.1"], "checks": ["lost_accepted_work"],
                "verdicts": [{"invariant": "tamper_evidence", "status": "tampered", "exercised": True,
                              "summary": "proxy re-enabled", "evidence": []}]}
    rows = checklist_rows([scenario], [])
    requirement = requirement_checklist([scenario], [], None, rows)["BE-JOB-003"]
    assert requirement["status"] == "tampered" and requirement["why"].count("proxy re-enabled") == 1


# --- the tap: a message published straight into it --------------------------------------------------------------

class _Management:
    """What the tap reads of the broker: two messages in the tap queue."""

    def __init__(self, messages):
        self.messages = messages

    def get(self, queue, count=100, requeue=False):
        got, self.messages = self.messages, []
        return got


class _Lines:
    def __init__(self):
        self.events = []

    def append(self, event_type, /, **fields):
        self.events.append({"type": event_type, **fields})


def test_a_message_published_straight_into_the_tap_queue_is_tampered_not_the_systems():
    from harness.broker.rabbitmq import Tap

    job = '{"job_id": "j-1", "attachment_id": "a-1", "attempt": 1}'
    copied = {"exchange": "attachments", "routing_key": "jobs", "payload": job, "payload_encoding": "string",
              "properties": {"message_id": "m-1"}}
    forged = {"exchange": "", "routing_key": "harness.tap", "payload": job.replace("j-1", "j-2"),
              "payload_encoding": "string", "properties": {}}
    lines = _Lines()
    tap = Tap(_Management([copied, forged]), lines, "jobs", None)
    assert tap.drain_once() == 1
    assert [m["body"]["job_id"] for m in tap.messages] == ["j-1"]  # the forged one is not the system's
    [tamper] = [e for e in lines.events if e["type"] == "tamper"]
    assert tamper["found"] == "changed" and tamper["link"] == "harness.tap" and "sha256" in tamper["observed"]
    verdict = tamper_evidence.check(History.from_events(lines.events), {}, {**RUN, "schedule": []})
    assert verdict.status == TAMPERED and "tap" in verdict.summary, verdict.summary
