"""``stop_version`` (level 5): at the trigger, SIGKILL every consumer instance a ``start_version`` step of this run
started for ``params.version`` (a rollback: the version-1 instances keep running); the heal leaves them stopped."""

from __future__ import annotations

from . import first_delay
from .start_version import allowed, stop, version_of  # noqa: F401 - allowed is this kind's too

ACTION = "stop_version"
RECORDS = "fault action=stop_version phase=start (instance, pipeline_version) per stopped instance"
WEIGHT = 0.3
ONCE = True


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    stop(ctx, version_of(step), step)


def draw(rng, pick) -> dict:
    return {"action": "stop_version", "at": pick.at, "params": {"version": 2}}


def happened(step, history, final) -> tuple[bool, str]:
    done = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "start"
            and e.get("fault") == step.get("index")]
    return bool(done), f"{ACTION}: {len(done)} consumer instances"
