"""A checklist row passes only on what was observed (issue 20, item 8).

Before: BE-JOB-001.3 passed on delivery_accounting alone (no ack ever compared with a commit), BE-JOB-002.3 and
004.2 on duplicate_effects when the copies never raced, BE-JOB-003.3 on dead_letter without a dead-letter queue
(all ``pass``); a level-3 grade showed level-4 rows as ``skipped`` and counted their requirements valid; a row behind
skipped scenarios only was ``unknown`` without saying what to declare. After: ``not proven`` (with the capability),
``not required``; a check that was not exercised is shown as such in every report, never green.
"""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

from harness import scenarios
from harness.checkers import copies_raced
from harness.checkers.base import UNKNOWN, VALID
from harness.checklist import BY_ID, ROW_STATUSES, shown_status
from harness.grade import aggregate, checklist_rows, skipped_entry
from harness.report import junit, summary
from harness.schemas import errors
from harness_histories import ATT, JOB, T0, Builder, happy, iso, job_message

SEED = 4242


def verdict(invariant, status="valid", exercised=True, summary_="s", proves=()):
    return {"invariant": invariant, "status": status, "exercised": exercised, "summary": summary_,
            "requirements": [], "evidence": [], "proves": list(proves)}


def entry(name, verifies, verdicts, checks=None):
    return {"name": name, "verdict": "valid", "seed": SEED, "level": 3, "verifies": list(verifies),
            "requirements": sorted({i.split(".")[0] for i in verifies}), "checks": checks, "verdicts": verdicts,
            "error": None, "run_dir": name}


def row(entries, item_id, skipped=()):
    return checklist_rows(list(entries), list(skipped), {item_id: []})[item_id]


def test_ack_against_commit_is_proven_only_by_a_crash_that_compared_them():
    alone = row([entry("poison", ["BE-JOB-001.3"], [verdict("delivery_accounting")])], "BE-JOB-001.3")
    assert alone["status"] == "not proven" and "ack_after_commit:ack_vs_commit" in alone["why"]
    compared = row([entry("crash", ["BE-JOB-001.3"], [verdict("delivery_accounting"),
                                                      verdict("ack_after_commit", proves=["ack_vs_commit"])])],
                   "BE-JOB-001.3")
    assert compared["status"] == "pass" and "[ack_vs_commit]" in compared["why"]
    broken = row([entry("crash", ["BE-JOB-001.3"], [verdict("delivery_accounting", "invalid", summary_="loop"),
                                                    verdict("ack_after_commit", proves=["ack_vs_commit"])])],
                 "BE-JOB-001.3")
    assert broken["status"] == "fail" and "loop" in broken["why"]  # it still judges the row


def test_atomic_dedup_needs_copies_that_raced():
    for item_id in ("BE-JOB-002.3", "BE-JOB-004.2"):
        calm = row([entry("dup", [item_id], [verdict("duplicate_effects"), verdict("copies_raced", "valid", False)])],
                   item_id)
        assert calm["status"] == "not proven" and "copies_raced:raced" in calm["why"], calm
        raced = row([entry("dup", [item_id], [verdict("duplicate_effects"),
                                              verdict("copies_raced", proves=["raced"])])], item_id)
        assert raced["status"] == "pass", raced


def test_isolation_without_a_replay_is_not_the_dead_letter_row():
    no_dlq = row([entry("unparseable", ["BE-JOB-003.3"], [verdict("dead_letter", summary_="isolation not declared")])],
                 "BE-JOB-003.3")
    assert no_dlq["status"] == "not proven"
    replayed = row([entry("unparseable", ["BE-JOB-003.3"], [verdict("dead_letter")]),
                    entry("poison-replay", ["BE-JOB-003.3"], [verdict("replay_audit")])], "BE-JOB-003.3")
    assert replayed["status"] == "pass"


