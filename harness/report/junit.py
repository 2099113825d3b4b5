"""junit.xml for CI systems: one testsuite per scenario, one testcase per invariant."""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

from ..checkers import counts
from ..checklist import NOT_EXERCISED, ROW_STATUSES, shown_status


def _suite(parent, scenario_result: dict) -> ET.Element:
    verdicts = scenario_result.get("verdicts") or []
    name = (scenario_result.get("scenario") or {}).get("name") or scenario_result.get("name")
    declared = (scenario_result.get("scenario") or scenario_result).get("checks")
    failures = sum(v["status"] in ("invalid", "tampered") for v in verdicts)
    errors = sum(v["status"] == "unknown" and counts(v, declared) for v in verdicts) + \
        (1 if scenario_result.get("error") else 0)
    suite = ET.SubElement(parent, "testsuite", name=str(name), tests=str(len(verdicts) + (1 if scenario_result.get("error") else 0)),
                          failures=str(failures), errors=str(errors),
                          time=f"{sum(v for v in (scenario_result.get('timings') or {}).values() if isinstance(v, (int, float))):.3f}")
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="seed", value=str(scenario_result.get("seed")))
    ET.SubElement(props, "property", name="reproduce", value=str(scenario_result.get("reproduce", "")))
    if scenario_result.get("error"):
        case = ET.SubElement(suite, "testcase", classname=f"harness.{name}", name="run")
        ET.SubElement(case, "error", message=scenario_result["error"])
    for v in verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"harness.{name}", name=v["invariant"])
        text = json.dumps(v.get("evidence", [])[:10], indent=1, default=str)
        if v["status"] in ("invalid", "tampered"):  # tampered: the harness's faults changed under it, a failure
            ET.SubElement(case, "failure", message=v["summary"], type=v["status"]).text = text
        elif v["status"] == "unknown" and counts(v, declared):
            ET.SubElement(case, "error", message=v["summary"], type="unknown").text = text
        elif v["status"] == "unknown":
            ET.SubElement(case, "skipped", message=f"not counted (the scenario does not rely on it): {v['summary']}")
        elif shown_status(v) == NOT_EXERCISED:  # proved nothing: never a green testcase
            ET.SubElement(case, "skipped", message=f"{NOT_EXERCISED}: {v['summary']}")
    return suite


def _checklist_suite(parent, rows: dict) -> ET.Element:
    """One testcase per verification item of the seeds: a CI system shows the checklist as tests."""
    # Each row status is one junit kind (harness/checklist.py ROW_STATUSES): a failure, an error, skipped or a pass.
    kind = {row_id: ROW_STATUSES.get(row["status"], (None, "skipped" if row["status"] == "skipped" else "error"))[1]
            for row_id, row in rows.items()}
    suite = ET.SubElement(parent, "testsuite", name="checklist", tests=str(len(rows)),
                          failures=str(sum(k == "failure" for k in kind.values())),
                          errors=str(sum(k == "error" for k in kind.values())),
                          skipped=str(sum(k == "skipped" for k in kind.values())))
    for item_id, row in rows.items():
        case = ET.SubElement(suite, "testcase", classname=f"checklist.{row['requirement']}",
                             name=f"{item_id} {row['meaning']}")
        if kind[item_id] in ("failure", "error"):
            ET.SubElement(case, kind[item_id], message=row["why"], type=row["status"])
        elif kind[item_id] == "skipped":
            ET.SubElement(case, "skipped", message=f"{row['status']}: {row['why']}")
        else:
            ET.SubElement(case, "system-out").text = row["why"]
    return suite


def render(results: dict) -> str:
    root = ET.Element("testsuites", name=f"harness {results.get('run_id')}")
    if results.get("kind") == "grade":
        if results.get("checklist"):
            _checklist_suite(root, results["checklist"])
        for scenario in results.get("scenarios", []):
            _suite(root, scenario)
    else:
        _suite(root, results)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
