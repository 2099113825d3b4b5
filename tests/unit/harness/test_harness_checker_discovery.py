"""Checkers are registered by discovery: each module of harness/checkers/ declares its name, requirements, the
timings and capabilities it needs and the tags it proves, and every list the harness keeps of them is computed from
those declarations (checkers.CHECKERS and ALWAYS_COUNTED, adapter_check.TIMING_CHECKERS / EVERY_SCENARIO / NEEDS,
the checklist's ``check:tag`` claims)."""

from __future__ import annotations

import re

from harness import adapter_check, checklist
from harness.checkers import ALWAYS_COUNTED, CHECKERS, declarations, timing_checkers
from harness.checklist import wiring_problems
from harness.schemas import REPO_ROOT

FOLDER = REPO_ROOT / "harness" / "checkers"


def checker_sources() -> dict[str, str]:
    return {p.stem: p.read_text() for p in FOLDER.glob("*.py") if not p.stem.startswith("_") and p.stem != "base"}


def test_every_module_of_the_folder_is_a_registered_checker_under_its_own_name():
    sources = checker_sources()
    assert {m.__name__.rsplit(".", 1)[1] for m in CHECKERS.values()} == set(sources)
    for name, module in CHECKERS.items():
        assert module.NAME == name and callable(module.check), name
        assert isinstance(module.REQUIREMENTS, (list, tuple)) and all(r.startswith("BE-JOB-") for r in module.REQUIREMENTS)


def test_the_harness_lists_of_checkers_are_computed_from_their_declarations():
    assert adapter_check.TIMING_CHECKERS == timing_checkers()
    for timing, names in adapter_check.TIMING_CHECKERS.items():
        for name in names:
            assert timing in CHECKERS[name].TIMINGS, (timing, name)
    assert adapter_check.EVERY_SCENARIO == {n for n, m in CHECKERS.items() if getattr(m, "TIMINGS_IN_EVERY_SCENARIO", 0)}
    assert adapter_check.EVERY_SCENARIO == {"bounded_retries"}
    assert set(adapter_check.NEEDS) == set(declarations("NEEDS"))
    assert ALWAYS_COUNTED == {n for n, m in CHECKERS.items() if getattr(m, "ALWAYS_COUNTED", False)}
    assert ALWAYS_COUNTED >= {"fault_coverage", "lost_accepted_work", "message_hygiene"}


def test_declared_timings_are_adapter_timings_and_needs_are_labelled():
    timings = set(adapter_check._timing_names())
    for name, module in CHECKERS.items():
        assert set(getattr(module, "TIMINGS", ())) <= timings, name
        for need, label in getattr(module, "NEEDS", ()):
            assert need and label, name


def test_every_tag_a_checker_sets_is_declared_and_every_row_is_wired():
    """A verdict's ``proves=[...]`` in a checker's source names only tags of its PROVES, and every checklist row
    names registered checkers and declared tags (checklist.wiring_problems)."""
    for stem, text in checker_sources().items():
        module = next(m for m in CHECKERS.values() if m.__name__.endswith("." + stem))
        used = {tag for group in re.findall(r"proves=\[([^\]]*)\]", text) for tag in re.findall(r'"([^"]+)"', group)}
        assert used <= set(getattr(module, "PROVES", ())), (stem, used)
    assert wiring_problems() == []


def test_wiring_problems_names_an_unregistered_check_and_an_undeclared_tag():
    without_copies = {n: m for n, m in CHECKERS.items() if n != "copies_raced"}
    problems = wiring_problems(without_copies)
    assert any("'copies_raced' is no registered checker" in p for p in problems)

    class NoTags:
        NAME = "ack_after_commit"
        PROVES = ()

    problems = wiring_problems({**CHECKERS, "ack_after_commit": NoTags})
    assert problems == ["BE-JOB-001.3: ack_after_commit declares no PROVES tag 'ack_vs_commit'"]
    assert checklist.BY_ID["BE-JOB-001.3"].claims == (("ack_after_commit:ack_vs_commit",),)
