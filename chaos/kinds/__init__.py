"""Fault kinds: one module per scenario fault action (``action = "…"`` in scenarios/*.toml), registered by name.

Each module defines:

* ``ACTION`` — the action it implements;
* ``RECORDS`` — what it writes to the history (``fault`` lines and others);
* ``run(ctx, step)`` — the step's own thread during the workload: wait for its trigger, apply the fault, wait,
  undo it. ``ctx`` is the run's ``chaos.context.FaultContext`` — all a kind sees: the supervisor, adapter, history,
  observer, broker handle, fault mechanisms, holds, triggers and targets (its public names only; never the runner);
* ``happened(step, history, final) -> (bool, why)`` — pure over a recorded run: did this step's fault happen, with
  the evidence it left (``fault_coverage`` asks the kind; a kind without it is never proven). Keep the module
  import-light (nothing of the runner or the observers at module level): a checker imports it;
* optionally ``prepare(ctx, step)`` — before the roles start (a role held from the start is never started until
  its release), and ``heal(ctx, step)`` — what the heal phase undoes for it (default: release the roles it held);
* optionally, for ``harness soak``: ``draw(rng, pick)`` — a random step of this kind, or None when nothing may take
  it (``pick`` says which roles, windows and consumers a fault may target in this seed), ``allowed(adapter, level)``
  — why the kind cannot apply to an adapter (None when it can), and ``WEIGHT`` / ``ONCE`` (how often it is drawn,
  at most once per seed).

A new fault kind touches these files: its module in this folder, and its action in the ``action`` enum of
schemas/scenario.schema.json (a unit test holds the two equal). Shared pure helpers start with ``_`` (``_windows``:
what a crash must leave behind to count as hitting each failure window).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from types import ModuleType

REGISTRY: dict[str, ModuleType] = {}


def _discover() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        REGISTRY[module.ACTION] = module


def get(action: str) -> ModuleType:
    try:
        return REGISTRY[action]
    except KeyError:
        raise ValueError(f"unknown fault action {action!r}") from None


def prepare(ctx, step) -> None:
    """Before the roles start (an unknown action fails in ``run``, where a step's failure is recorded)."""
    hook = getattr(REGISTRY.get(step["action"]), "prepare", None)
    if hook is not None:
        hook(ctx, step)


def run(ctx, step) -> None:
    """The step's own thread (the runner records an exception as ``fault step failed``)."""
    get(step["action"]).run(ctx, step)


def heal(ctx, step) -> None:
    """The heal phase: the kind's own ``heal``, by default the release of the roles the step held."""
    hook = getattr(REGISTRY.get(step["action"]), "heal", None)
    if hook is not None:
        hook(ctx, step)
    else:
        ctx.release(step)


def first_delay(step) -> float:
    return (step.get("delay_drawn") or [0.0])[0]


def own_lines(step, lines: list) -> list:
    """The lines of ``lines`` this step wrote: each names its step (``fault``). A history recorded before the lines
    did is judged as it was then, by every line of the kind (another step of the same kind then counts too)."""
    if any("fault" in e for e in lines):
        return [e for e in lines if e.get("fault") == step.get("index")]
    return lines


def untimed(step) -> bool:
    """No ``at`` and no ``when``: the step acts from before the workload."""
    return step.get("at") is None and step.get("when") is None


def peek_while_down(ctx, step) -> None:
    """While the crashed consumer is down — every other consumer instance held with the step (the runner's
    ``_peek_peers``) — count the work queue exactly (a passive declare: nothing is consumed, so a look never brings
    a job nearer its delivery limit, nor sets its redelivered flag) and note which consumer instances run. Which job
    and attempt came back is read from the traced delivery that follows the restart (its ``redelivered`` flag).
    Runs until the step's restart_after has passed since the crash (failpoint and sigkill with ``peek_queue``)."""
    import time

    from harness.broker import amqp_queue_depth

    began = time.monotonic()
    window = float(step.get("restart_after", 3.0))
    queue = ctx.adapter.broker["work_queue"]
    consumers = ctx.consumers()
    time.sleep(min(0.5, window / 4))
    while time.monotonic() - began < window - 0.2:
        running = [n for n in consumers if ctx.supervisor.instances[n].alive()]
        exact = amqp_queue_depth(ctx.broker.amqp_url, queue)
        if exact is None:
            ctx.history.append("note", message="queue peek failed: the work queue could not be counted")
        else:
            ctx.history.append("queue", kind="peek", queue=queue, dead_letter=False, ready=exact.get("ready"),
                               consumers=exact.get("consumers"), source="amqp", running=running)
        time.sleep(0.6)
    time.sleep(max(0.0, window - (time.monotonic() - began)))


@dataclass
class Pick:
    """What a kind's ``draw`` may target in one soak seed: ``roles`` a process fault may take, ``consumers`` an
    extra instance may copy (none while a permute holds them), ``busy`` roles a failpoint may not be armed on
    (already armed, killed, paused or held in this seed); ``at`` the step's time into the workload."""

    adapter: object
    at: float
    roles: list
    consumers: list
    busy: set = field(default_factory=set)

    def duration(self, rng, lo: float, hi: float, of: str = "lease_seconds"):
        """``lo``..``hi`` times the implementation's own timing when it declares it, else seconds (×4)."""
        times = round(rng.uniform(lo, hi), 2)
        if self.adapter.timings.get(of) is not None:
            return {"of": of, "times": times}
        return round(times * 4, 2)


_discover()

__all__ = ["Pick", "REGISTRY", "first_delay", "get", "heal", "peek_while_down", "prepare", "run", "untimed"]
