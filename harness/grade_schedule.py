"""A grade's scheduling: run the chosen scenarios on the stack — one after another, or ``parallel`` side by side
(the longest first), a scenario that restarts a service alone or on a second stack of its own beside the others,
the next scenarios' tenants made ahead (harness/tenants_ahead.py), and under grade-many's run gate when several
submissions share the stack. Returns what each run recorded; judging it is harness/grade_checklist.py's."""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from . import tenants_ahead
from .grade_checklist import scenario_entry
from .grade_plan import expected_seconds, runs_alone
from .run_setup import template_key
from .runner import ScenarioRun, database_template, prepare_ahead


@dataclass
class Schedule:
    """What running a grade's scenarios produced, for the aggregate and "where the time went"."""

    entries: dict[str, dict] = field(default_factory=dict)  # scenario name -> its entry (grade_checklist)
    phase_totals: dict[str, float] = field(default_factory=dict)
    run_timings: dict[str, tuple[dict, dict]] = field(default_factory=dict)  # name -> (timings, timings_detail)
    beside: list = field(default_factory=list)  # the scenarios meant for the second stack
    fallback: list = field(default_factory=list)  # those of them that ran on the first (it did not start)
    ahead_stats: dict | None = None
    templates: list[dict] = field(default_factory=list)  # [setup] template = true: each stack's templates

    def time_went_extra(self, timings: dict) -> dict:
        return {**({"beside": {"scenarios": [s.name for s in self.beside if s not in self.fallback],
                               "stack_start": timings.get("stack_beside_start")}} if self.beside else {}),
                **({"tenants_ahead": self.ahead_stats} if self.ahead_stats else {}),
                **({"templates": self.templates} if self.templates else {})}


