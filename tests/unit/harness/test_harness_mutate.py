"""`harness mutate` (harness/mutate.py): the reference's mutation catalogue stays in step with the reference, a
mutant really runs its mutated copy, and a mutant's outcome is read from its grade the way the docs say."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import mutate
from harness.scenarios import catalogue as scenario_catalogue

CATALOGUE = mutate.load(mutate.catalogue_path("reference"))


def test_catalogue_has_a_dozen_or_more_distinct_mutants():
    assert len(CATALOGUE.mutants) >= 12
    assert len({m.name for m in CATALOGUE.mutants}) == len(CATALOGUE.mutants)
    assert CATALOGUE.folder.name == "reference" and (CATALOGUE.folder / "worker.py").is_file()


@pytest.mark.parametrize("mutant", CATALOGUE.mutants, ids=lambda m: m.name)
def test_every_mutant_text_occurs_exactly_once_in_the_reference(mutant):
    """A refactor of the reference that makes a mutant stale fails here, naming the mutant."""
    count = mutate.matches(mutant, CATALOGUE.folder)
    assert count == 1, (f"mutant {mutant.name} is stale: its text occurs {count} times in reference/{mutant.file} "
                        f"(update harness/mutations/reference.toml)")


@pytest.mark.parametrize("mutant", CATALOGUE.mutants, ids=lambda m: m.name)
def test_every_mutant_names_catalogue_scenarios(mutant):
    names = {s.name for s in scenario_catalogue()}
    assert mutant.scenarios and set(mutant.scenarios) <= names, mutant.scenarios


def test_a_mutant_runs_its_mutated_copy(tmp_path):
    """The roles import the package by name: with the mutant's PYTHONPATH the copy is what runs, not the checkout
    (the installed package is an editable install of the checkout)."""
    mutant = next(m for m in CATALOGUE.mutants if m.name == "retry-budget-ge-to-gt")
    adapter_file = mutate.prepare(CATALOGUE, mutant, tmp_path)
    assert adapter_file == tmp_path / "reference" / "adapter.toml"
    text = adapter_file.read_text()
    assert f'PYTHONPATH = "{tmp_path}"' in text and 'name = "mutant-retry-budget-ge-to-gt"' in text
    probe = ("import reference.backoff as b; print(b.__file__); "
             "print(b.AttemptBudget(max_attempts=5).exhausted(5))")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    mutated = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True,
                             cwd="/")
    where, exhausted = mutated.stdout.split()
    assert Path(where).resolve().is_relative_to(tmp_path.resolve())
    assert exhausted == "False"  # the mutant: 5 attempts of 5 are not yet the budget
    env.pop("PYTHONPATH")
    plain = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True,
                           cwd="/")
    assert plain.stdout.split()[1] == "True"  # the reference itself is untouched
    assert mutant.find in (CATALOGUE.folder / mutant.file).read_text()


def test_the_mutated_copy_finds_what_it_reads_beside_its_package(tmp_path):
    """The first run without this killed an equivalent mutant by lost_accepted_work: the copy's relay could not
    find schemas/jobs.schema.json next to the copied package and published nothing."""
    mutate.prepare(CATALOGUE, CATALOGUE.mutants[0], tmp_path)
    probe = "import reference.messages as m; print(m.__file__); print(sorted(m.schema()))"
    run = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, cwd="/")
    assert run.returncode == 0, run.stderr[-2000:]
    assert Path(run.stdout.split()[0]).resolve().is_relative_to(tmp_path.resolve())


def test_the_mutant_adapter_passes_the_adapter_check(tmp_path):
    from harness.adapter_check import check

    mutant = CATALOGUE.mutants[0]
    report = check(mutate.prepare(CATALOGUE, mutant, tmp_path), 5)
    assert report.ok, [str(p) for p in report.problems]


def test_a_text_not_found_once_is_stale(tmp_path):
    (tmp_path / "x.py").write_text("a >= b\na >= b\n")
    twice = mutate.Mutant("m", ">=-to->", "x.py", "a >= b", "a > b", ["s"])
    with pytest.raises(mutate.CatalogueError, match="stale.*2 times"):
        mutate.apply(twice, tmp_path)
    gone = mutate.Mutant("m", ">=-to->", "y.py", "a >= b", "a > b", ["s"])
    assert mutate.matches(gone, tmp_path) == 0


def _results(*scenarios):
    return {"scenarios": [{"name": n, "verdict": v, "verdicts": [{"invariant": c, "status": s} for c, s in checks]}
                          for n, v, checks in scenarios]}


def test_outcome_killed_names_the_checker():
    r = mutate.outcome_of(_results(("a", "valid", [("x", "valid")]),
                                   ("b", "invalid", [("ack_after_commit", "invalid"), ("y", "valid")])), "done")
    assert r["outcome"] == "killed" and r["checkers"] == ["ack_after_commit"] and "b invalid" in r["why"]


def test_outcome_survived_only_when_every_scenario_is_valid():
    assert mutate.outcome_of(_results(("a", "valid", [])), "done")["outcome"] == "survived"
    unsure = mutate.outcome_of(_results(("a", "valid", []), ("b", "unknown", [("lease_renewal", "unknown")])), "done")
    assert unsure["outcome"] == "unknown" and unsure["why"] == "b unknown by lease_renewal"
    assert mutate.outcome_of(_results(), "done")["outcome"] == "unknown"  # nothing ran: nothing proven
    assert mutate.outcome_of(_results(("a", "valid", [])), "timeout")["outcome"] == "unknown"
    assert mutate.outcome_of(None, "did not start", "setup failed")["outcome"] == "unknown"


def test_score_counts_killed_over_killed_and_survived():
    rows = [{"outcome": o} for o in ("killed", "killed", "survived", "unknown", "stale")]
    assert mutate.score(rows) == pytest.approx(2 / 3)
    assert mutate.score([{"outcome": "unknown"}]) is None
    md = mutate.table_md([{**r, "name": f"m{k}", "kind": "k", "file": "f", "covering": ["s"], "why": "w|x"}
                          for k, r in enumerate(rows)], {"sut": "reference", "seed": 7, "seconds": 3})
    assert "Score: 0.67" in md and "w/x" in md


def test_only_names_unknown_mutants_are_refused():
    with pytest.raises(mutate.CatalogueError, match="no-such-mutant"):
        mutate.run("reference", 1, only=["no-such-mutant"], reports_dir=Path("/nonexistent"))
