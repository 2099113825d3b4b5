"""The grade-many table writer: Markdown, CSV and HTML rows from synthetic grade results."""

from __future__ import annotations

import csv
import io
from xml.etree import ElementTree as ET

from harness.report import table

REQS = [f"BE-JOB-00{i}" for i in range(1, 8)]
META = {"title": "Grades at level 4", "facts": {"level": 4, "base seed": 77, "submissions": 4}}


def grade_results(verdict: str, statuses: dict[str, str], scenarios=()) -> dict:
    """The parts of a grade's results.json the table reads."""
    return {"kind": "grade", "verdict": verdict, "scenarios": list(scenarios),
            "requirements": {rid: {"status": statuses.get(rid, "skipped"), "why": f"why {rid}"} for rid in REQS}}


def rows() -> list[table.Row]:
    valid = table.row_from_grade("alice", "class/alice/adapter.toml",
                                 grade_results("valid", {r: "pass" for r in REQS}), 61.24, "alice/grade-1/index.html",
                                 reproduce="harness grade --sut class/alice/adapter.toml --level 4 --seed 77")
    failing = table.row_from_grade(
        "bob", "class/bob/adapter.toml",
        grade_results("invalid", {"BE-JOB-001": "fail", "BE-JOB-002": "pass"}, [
            {"name": "window-commit-publish-failpoint", "verdict": "invalid",
             "verdicts": [{"invariant": "lost_accepted_work", "status": "invalid"},
                          {"invariant": "duplicate_effects", "status": "valid"}]},
            {"name": "poison-message", "verdict": "valid", "verdicts": []}]),
        42.0, "bob/grade-1/index.html")
    timeout = table.row_from_grade("carol", "class/carol/adapter.toml",
                                   grade_results("unknown", {"BE-JOB-001": "pass", "BE-JOB-002": "unknown"}), 600.3,
                                   "carol/grade-1/index.html", verdict="timeout",
                                   reason="time limit of 600s reached during broker-restart (3 of 17 scenarios finished)")
    bad = table.Row("dave | the pipe", "class/dave/adapter.toml", "invalid adapter", {}, 0.1, None,
                    "roles.api.command[0]: program 'nope' not found")
    return [valid, failing, timeout, bad]


def test_rows_from_grades_carry_verdict_statuses_and_reason():
    valid, failing, timeout, bad = rows()
    assert valid.verdict == "valid" and valid.reason == "" and valid.requirements == {r: "pass" for r in REQS}
    assert failing.verdict == "invalid" and failing.requirements["BE-JOB-001"] == "fail"
    # The reason names the failing scenario and the check that failed it, not the valid ones.
    assert failing.reason == "window-commit-publish-failpoint: lost_accepted_work"
    assert timeout.verdict == "timeout" and "time limit" in timeout.reason and timeout.requirements["BE-JOB-002"] == "unknown"
    assert bad.requirements == {} and bad.report is None


def test_markdown_has_one_row_per_submission_and_every_requirement_column():
    text = table.markdown(rows(), META)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| # |"))
    assert [c.strip() for c in header.strip("|").split("|")] == \
        ["#", "submission", "adapter", "verdict", *REQS, "time", "report", "reason"]
    body = [line for line in lines if line.startswith("| ") and not line.startswith("| # |")]
    assert len(body) == 4
    alice, bob, carol, dave = body
    assert "✅ valid" in alice and alice.count("✅") == 1 + 7 and "[report](alice/grade-1/index.html)" in alice
    assert "❌ invalid" in bob and "lost_accepted_work" in bob
    assert "⏱ timeout" in carol and "600.3s" in carol and "3 of 17 scenarios finished" in carol
    assert "⛔ invalid adapter" in dave and "program 'nope' not found" in dave and "[report]" not in dave
    # A pipe inside a cell is escaped: the row still has exactly as many cells as the header.
    assert "dave \\| the pipe" in dave
    cells = [c for c in dave.replace("\\|", "¦").strip("|").split("|")]
    assert len(cells) == len(header.strip("|").split("|"))
    assert "base seed: 77" in text and "Totals: 1 valid, 1 invalid, 1 timeout, 1 invalid adapter" in text


def test_csv_is_machine_readable_with_plain_words():
    parsed = list(csv.DictReader(io.StringIO(table.csv_text(rows()))))
    assert list(parsed[0]) == table.CSV_COLUMNS
    assert [r["verdict"] for r in parsed] == ["valid", "invalid", "timeout", "invalid adapter"]
    assert parsed[0]["BE-JOB-004"] == "pass" and parsed[1]["BE-JOB-001"] == "fail"
    assert parsed[1]["BE-JOB-003"] == "skipped" and parsed[3]["BE-JOB-001"] == ""
    assert parsed[2]["seconds"] == "600.3" and parsed[3]["report"] == ""
    assert parsed[3]["name"] == "dave | the pipe" and "not found" in parsed[3]["reason"]


def test_html_table_uses_the_shared_stylesheet_and_links_each_report():
    page = table.html(rows(), META)
    assert "body.report" in page and ".pill" in page  # reports/templates/report.css, inlined
    assert "font-family: system-ui" in page  # reports/templates/timeline.css, inlined before it
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    start, end = page.index('<table class="many">'), page.index("</table>") + len("</table>")
    tree = ET.fromstring(page[start:end])  # the table itself is well-formed markup
    trs = tree.findall("tr")
    assert len(trs) == 2 + 4  # two header rows: the requirement columns are grouped under one heading
    assert [th.get("title").split(":")[0] for th in trs[1]] == REQS and [th.text for th in trs[1]][0] == "001"
    trs = [trs[0]] + trs[2:]
    links = [a.get("href") for a in tree.iter("a")]
    assert links == ["alice/grade-1/index.html", "bob/grade-1/index.html", "carol/grade-1/index.html"]
    verdict_pills = [tr.findall("td")[3].find("span") for tr in trs[1:]]
    assert [p.get("class") for p in verdict_pills] == ["pill valid", "pill invalid", "pill timeout",
                                                       "pill invalid-adapter"]
    dave = trs[4]
    assert all(td.find("span").get("class") == "pill none" for td in dave.findall("td")[4:11])
    assert "program 'nope' not found" in "".join(dave.itertext())
    assert trs[1].findall("td")[1].get("title").startswith("harness grade --sut class/alice")


def test_a_long_runs_timeline_draws_every_named_attachment_then_an_even_sample():
    from harness.report import timeline

    ids = [f"a{i:05d}" for i in range(10_000)]
    results = {"verdicts": [{"status": "invalid", "evidence": [{"attachment_id": "a09999"}, {"message": "x"}]},
                            {"status": "valid", "evidence": [{"attachment_id": "a00001"}]}]}
    rows = timeline._rows(ids, results)
    assert len(rows) == timeline.MAX_ROWS and "a09999" in rows and rows == sorted(rows)
    assert rows[0] == "a00000" and rows[-1] == "a09999"  # the sample spans the whole run
    assert timeline._rows(ids[:10], results) == ids[:10]
