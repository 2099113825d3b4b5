"""`harness mutate`: how much of an implementation's critical code the scenarios would notice going wrong.

A mutation catalogue (harness/mutations/<sut>.toml) lists mutants of one implementation: each is ONE text change to
one file of its folder (an exact text that must occur exactly once, its replacement, the operator kind) and the
scenarios that cover that code. For each mutant the implementation's folder is copied to a temporary folder, the
change applied there, and an adapter written into the copy: the original adapter with ``PYTHONPATH`` set to the
copy's parent, so the roles' ``import <package>`` finds the mutated copy before the installed one (a unit test
imports a mutated copy that way). The mutant is then graded on its covering scenarios only, every mutant on ONE
shared stack (harness/grade_many.py's machinery: a tenant per scenario, ``--jobs N`` side by side), and ends:

- ``killed``: a scenario is ``invalid`` (or ``tampered``); the checkers that said so are named;
- ``survived``: every covering scenario is ``valid``;
- ``unknown``: neither proven (a scenario ``unknown``, the grade did not start, timed out or failed);
- ``stale``: the text was not found exactly once (the implementation changed under the catalogue).

Score = killed / (killed + survived). Results: ``results.json`` and ``table.md`` in
``<reports>/mutate-<stamp>-<sut>-s<seed>/``, next to each mutant's grade folder.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import adapter as adapter_mod

CATALOGUE_DIR = Path(__file__).resolve().parent / "mutations"
OUTCOMES = ("killed", "survived", "unknown", "stale")
KILLING = ("invalid", "tampered")


class CatalogueError(ValueError):
    pass


@dataclass
class Mutant:
    name: str
    kind: str
    file: str
    find: str
    replace: str
    scenarios: list[str]
    breaks: str = ""


@dataclass
class Catalogue:
    path: Path
    sut: str
    package: str
    mutants: list[Mutant] = field(default_factory=list)
    beside: list[str] = field(default_factory=list)  # paths next to the package it reads (linked beside the copy)

    @property
    def adapter_path(self) -> Path:
        return adapter_mod.resolve_path(self.sut)

    @property
    def folder(self) -> Path:
        """The implementation's folder (the package copied for each mutant): the adapter's own folder."""
        return self.adapter_path.parent


def catalogue_path(sut: str) -> Path:
    """``--sut NAME`` -> harness/mutations/NAME.toml; a path to a .toml file is taken as it is."""
    given = Path(sut)
    if given.suffix == ".toml" and given.is_file():
        return given
    path = CATALOGUE_DIR / f"{given.name}.toml"
    if not path.is_file():
        raise CatalogueError(f"no mutation catalogue for {sut!r} (looked for {path})")
    return path


def load(path: Path | str) -> Catalogue:
    path = Path(path)
    data = tomllib.loads(path.read_text())
    mutants, seen = [], set()
    for k, raw in enumerate(data.get("mutant") or [], start=1):
        missing = [key for key in ("name", "kind", "file", "find", "replace", "scenarios") if key not in raw]
        if missing:
            raise CatalogueError(f"{path}: mutant #{k} lacks {', '.join(missing)}")
        if raw["name"] in seen:
            raise CatalogueError(f"{path}: mutant name {raw['name']!r} twice")
        if raw["find"] == raw["replace"]:
            raise CatalogueError(f"{path}: mutant {raw['name']!r} changes nothing")
        if not raw["scenarios"]:
            raise CatalogueError(f"{path}: mutant {raw['name']!r} names no covering scenario")
        seen.add(raw["name"])
        mutants.append(Mutant(raw["name"], raw["kind"], raw["file"], raw["find"], raw["replace"],
                              list(raw["scenarios"]), raw.get("breaks", "")))
    return Catalogue(path, data["sut"], data.get("package", data["sut"]), mutants, list(data.get("beside") or []))


def matches(mutant: Mutant, folder: Path) -> int:
    """How often the mutant's text occurs in its file of ``folder`` (0 when the file is gone)."""
    target = folder / mutant.file
    return target.read_text().count(mutant.find) if target.is_file() else 0


def apply(mutant: Mutant, folder: Path) -> None:
    """Apply the mutant to its file in ``folder`` (a copy); CatalogueError unless its text occurs exactly once."""
    target = folder / mutant.file
    count = matches(mutant, folder)
    if count != 1:
        raise CatalogueError(f"stale: {mutant.file} holds the text of {mutant.name} {count} times (needs exactly 1)")
    target.write_text(target.read_text().replace(mutant.find, mutant.replace, 1))


