"""Every checker is proven on a broken variant (tests/broken/), and docs/TRACK-RECORD.md says which — or why not."""

from __future__ import annotations

import importlib.util
import re

from harness import scenarios
from harness.checkers import CHECKERS
from harness.schemas import REPO_ROOT

# Checkers that judge the harness and are never invalid, each explained in docs/TRACK-RECORD.md: their broken
# variant leaves its scenario unknown (UNKNOWN_CASES).
WITHOUT_VARIANT = {"fault_coverage", "copies_raced"}


def broken_variants_module():
    path = REPO_ROOT / "tests" / "integration" / "harness" / "test_harness_broken_variants.py"
    spec = importlib.util.spec_from_file_location("broken_variant_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases() -> list[tuple[str, str, set[str]]]:
    return broken_variants_module().CASES


def cheat_cases() -> list[tuple[str, str, set[str]]]:
    """tests/cheats/: submissions that tamper with what the harness set up, graded ``tampered`` in CI."""
    path = REPO_ROOT / "tests" / "integration" / "harness" / "test_harness_cheats.py"
    spec = importlib.util.spec_from_file_location("cheat_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


def test_every_checker_has_a_broken_variant_in_ci_or_a_written_reason():
    proven = {name for _, _, invariants in cases() + cheat_cases() for name in invariants}
    assert set(CHECKERS) - WITHOUT_VARIANT <= proven, sorted(set(CHECKERS) - WITHOUT_VARIANT - proven)
    assert WITHOUT_VARIANT <= set(CHECKERS)
    unknown = broken_variants_module().UNKNOWN_CASES
    assert WITHOUT_VARIANT <= {name for _, _, invariants in unknown for name in invariants}
    readme = (REPO_ROOT / "tests" / "broken" / "README.md").read_text()
    for variant, _scenario, _ in unknown:
        assert (REPO_ROOT / "tests" / "broken" / variant / "main.py").is_file() and f"`{variant}/`" in readme


def test_every_case_names_a_variant_folder_a_catalogue_scenario_and_registered_checkers():
    known = {s.name for s in scenarios.catalogue()}
    for variant, scenario, invariants in cases():
        folder = REPO_ROOT / "tests" / "broken" / variant
        assert (folder / "adapter.toml").is_file() and (folder / "main.py").is_file(), variant
        assert scenario in known, (variant, scenario)
        assert invariants <= set(CHECKERS), (variant, invariants)


def test_the_track_record_and_the_broken_readme_list_every_case():
    record = (REPO_ROOT / "docs" / "TRACK-RECORD.md").read_text()
    readme = (REPO_ROOT / "tests" / "broken" / "README.md").read_text()
    for variant, scenario, invariants in cases():
        rows = [line for line in record.splitlines() if line.startswith("|") and f"`{variant}`" in line]
        assert rows and f"`{scenario}`" in rows[0], variant
        assert all(f"`{name}`" in rows[0] for name in invariants), (variant, invariants)
        assert f"`{variant}/`" in readme, variant
    for name in WITHOUT_VARIANT:
        assert re.search(rf"^\| [^|]*`{name}`", record, re.M), name


def test_every_cheat_has_its_folder_a_catalogue_scenario_and_a_row():
    known = {s.name for s in scenarios.catalogue()}
    record = (REPO_ROOT / "docs" / "TRACK-RECORD.md").read_text()
    readme = (REPO_ROOT / "tests" / "cheats" / "README.md").read_text()
    for cheat, scenario, invariants in cheat_cases():
        folder = REPO_ROOT / "tests" / "cheats" / cheat
        assert (folder / "adapter.toml").is_file() and (folder / "main.py").is_file(), cheat
        assert scenario in known and invariants <= set(CHECKERS), (cheat, scenario, invariants)
        assert f"`{cheat}/`" in readme, cheat
        rows = [line for line in record.splitlines() if line.startswith("|") and f"`{cheat}`" in line]
        assert rows and f"`{scenario}`" in rows[0] and all(f"`{n}`" in rows[0] for n in invariants), cheat
