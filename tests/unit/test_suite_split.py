"""`make test`'s two workers: the split of tests/conftest.py sends what it should where it should."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root_conftest(pytestconfig: pytest.Config):
    plugin = pytestconfig.pluginmanager.get_plugin(str(REPO / "tests" / "conftest.py"))
    assert plugin is not None, "tests/conftest.py is not loaded under the name pytest gives it"
    return plugin


def test_the_grades_are_files_that_exist(root_conftest):
    """A renamed grade test would fall back to the stack's worker, silently making the suite longer."""
    for nodeid_prefix in root_conftest.GRADES:
        assert (REPO / nodeid_prefix).is_file(), nodeid_prefix


def test_the_stack_is_one_unit_the_grades_another_and_the_unit_tests_split_by_module(root_conftest):
    unit = root_conftest.work_unit
    stack = {unit("tests/integration/reference/test_reference_delivery.py::test_a"),
             unit("tests/integration/harness/test_harness_soak_short.py::test_b[x]"),
             unit("tests/benchmarks/test_batch_bench.py::test_c"), unit("tests/cheats/fork_bomb/test.py::t")}
    assert len(stack) == 1 and None not in stack
    others = unit("tests/integration/harness/test_harness_grade_ts_example.py::test_d")
    assert others == unit("tests/integration/harness/test_harness_grade_go_example.py::test_e") \
        == unit("tests/integration/harness/test_harness_broken_variants.py::test_f[a-b]") \
        == unit("tests/integration/harness/test_harness_grade_reference.py::test_g")
    assert others is not None and others not in stack
    assert unit("tests/unit/harness/test_a.py::test_x") is None  # xdist's own split: by module


def test_the_scheduler_splits_by_the_work_units(root_conftest):
    pytest.importorskip("xdist")
    scheduling = root_conftest.stack_apart_scheduling()
    split = object.__new__(scheduling)._split_scope  # the split reads nothing of the scheduler's state
    assert split("tests/unit/harness/test_a.py::test_x") == "tests/unit/harness/test_a.py"
    assert split("tests/integration/stack/test_stack.py::test_y") == "the stack"
    assert split("tests/integration/harness/test_harness_grade_go_example.py::t") == "the grades"
