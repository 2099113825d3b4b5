"""Every checker is proven on a broken variant (tests/broken/), and docs/TRACK-RECORD.md says which — or why not."""

from __future__ import annotations

import importlib.util
import re

from harness import scenarios
from harness.checkers import CHECKERS
from harness.schemas import REPO_ROOT

# Checkers no broken implementation can fail, each explained in docs/TRACK-RECORD.md.
WITHOUT_VARIANT = {"fault_coverage"}


def cases() -> list[tuple[str, str, set[str]]]:
    path = REPO_ROOT / "tests" / "integration" / "harness" / "test_harness_broken_variants.py"
    spec = importlib.util.spec_from_file_location("broken_variant_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


def test_every_checker_has_a_broken_variant_in_ci_or_a_written_reason():
    proven = {name for _, _, invariants in cases() for name in invariants}
    assert set(CHECKERS) - WITHOUT_VARIANT <= proven, sorted(set(CHECKERS) - WITHOUT_VARIANT - proven)
    assert WITHOUT_VARIANT <= set(CHECKERS)


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
