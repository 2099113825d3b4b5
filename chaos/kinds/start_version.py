"""``start_version`` (level 5): one more instance of each consumer role (``role``, default ``@consumers``) running
pipeline version ``params.version`` — a copy of the role's first instance with the adapter's ``[versions]
consumer_env`` for that version — beside the version-1 instances (a roll-out). ``stop_version`` or the
``reprocess`` step's ``then_stop`` stops them again (a rollback)."""

from __future__ import annotations

from . import first_delay, untimed

ACTION = "start_version"
RECORDS = "fault action=start_version phase=start (role, instance, pipeline_version); role lines of the new instance"
WEIGHT = 0.3
ONCE = True


def version_of(step) -> int:
    return int((step.get("params") or {}).get("version", 2))


def instances(ctx) -> dict[int, list[str]]:
    """pipeline version -> the instances this run started for it (kept on the fault context)."""
    return ctx.version_instances


def _add(ctx, step) -> list[tuple[str, str]]:
    version = version_of(step)
    env = ctx.adapter.version_env(version)
    added = []
    for role in ctx.adapter.expand_roles([step.get("role") or "@consumers"]):
        template = ctx.supervisor.instances[ctx.instances_of(role)[0]]
        name = f"{role}@v{version}#{len(instances(ctx).get(version, [])) + 1}"
        ctx.supervisor.add(name, role, template.command, {**template.env, **ctx.instance_env(name, role), **env})
        instances(ctx).setdefault(version, []).append(name)
        added.append((role, name))
    return added


def prepare(ctx, step) -> None:
    """Untimed (no ``at``, no ``when``): the version's instances start with the other roles, so they are up (and
    have declared what they consume) before the workload, however long a consumer takes to start."""
    if untimed(step):
        step["prepared"] = _add(ctx, step)


def run(ctx, step) -> None:
    if not ctx.wait_trigger(step, first_delay(step)):
        return
    version = version_of(step)
    prepared = step.get("prepared")
    for role, name in prepared if prepared is not None else _add(ctx, step):
        if prepared is None:
            ctx.supervisor.start(name, {"FAILPOINTS": ""})
        ctx.history.append("fault", action="start_version", phase="start", role=role, instance=name,
                           pipeline_version=version, fault=step["index"], with_roles=prepared is not None)
        ctx.log(f"started {name} (pipeline version {version})")


def stop(ctx, version: int, step) -> list[str]:
    """SIGKILL every instance of ``version`` this run started; the heal never brings them back (a rollback)."""
    names = list(instances(ctx).get(version, []))
    for name in names:
        ctx.extra_stopped.add(name)
        ctx.supervisor.kill(name)
        ctx.history.append("fault", action="stop_version", phase="start", instance=name, pipeline_version=version,
                           fault=step["index"])
        ctx.log(f"stopped {name} (pipeline version {version}): rollback")
    return names


def allowed(adapter, level: int) -> str | None:
    if level < 5:
        return "pipeline versions are level 5"
    return None if adapter.has("versions") else "the adapter declares no [versions] table"


def draw(rng, pick) -> dict | None:
    if not pick.consumers:
        return None
    return {"action": "start_version", "at": pick.at, "params": {"version": 2}}


def happened(step, history, final) -> tuple[bool, str]:
    done = [e for e in history.of_type("fault") if e.get("action") == ACTION and e.get("phase") == "start"
            and e.get("fault") == step.get("index")]
    return bool(done), f"{ACTION}: {len(done)} consumer instances"