def mutant_adapter_text(original: str, mutant_name: str, pythonpath: Path) -> str:
    """The original adapter, renamed for the mutant, with PYTHONPATH first in its [env] (the copy wins the import)."""
    lines = original.splitlines()
    out, env_done, named = [], False, False
    for line in lines:
        if not named and line.strip().startswith("name") and line.split("=", 1)[0].strip() == "name":
            out.append(f'name = "mutant-{mutant_name}"')
            named = True
            continue
        out.append(line)
        if not env_done and line.strip() == "[env]":
            out.append(f'PYTHONPATH = "{pythonpath}"  # harness mutate: the mutated copy is imported first')
            env_done = True
    if not env_done:
        out += ["", "[env]", f'PYTHONPATH = "{pythonpath}"']
    return "\n".join(out) + "\n"


def prepare(catalogue: Catalogue, mutant: Mutant, root: Path) -> Path:
    """Copy the implementation into ``root``/<package>, apply the mutant, write its adapter; the adapter's path."""
    copy = root / catalogue.package
    shutil.copytree(catalogue.folder, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    apply(mutant, copy)
    for name in catalogue.beside:  # e.g. the reference reads schemas/jobs.schema.json next to its package folder
        source = catalogue.folder.parent / name
        if not source.exists():
            raise CatalogueError(f"{catalogue.path.name}: beside path {name} not found next to {catalogue.folder}")
        (root / name).symlink_to(source, target_is_directory=source.is_dir())
    adapter_file = copy / catalogue.adapter_path.name
    adapter_file.write_text(mutant_adapter_text(catalogue.adapter_path.read_text(), mutant.name, root))
    return adapter_file


def outcome_of(results: dict | None, ended: str | None = None, reason: str | None = None) -> dict:
    """A mutant's outcome from its grade's results (harness/grade.py's dict) over its covering scenarios only."""
    if results is None:
        return {"outcome": "unknown", "why": f"not graded: {ended or 'no result'}" + (f" ({reason})" if reason else ""),
                "checkers": [], "scenarios": {}}
    scenarios = {s["name"]: s["verdict"] for s in results.get("scenarios") or []}
    killers = []
    for s in results.get("scenarios") or []:
        if s["verdict"] in KILLING:
            for v in s.get("verdicts") or []:
                if v.get("status") in KILLING and v.get("invariant") not in killers:
                    killers.append(v["invariant"])
    if killers or any(v in KILLING for v in scenarios.values()):
        bad = [n for n, v in scenarios.items() if v in KILLING]
        return {"outcome": "killed", "why": f"{', '.join(bad)} invalid by {', '.join(killers) or 'an unnamed check'}",
                "checkers": killers, "scenarios": scenarios}
    if scenarios and all(v == "valid" for v in scenarios.values()) and ended in (None, "done"):
        return {"outcome": "survived", "why": "every covering scenario valid", "checkers": [],
                "scenarios": scenarios}
    doubtful = {n: v for n, v in scenarios.items() if v != "valid"}
    unsure = {s["name"]: [v["invariant"] for v in s.get("verdicts") or [] if v.get("status") == s["verdict"]]
              for s in results.get("scenarios") or [] if s["verdict"] != "valid"}
    why = (", ".join(f"{n} {v}" + (f" by {', '.join(unsure[n])}" if unsure.get(n) else "")
                     for n, v in doubtful.items()) if doubtful else "no scenario finished")
    if ended not in (None, "done"):
        why += f"; the grade ended: {ended}" + (f" ({reason})" if reason else "")
    return {"outcome": "unknown", "why": why, "checkers": [], "scenarios": scenarios}


def score(rows: list[dict]) -> float | None:
    killed = sum(1 for r in rows if r["outcome"] == "killed")
    survived = sum(1 for r in rows if r["outcome"] == "survived")
    return None if killed + survived == 0 else killed / (killed + survived)


def table_md(rows: list[dict], meta: dict) -> str:
    s = score(rows)
    counts = {o: sum(1 for r in rows if r["outcome"] == o) for o in OUTCOMES}
    lines = [f"# Mutation run of {meta['sut']} (seed {meta['seed']})", "",
             f"Score: {'n/a' if s is None else f'{s:.2f}'} = killed {counts['killed']} / (killed {counts['killed']} "
             f"+ survived {counts['survived']}); unknown {counts['unknown']}, stale {counts['stale']}; "
             f"{meta.get('seconds', 0):.0f} s.", "",
             "| mutant | kind | file | scenarios | outcome | why | seconds |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['name']}` | {r['kind']} | `{r['file']}` | {', '.join(r['covering'])} | "
                     f"**{r['outcome']}** | {r['why'].replace('|', '/')} | {r.get('seconds', 0):.0f} |")
    return "\n".join(lines) + "\n"


def run(sut: str, seed: int, *, only: list[str] | None = None, jobs: int = 1, reports_dir: Path | None = None,
        stack=None, progress=print, timeout: float = 900.0) -> tuple[list[dict], Path]:
    """Grade every mutant (or those named by ``only``) on one shared stack; the rows and the results folder."""
    from .grade_many import ClassGrade, RunGate, Submission
    from .runner import REPORTS_DIR

    catalogue = load(catalogue_path(sut))
    chosen = catalogue.mutants
    if only:
        unknown = sorted(set(only) - {m.name for m in chosen})
        if unknown:
            raise CatalogueError(f"no such mutant in {catalogue.path.name}: {', '.join(unknown)}")
        chosen = [m for m in chosen if m.name in only]
    original = adapter_mod.load(catalogue.adapter_path)
    level = int(original.level)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    out = Path(reports_dir or REPORTS_DIR) / f"mutate-{stamp}-{catalogue.sut}-s{seed}"
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    progress(f"mutate {catalogue.sut}: {len(chosen)} mutants from {catalogue.path}, seed {seed}, level {level}"
             + (f", {jobs} at a time" if jobs > 1 else ""))
    progress(f"results: {out}/table.md  {out}/results.json")
    jobs = max(1, int(jobs))
    gate = RunGate() if jobs > 1 else None
    shared = ClassGrade(out, level, seed, None, timeout, stack, progress, False)
    rows: dict[str, dict] = {}
    lock = threading.Lock()
    meta = {"sut": catalogue.sut, "seed": seed, "level": level, "catalogue": str(catalogue.path), "jobs": jobs,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def write() -> None:
        ordered = [rows[m.name] for m in chosen if m.name in rows]
        meta["seconds"] = round(time.monotonic() - began, 1)
        (out / "results.json").write_text(json.dumps({**meta, "score": score(ordered), "mutants": ordered}, indent=1))
        (out / "table.md").write_text(table_md(ordered, meta))

    def one(position: int, mutant: Mutant) -> None:
        t = time.monotonic()
        row = {"name": mutant.name, "kind": mutant.kind, "file": mutant.file, "covering": mutant.scenarios,
               "breaks": mutant.breaks,
               "reproduce": f"harness mutate --sut {sut} --only {mutant.name} --seed {seed}"}
        progress(f"[{position}/{len(chosen)}] {mutant.name} ({mutant.kind}, {mutant.file}) on "
                 f"{', '.join(mutant.scenarios)}")
        with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
            try:
                adapter_file = prepare(catalogue, mutant, Path(tmp))
            except CatalogueError as exc:
                row.update(outcome="stale", why=str(exc), checkers=[], scenarios={})
            else:
                if shared.ensure_stack() is None:
                    row.update(outcome="unknown", why=f"not graded: {shared.stack_error}", checkers=[], scenarios={})
                else:
                    grader = ClassGrade(out, level, seed, list(mutant.scenarios), timeout, shared.stack, progress,
                                        False)
                    grader.gate = gate
                    table_row = grader.one(Submission(mutant.name, adapter_file, str(adapter_file)))
                    results = grader.results.get(mutant.name)
                    ended = "done" if table_row.verdict not in ("did not start", "timeout", "error",
                                                                 "invalid adapter") else table_row.verdict
                    row.update(outcome_of(results, ended, table_row.reason))
                    row["report"] = table_row.report
        row["seconds"] = round(time.monotonic() - t, 1)
        with lock:
            rows[mutant.name] = row
            progress(f"[{position}/{len(chosen)}] {mutant.name}: {row['outcome'].upper()} in {row['seconds']:.0f}s"
                     f" — {row['why']}")
            write()

    try:
        if jobs == 1:
            for k, m in enumerate(chosen, start=1):
                one(k, m)
        else:
            with ThreadPoolExecutor(jobs, thread_name_prefix="mutant") as pool:
                for future in [pool.submit(one, k, m) for k, m in enumerate(chosen, start=1)]:
                    future.result()
    finally:
        shared.stop_stack()
    write()
    ordered = [rows[m.name] for m in chosen if m.name in rows]
    s = score(ordered)
    counts = {o: sum(1 for r in ordered if r["outcome"] == o) for o in OUTCOMES}
    progress(f"MUTATION SCORE {catalogue.sut} seed {seed}: {'n/a' if s is None else f'{s:.2f}'} "
             f"(killed {counts['killed']}, survived {counts['survived']}, unknown {counts['unknown']}, "
             f"stale {counts['stale']}) in {time.monotonic() - began:.0f}s")
    for r in ordered:
        if r["outcome"] == "survived":
            progress(f"  survivor: {r['name']} — {r['breaks']}")
    return ordered, out


def run_command(args, seed: int, progress=print) -> int:
    """Exit 0 when every mutant is killed, 1 when one survived, 2 when one is unknown or stale (and none survived)."""
    try:
        rows, _ = run(args.sut, seed, only=args.only.split(",") if args.only else None, jobs=args.jobs,
                      reports_dir=Path(args.reports) if args.reports else None, progress=progress)
    except CatalogueError as exc:
        progress(f"harness mutate: {exc}")
        return 2
    outcomes = {r["outcome"] for r in rows}
    if "survived" in outcomes:
        return 1
    return 2 if outcomes - {"killed"} else 0
