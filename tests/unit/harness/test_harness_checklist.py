"""The grader's checklist: the seeds' 24 verification items as rows, judged only by checks that were exercised."""

from __future__ import annotations

import json
from collections import Counter
from xml.etree import ElementTree as ET

from harness import scenarios
from harness.checkers import CHECKERS
from harness.checklist import BY_ID, ITEMS
from harness.grade import aggregate, checklist_rows, items_required_at, requirement_checklist
from harness.report import junit, summary
from harness.schemas import errors

SEED = 4242


def verdict(invariant, status="valid", exercised=True, summary_="s", proves=()):
    return {"invariant": invariant, "status": status, "exercised": exercised, "summary": summary_,
            "requirements": [], "evidence": [], "proves": list(proves)}


ACKED = ["ack_vs_commit"]  # what ack_after_commit proves when a crash compared an ack with a commit


def entry(name, verifies, verdicts, verdict_="valid", checks=None, requirements=None, error=None):
    return {"name": name, "verdict": verdict_, "seed": SEED, "level": 3, "verifies": list(verifies),
            "requirements": requirements or sorted({i.split(".")[0] for i in verifies}), "checks": checks,
            "verdicts": verdicts, "error": error, "run_dir": name}


# --- the rows themselves -----------------------------------------------------------------------------------------

def test_the_checklist_is_the_seeds_24_items_per_requirement():
    seeds = [item for item in ITEMS if item.level <= 4]  # level 5: three rows of pipeline versions (track 5)
    assert len(seeds) == 24 and len(BY_ID) == 27
    assert [i.id for i in ITEMS if i.level == 5] == ["BE-JOB-002.4", "BE-JOB-002.5", "BE-JOB-002.6"]
    per_requirement = Counter(item.requirement for item in seeds)
    # The seeds' "Проверка" lists: 3, 3, 3, 3, 4, 4, 4 entries for BE-JOB-001 … 007.
    assert [per_requirement[f"BE-JOB-00{i}"] for i in range(1, 8)] == [3, 3, 3, 3, 4, 4, 4]
    for item in ITEMS:
        assert item.seed and item.meaning and item.checks and item.level in (3, 4, 5), item


def test_every_scenario_names_known_rows_of_its_own_requirements():
    for s in scenarios.catalogue():
        for item_id in s.raw.get("verifies") or []:
            assert item_id in BY_ID, (s.name, item_id)
            assert BY_ID[item_id].requirement in s.raw["requirements"], (s.name, item_id)


def test_every_row_names_registered_checkers():
    for item in ITEMS:
        assert set(item.checks) <= set(CHECKERS), (item.id, set(item.checks) - set(CHECKERS))


def test_every_row_up_to_level_4_is_provoked_by_a_scenario_that_declares_one_of_its_checks():
    required = items_required_at(4, scenarios.catalogue())
    by_name = {s.name: s for s in scenarios.catalogue()}
    for item_id, names in required.items():
        assert names, f"{item_id}: no scenario of the catalogue provokes it"
        declared = [n for n in names if by_name[n].checks is None or set(BY_ID[item_id].checks) & set(by_name[n].checks)]
        assert declared, f"{item_id}: its scenarios {names} declare none of its checks {BY_ID[item_id].checks}"


def test_rows_required_at_a_level_are_those_of_that_level_and_below():
    assert {i for i in items_required_at(3, [])} == {item.id for item in ITEMS if item.level == 3}
    assert len(items_required_at(4, [])) == sum(item.level <= 4 for item in ITEMS)


# --- judging a row -----------------------------------------------------------------------------------------------

def rows_for(entries, skipped=(), required=None):
    return checklist_rows(list(entries), list(skipped), required)


def test_a_row_passes_only_on_an_exercised_valid_check_of_its_own():
    rows = rows_for([entry("crash", ["BE-JOB-001.3"], [verdict("ack_after_commit", proves=ACKED)])])
    assert rows["BE-JOB-001.3"]["status"] == "pass"
    assert "crash (seed 4242): ack_after_commit" in rows["BE-JOB-001.3"]["why"]
    idle = rows_for([entry("crash", ["BE-JOB-001.3"], [verdict("ack_after_commit", exercised=False,
                                                               summary_="nothing in flight at the crash")])])
    assert idle["BE-JOB-001.3"]["status"] == "not proven"
    assert "nothing in flight at the crash" in idle["BE-JOB-001.3"]["why"]
    # A valid check that is not one of the row's own proves nothing for it.
    other = rows_for([entry("crash", ["BE-JOB-001.3"], [verdict("lost_accepted_work")])])
    assert other["BE-JOB-001.3"]["status"] == "not proven"


def test_a_check_the_scenario_does_not_declare_does_not_count():
    rows = rows_for([entry("crash", ["BE-JOB-001.3"], [verdict("ack_after_commit", proves=ACKED)],
                           checks=["duplicate_effects"])])
    assert rows["BE-JOB-001.3"]["status"] == "not proven"


