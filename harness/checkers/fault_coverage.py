"""Did the scenario's faults actually happen? A failpoint that never fired, a trigger that never came or a
republish with nothing to republish leaves its window untested: the run says `unknown`, not `valid`. Each fault kind
answers for itself (``happened`` in chaos/kinds/<action>.py, pure over the history). A crash at a failure window —
a timed SIGKILL (``exactness="approximate"``) or a failpoint the implementation placed — counts as hitting its window
only with the evidence ``WINDOW_RULES`` (chaos/kinds/_windows.py) names for that window, from the history alone."""

from __future__ import annotations

from typing import Any

from ..history import History
from .base import UNKNOWN, VALID, Verdict, evidence, seed_of, FinalState, RunInfo

NAME = "fault_coverage"
REQUIREMENTS: list[str] = []
ALWAYS_COUNTED = True  # a scheduled fault that never happened makes any scenario unknown


def _happened(step: dict[str, Any], history: History, final: dict[str, Any] | None = None) -> tuple[bool, str]:
    """Ask the step's fault kind (chaos/kinds/<action>.py, its ``happened``): each kind knows what it leaves behind.
    A kind that does not say is not proven."""
    from chaos.kinds import REGISTRY

    action = step.get("action")
    kind = REGISTRY.get(action) if isinstance(action, str) else None
    if kind is None:
        return False, f"unknown action {action!r}"
    happened = getattr(kind, "happened", None)
    if happened is None:
        return False, f"the {action} kind does not say what shows it happened (no happened()): not proven"
    verdict: tuple[bool, str] = happened(step, history, final or {})
    return verdict


def _landed(step: dict[str, Any], history: History) -> bool:
    """The kind's own word that its fault was done even though ``happened`` is False (a timed kill that landed
    outside its window); False for kinds that do not say."""
    from chaos.kinds import REGISTRY

    landed = getattr(REGISTRY.get(str(step.get("action"))), "landed", None)
    return bool(landed and landed(step, history))


def check(history: History, final: FinalState, run: RunInfo) -> Verdict:
    missing, done, outside = [], [], []
    for step in run.get("schedule") or []:
        happened, what = _happened(step, history, final)
        item = evidence(f"fault {step.get('index')} ({step.get('action')}): {what}", fault=step.get("index"))
        if happened:
            done.append(item)
        elif _landed(step, history):
            outside.append({**item, "window_missed": True})
        else:
            missing.append(item)
    if outside and not missing:
        # A fault the kind says was done but missed its aim (a timed kill outside its window, a kill of child
        # processes in a role that has none) tested nothing about its target (so the scenario proves no row: harness/grade.py), but nothing the
        # scenario judges is in doubt either. A failpoint crash without its window's evidence stays unknown.
        return Verdict(NAME, VALID, REQUIREMENTS,
                       f"{len(outside)} faults were done but missed what they aimed at (first: "
                       f"{outside[0]['message']}): it was not tested in this run (its rows are proven elsewhere or "
                       "not at all)", exercised=False,
                       evidence=outside + done, seed=seed_of(run))
    missing += outside
    if missing:
        unproven = any("no evidence it was hit" in e["message"] for e in missing)
        return Verdict(NAME, UNKNOWN, REQUIREMENTS,
                       f"{len(missing)} scheduled faults did not happen: their windows were not tested"
                       + (" (a crash with no evidence it was hit in its window)" if unproven else ""),
                       evidence=missing, seed=seed_of(run))
    return Verdict(NAME, VALID, REQUIREMENTS, f"all {len(done)} scheduled faults happened", exercised=bool(done),
                   evidence=done, seed=seed_of(run))
