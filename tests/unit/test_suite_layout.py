"""The suite is collected as one tree of rootless test modules: two test files with one basename stop the whole
collection ("import file mismatch"), so `make test` would run nothing."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_basename_of_its_own():
    names = Counter(path.name for path in TESTS.rglob("test_*.py") if "__pycache__" not in path.parts)
    assert not [name for name, count in names.items() if count > 1], sorted(
        str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if names[p.name] > 1)