def test_a_row_behind_skipped_scenarios_only_names_the_capability_to_declare():
    by_name = {s.name: s for s in scenarios.catalogue()}
    skipped = [skipped_entry(by_name["poison-replay"], "adapter lacks replay"),
               skipped_entry(by_name["dead-letter-replay"], "adapter lacks dlq_replay")]
    lone = row([], "BE-JOB-003.3", skipped)
    assert lone["status"] == "not proven"
    assert "declare [capabilities] replay = true" in lone["why"]
    assert "declare [capabilities] dlq_replay = true" in lone["why"]
    # With isolation ran but the replays skipped: still not proven, and it says what to declare.
    ran = row([entry("unparseable", ["BE-JOB-003.3"], [verdict("dead_letter")])], "BE-JOB-003.3", skipped)
    assert ran["status"] == "not proven" and "declare [capabilities] replay = true" in ran["why"]
    cluster = skipped_entry(by_name["cluster-leader-killed"], "needs a 3-node RabbitMQ cluster; the grade's stack has 1")
    assert "3-node RabbitMQ cluster" in cluster["needs"][0]


def test_level_3_grade_shows_level_4_rows_as_not_required_in_every_report(tmp_path):
    entries = [entry("crash", ["BE-JOB-001.3"], [verdict("ack_after_commit", proves=["ack_vs_commit"]),
                                                 verdict("message_hygiene", exercised=False, summary_="idle")])]
    required_items = {"BE-JOB-001.3": ["crash"]}
    results = aggregate(tmp_path, {"name": "fake", "level": 3, "path": None}, 3, SEED, entries, [], {"total": 1},
                        {"BE-JOB-001": ["crash"]}, required_items)
    assert errors("report.schema.json", json.loads(json.dumps(results))) == []
    assert results["checklist"]["BE-JOB-006.1"]["status"] == "not required"
    assert results["requirements"]["BE-JOB-006"]["status"] == "not required"
    assert set(row_["status"] for row_ in results["checklist"].values()) <= set(ROW_STATUSES)
    md = summary.grade_md(results)
    assert "⏭ not required" in md and "skipped" not in md.split("## Checklist")[1].split("## Level")[0]
    suite = ET.fromstring(junit.render(results)).find("testsuite[@name='checklist']")
    case = [c for c in suite if c.get("name").startswith("BE-JOB-006.1")][0]
    assert case.find("skipped") is not None and "not required" in case.find("skipped").get("message")


def test_a_check_that_was_not_exercised_is_never_shown_valid():
    idle = verdict("ack_after_commit", exercised=False, summary_="no crash while a job was in flight")
    assert shown_status(idle) == "not exercised" and shown_status(verdict("ack_after_commit")) == "valid"
    result = {"scenario": {"name": "s", "checks": ["ack_after_commit"]}, "verdicts": [idle], "seed": 1}
    cases = ET.fromstring(junit.render(result)).iter("testcase")  # one scenario's junit.xml
    idle_case = [c for c in cases if c.get("name") == "ack_after_commit"][0]
    assert idle_case.find("skipped") is not None and "not exercised" in idle_case.find("skipped").get("message")
    md = summary.scenario_md({"scenario": {"name": "s", "checks": ["ack_after_commit"]}, "verdict": "valid",
                              "verdicts": [idle], "seed": 1, "sut": {"name": "x", "level": 3}, "level": 3})
    assert "| ack_after_commit | ⚪ not exercised |" in md


# --- copies_raced: the race the rows name, seen in the broker's own deliveries -------------------------------------