def test_an_invalid_or_unknown_check_of_the_row_decides_it_whatever_the_others_say():
    bad = entry("a", ["BE-JOB-002.1"], [verdict("duplicate_effects", "invalid", summary_="second ready")], "invalid")
    good = entry("b", ["BE-JOB-002.1"], [verdict("duplicate_effects")])
    rows = rows_for([good, bad])
    assert rows["BE-JOB-002.1"]["status"] == "fail" and "second ready" in rows["BE-JOB-002.1"]["why"]
    blind = entry("c", ["BE-JOB-002.1"], [verdict("duplicate_effects", "unknown", summary_="no S3 listing")], "unknown")
    assert rows_for([good, blind])["BE-JOB-002.1"]["status"] == "unknown"
    crashed = entry("d", ["BE-JOB-002.1"], [], "unknown", error="stack died")
    assert rows_for([good, crashed])["BE-JOB-002.1"]["status"] == "unknown"


def test_a_row_nothing_provokes_is_missing_skipped_is_not_proven_above_its_level_not_required():
    required = {"BE-JOB-003.2": []}
    rows = rows_for([], required=required)
    assert rows["BE-JOB-003.2"]["status"] == "missing"
    assert rows["BE-JOB-006.1"]["status"] == "not required"  # not required by this (level-3-like) grade
    skipped = [{"name": "retry", "reason": "adapter lacks failpoints", "verifies": ["BE-JOB-003.2"],
                "needs": ["failpoints"]}]
    rows = rows_for([], skipped, required)
    assert rows["BE-JOB-003.2"]["status"] == "not proven"
    assert "declare [capabilities] failpoints = true in the adapter" in rows["BE-JOB-003.2"]["why"]


# --- a requirement from its rows ---------------------------------------------------------------------------------

def test_a_requirement_passes_only_when_every_required_row_does():
    entries = [entry("w1", ["BE-JOB-001.1", "BE-JOB-001.3"], [verdict("ack_after_commit", proves=ACKED)]),
               entry("w2", ["BE-JOB-001.2"], [verdict("lost_accepted_work")])]
    required = {"BE-JOB-001": ["w1", "w2"]}
    all_rows = {"BE-JOB-001.1": ["w1"], "BE-JOB-001.2": ["w2"], "BE-JOB-001.3": ["w1"]}
    rows = rows_for(entries, required=all_rows)
    req = requirement_checklist(entries, [], required, rows)["BE-JOB-001"]
    assert req["status"] == "pass" and "3 checklist rows" in req["why"]
    one_missing = rows_for(entries[:1], required=all_rows)
    req = requirement_checklist(entries[:1], [], required, one_missing)["BE-JOB-001"]
    assert req["status"] == "unknown" and "BE-JOB-001.2 missing" in req["why"]


def test_a_scenario_invalid_by_a_check_outside_the_rows_still_fails_its_requirement():
    scenario = entry("w1", ["BE-JOB-002.1"], [verdict("duplicate_effects"),
                                              verdict("state_regression", "invalid", summary_="ready→queued")],
                     "invalid")
    scenario["verdicts"][1]["requirements"] = ["BE-JOB-002"]
    rows = rows_for([scenario], required={"BE-JOB-002.1": ["w1"]})
    assert rows["BE-JOB-002.1"]["status"] == "pass"  # its own check was fine
    req = requirement_checklist([scenario], [], {"BE-JOB-002": ["w1"]}, rows)["BE-JOB-002"]
    assert req["status"] == "fail" and "state_regression" in req["why"]


def test_the_grade_results_carry_the_rows_in_every_report(tmp_path):
    entries = [entry("w1", ["BE-JOB-001.3"], [verdict("ack_after_commit", proves=ACKED)])]
    results = aggregate(tmp_path, {"name": "fake", "level": 3, "path": None}, 3, SEED, entries, [], {"total": 1},
                        {"BE-JOB-001": ["w1"]}, {"BE-JOB-001.1": [], "BE-JOB-001.3": ["w1"]})
    assert errors("report.schema.json", json.loads(json.dumps(results))) == []
    assert results["checklist"]["BE-JOB-001.3"]["status"] == "pass"
    assert results["checklist"]["BE-JOB-001.1"]["status"] == "missing"
    assert results["verdict"] == "unknown"  # a required row nothing provoked: the grade cannot vouch for it
    md = summary.grade_md(results)
    assert "| BE-JOB-001.1 |" in md and "⛔ missing" in md and "сопоставление подтверждения" in md
    suite = ET.fromstring(junit.render(results)).find("testsuite[@name='checklist']")
    assert suite is not None and suite.get("tests") == str(len(ITEMS)) and suite.get("errors") == "1"
