"""Checkers: one module per invariant, each a pure ``check(history, final, run) -> Verdict``, registered by discovery.

Every module of this folder whose name does not start with ``_`` (``base`` holds the shared views) is a checker and
declares what the rest of the harness needs to know about it; nothing else lists checkers:

* ``NAME`` — the invariant (the key in ``CHECKERS``, in scenarios' ``checks`` and in checklist rows);
* ``REQUIREMENTS`` — the requirement ids (BE-JOB-…) a verdict of it names;
* ``check(history, final, run) -> Verdict``;
* optionally ``TIMINGS`` — the adapter timings without which it says ``unknown`` where a scenario relies on it
  (``harness adapter check`` and the proof plan read :func:`timing_checkers`); ``TIMINGS_IN_EVERY_SCENARIO = True``
  when it runs, and needs them, in every scenario;
* optionally ``NEEDS`` — ``(need, label)`` pairs: a capability (``events``) or adapter field (``expiry.metric``)
  without which it says ``unknown``;
* optionally ``PROVES`` — the tags its valid verdicts may carry (``Verdict.proves``), which a checklist row may ask
  for as ``check:tag`` (harness/checklist.py);
* optionally ``ALWAYS_COUNTED = True`` — its ``unknown`` means observation itself failed, so it counts in every
  scenario (see :func:`counts`).

A new checker is its module here (and, for a checklist row to use it, the row in harness/checklist.py). This folder is
type-checked strictly (``make lint``: mypy, [tool.mypy] in pyproject.toml): ``check(history: History, final: FinalState,
run: RunInfo) -> Verdict``, the types from harness/history.py and base.py.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any, Iterable

from ..history import History
from .base import INVALID, TAMPERED, UNKNOWN, VALID, FinalState, RunInfo, Verdict, combine


def _discover() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if not callable(getattr(module, "check", None)):
            continue  # a shared helper module, not a checker
        if module.NAME in found:
            raise ImportError(f"two checkers named {module.NAME!r}: {found[module.NAME].__name__}, {module.__name__}")
        found[module.NAME] = module
    return found


CHECKERS: dict[str, ModuleType] = _discover()


def timing_checkers(timing_names: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
    """Timing -> the checkers that say ``unknown`` without it (their ``TIMINGS``), each tuple in checker-name order;
    the timings in ``timing_names`` order when given, else in the order the checkers (by name) declare them."""
    table: dict[str, list[str]] = {}
    for name in timing_names or ():
        table[name] = []
    for name, module in sorted(CHECKERS.items()):
        for timing in getattr(module, "TIMINGS", ()):
            table.setdefault(timing, []).append(name)
    return {timing: tuple(names) for timing, names in table.items() if names}


def declarations(attribute: str) -> dict[str, object]:
    """Checker name -> its value of ``attribute``, for the checkers that declare it."""
    return {name: getattr(module, attribute) for name, module in CHECKERS.items() if hasattr(module, attribute)}


# Invariants whose "cannot tell" always makes a scenario unknown: observation itself failed (no message seen, no
# upload accepted, a scheduled fault that never happened). Any other checker's unknown counts only in a scenario
# that declares it among its checks; elsewhere it proves nothing and is shown as not counted.
ALWAYS_COUNTED = frozenset(name for name, flag in declarations("ALWAYS_COUNTED").items() if flag)


def counts(verdict: Verdict | dict[str, Any], declared: list[str] | None) -> bool:
    """Whether this verdict's status decides the scenario's: every valid/invalid does; an unknown only if relied on."""
    data = verdict if isinstance(verdict, dict) else verdict.to_dict()
    return (data["status"] != UNKNOWN or declared is None or data["invariant"] in declared
            or data["invariant"] in ALWAYS_COUNTED)


def _canonical_final(final: FinalState) -> FinalState:
    import json

    from ..formats import canonical_ids, has_upper_uuid

    if isinstance(final, dict) and has_upper_uuid(json.dumps(final, default=str)):
        canonical: FinalState = canonical_ids(final)
        return canonical
    return final


def run_checks(history: History, final: FinalState, run: RunInfo,
               names: Iterable[str] | None = None) -> list[Verdict]:
    """Run the named checkers (default: all) and return their verdicts; a crashing checker yields unknown.
    UUIDs are case-insensitive: the final state is read with each in lower case, as the history is (formats.py)."""
    final = _canonical_final(final)
    verdicts: list[Verdict] = []
    for name in names or CHECKERS:
        module = CHECKERS[name]
        try:
            verdicts.append(module.check(history, final, run))
        except Exception as exc:  # a checker bug must not pass silently as valid
            verdicts.append(Verdict(name, UNKNOWN, list(module.REQUIREMENTS), f"checker crashed: {exc!r}",
                                    seed=run.get("seed")))
    return verdicts


__all__ = ["ALWAYS_COUNTED", "CHECKERS", "declarations", "timing_checkers", "INVALID", "TAMPERED", "UNKNOWN", "VALID", "Verdict", "combine", "counts", "run_checks"]