def raced_history(second_channel: bool, after_ready: bool = False):
    b = Builder(scenario={"name": "concurrent-duplicate-delivery", "checks": ["duplicate_effects", "copies_raced"]},
                roles={"api": 1, "relay": 1, "worker": 2, "sweeper": 1})
    b.add(0.0, "observe", source="firehose", deliveries=True, queue="q")
    b.add(0.01, "role", role="worker#1", action="start")
    b.add(0.02, "role", role="worker#2", action="start")
    b.upload(0.1)
    b.add(0.3, "message", body=job_message(), properties={})
    publish = 3.0 if after_ready else 0.4
    b.add(publish, "fault", action="republish", phase="start", jobs=[JOB], copies=3, state="any")
    b.add(publish + 0.05, "fault", action="republish", phase="end", jobs=[JOB], routed=3)
    b.add(0.35, "delivery", queue="q", job_id=JOB, attachment_id=ATT, attempt=1, redelivered=False,
          connection="c1", channel=1)
    b.add(0.5, "delivery", queue="q", job_id=JOB, attachment_id=ATT, attempt=1, redelivered=False,
          connection="c2" if second_channel else "c1", channel=1)
    b.transitions(ATT, [(0.15, None, "queued", 1, "api"), (0.4, "queued", "processing", 1, "worker"),
                        (2.0, "processing", "ready", 1, "worker")])
    b.events.sort(key=lambda e: e["t"])
    for i, e in enumerate(b.events, start=1):
        e["seq"] = e["line"] = i
    return b


def test_copies_raced_only_when_two_consumers_held_the_job_before_it_was_done():
    b = raced_history(second_channel=True)
    v = copies_raced.check(b.history(), b.final, b.run)
    assert v.status == VALID and v.exercised and v.proves == ["raced"], v.summary
    one = raced_history(second_channel=False)  # active-standby: every copy on one consumer
    v = copies_raced.check(one.history(), one.final, one.run)
    assert v.status == UNKNOWN and "never met on two consumers" in v.summary and v.evidence[0]["fault"]
    late = raced_history(second_channel=True, after_ready=True)  # sequential redelivery, not a race
    v = copies_raced.check(late.history(), late.final, late.run)
    assert v.status == UNKNOWN and "after the job was already terminal" in v.summary


def test_a_republish_that_copied_nothing_is_named_by_its_fault():
    # Active-standby consumers: the republish waits for two consumers that never come, and the job it would copy is
    # done by then. The row stays unknown, and the evidence names the fault and why it did not happen.
    b = Builder(scenario={"name": "concurrent-duplicate-delivery", "checks": ["copies_raced"],
                          "faults": [{"action": "republish", "params": {"consumers": 2}}]})
    b.upload(0.1)
    b.add(10.5, "note", message="republish: the work queue had 1 consumers, not 2, after 10 s", fault=0)
    b.add(10.6, "fault", action="republish", phase="start", fault=0, jobs=[], copies=3, state="processing")
    v = copies_raced.check(b.history(), b.final, b.run)
    assert v.status == UNKNOWN and "no job was republished" in v.summary
    assert v.evidence[0]["fault"] == 0 and "1 consumers, not 2" in v.evidence[0]["message"], v.evidence


def test_copies_raced_has_nothing_to_say_without_a_republish():
    b = happy()
    v = copies_raced.check(b.history(), b.final, b.run)
    assert v.status == VALID and not v.exercised and not v.proves


def test_the_rows_proofs_name_registered_checks_of_the_row():
    for item in BY_ID.values():
        for claim in item.claims:
            for alternative in claim:
                assert alternative.partition(":")[0] in item.checks, (item.id, alternative)
    assert T0 and iso  # the shared builders are the ones the other checker tests use


def test_results_json_names_each_verdict_by_the_word_the_reports_show(tmp_path):
    from harness.grade import scenario_entry

    idle = verdict("ack_after_commit", exercised=False, summary_="no crash")
    result = {"scenario": {"name": "s", "level": 3, "requirements": ["BE-JOB-001"]}, "verdict": "valid", "seed": 1,
              "verdicts": [idle, verdict("lost_accepted_work")]}
    got = scenario_entry(result, tmp_path / "s", tmp_path, 1.0)
    assert [v["shown"] for v in got["verdicts"]] == ["not exercised", "valid"]