def run_scenarios(chosen, adapter, stack, seed: int, level: int, grade_dir: Path, timings: dict, *, progress,
                  parallel: int = 1, own_stack: bool = False, keep_data: bool = False, gate=None) -> Schedule:
    """Run ``chosen`` on ``stack`` (``timings`` gets each scenario's seconds and the second stack's start). A
    scenario that restarts a service every run depends on runs on a second stack of its own, beside the others,
    when the grade started its stack (``own_stack``); otherwise (or declared exclusive) it runs alone, before the
    others. ``gate`` (grade-many --jobs N): each scenario runs under its shared side, one that restarts a service
    under its exclusive side."""
    out = Schedule()
    lock = threading.Lock()
    active: dict[str, ScenarioRun] = {}
    started = iter(range(1, len(chosen) + 1))
    alone = [s for s in chosen if parallel > 1 and runs_alone(s)]
    # Restarting a service of its own second stack disturbs no other run: these run one after another on it, side by
    # side with the shared scenarios, instead of holding every other run back while they restart the shared one.
    beside = out.beside = [s for s in alone if own_stack and not s.raw.get("exclusive")]
    alone = [s for s in alone if s not in beside]

    def run_one(scenario, on_stack=None) -> None:
        with lock:
            index = next(started)
        progress(f"--- [{index}/{len(chosen)}] {scenario.name} (level {scenario.level}, "
                 f"{', '.join(scenario.raw['requirements'])})")
        t = time.monotonic()
        run_dir = grade_dir / scenario.name
        run = ScenarioRun(scenario, adapter, on_stack or stack, seed, level, run_dir=run_dir, progress=progress)
        exclusive = ahead is not None and scenario in alone
        if exclusive:
            ahead.hold()
        run.tenants_ahead = ahead
        with lock:
            active[scenario.name] = run
        try:
            if gate is None:
                result = run.execute()
            else:  # grade-many --jobs N: a scenario that restarts a shared service runs with no other submission's
                with (gate.exclusive() if runs_alone(scenario) else gate.shared()):
                    result = run.execute()
        finally:
            if exclusive:
                ahead.resume()
            with lock:
                active.pop(scenario.name, None)
        seconds = time.monotonic() - t
        with lock:
            timings[f"scenario:{scenario.name}"] = round(seconds, 2)
            for phase, value in (result.get("timings") or {}).items():
                if isinstance(value, (int, float)):
                    out.phase_totals[phase] = round(out.phase_totals.get(phase, 0) + value, 2)
            out.entries[scenario.name] = scenario_entry(result, run_dir, grade_dir, seconds)
            out.run_timings[scenario.name] = (result.get("timings") or {}, result.get("timings_detail") or {})
        progress(f"    {scenario.name}: {result['verdict'].upper()} in {seconds:.1f}s")

    shared = (sorted((s for s in chosen if s not in alone and s not in beside),
                     key=lambda s: expected_seconds(s, adapter.timings),
                     reverse=True) if parallel > 1 else chosen)
    # The next scenarios' tenants (and their setup commands) are made while the running ones work and drain
    # (harness/tenants_ahead.py), in the order they start; a scenario that restarts a service makes its own, with
    # nothing being made meanwhile.
    by_name = {s.name: s for s in shared}
    ahead = (tenants_ahead.TenantsAhead(stack, seed, [s.name for s in shared], depth=2, held=bool(alone),
                                        prepare=lambda name, tenant: prepare_ahead(adapter, by_name[name], level,
                                                                                   tenant),
                                        # [setup] template = true: the setup command once per stack, tenants cloned
                                        template=(lambda name: database_template(adapter, by_name[name], level, stack))
                                        if getattr(adapter, "setup_template", False) else None)
             if tenants_ahead.enabled() and gate is None else None)  # under grade-many's gate a neighbour's
    # service restart could break a tenant made ahead: each run makes its own
    beside_pool = ThreadPoolExecutor(1, thread_name_prefix="beside") if beside else None
    opted_in = getattr(adapter, "setup_template", False)
    template_keys = {template_key(adapter, s, level) for s in chosen} if opted_in else set()

    def run_beside() -> None:
        from .stack import Stack

        t = time.monotonic()
        try:
            second = Stack.start(grade_dir / "stack-beside", keep_data=keep_data)
        except Exception as exc:
            progress(f"second stack did not start ({exc}); {', '.join(s.name for s in beside)} will run alone on "
                     "the first stack, after the others")
            out.fallback.extend(beside)
            return
        timings["stack_beside_start"] = round(time.monotonic() - t, 2)
        try:
            for scenario in beside:
                run_one(scenario, on_stack=second)
        finally:
            if template_keys:
                out.templates.extend(second.template_stats(template_keys))
            second.stop()

    try:
        beside_done = beside_pool.submit(run_beside) if beside_pool else None
        for scenario in alone:
            run_one(scenario)
        if ahead is not None and alone:
            ahead.resume()  # the services are no longer restarted: the shared scenarios' tenants are made ahead
        try:
            if parallel == 1:
                for scenario in shared:
                    run_one(scenario)
            else:  # on a failure it aborts every active run, the one on the second stack too
                _run_side_by_side(shared, run_one, parallel, active, lock)
        finally:
            if beside_pool:
                beside_pool.shutdown(wait=True)
        if beside_done is not None:
            beside_done.result()  # its failure is the grade's, as for any scenario
        for scenario in out.fallback:
            alone.append(scenario)  # holds the tenants made ahead while it restarts a shared service
            run_one(scenario)
    finally:
        out.ahead_stats = ahead.close() if ahead is not None else None
        if template_keys and hasattr(stack, "template_stats"):
            out.templates.extend(stack.template_stats(template_keys))
    return out


def _run_side_by_side(scenarios, run_one, parallel: int, active: dict, lock) -> None:
    """Run ``scenarios`` ``parallel`` at a time. On an interrupt (Ctrl-C, a grade time limit) every running scenario
    is told to stop, its roles are stopped, and its thread is waited for before the interrupt goes on."""
    pool = ThreadPoolExecutor(parallel, thread_name_prefix="scenario")
    futures = [pool.submit(run_one, s) for s in scenarios]
    try:
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)  # a failure is seen at once, not in submit order
        for future in done:
            future.result()
    except BaseException:
        for future in futures:
            future.cancel()
        with lock:
            running = list(active.values())
        for run in running:
            run.abort()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


