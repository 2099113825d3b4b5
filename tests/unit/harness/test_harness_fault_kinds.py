"""The fault-kind registry (chaos/kinds/, one module per scenario fault action): the registry, the scenario schema's
action enum and the kinds `harness soak` can draw agree; every kind module has its parts; the runner dispatches
through the registry only."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from chaos import kinds as fault_kinds
from harness import adapter as adapter_mod
from harness import soak
from harness.runner import ScenarioRun
from harness.schemas import schemas_dir

REFERENCE = adapter_mod.load("reference")


def schema_actions() -> set[str]:
    schema = json.loads((schemas_dir() / "scenario.schema.json").read_text(encoding="utf-8"))
    return set(schema["properties"]["faults"]["items"]["properties"]["action"]["enum"])


def test_registry_schema_and_soak_agree_on_the_fault_actions():
    registered = set(fault_kinds.REGISTRY)
    assert registered == schema_actions(), "a kind in chaos/kinds/ needs its action in scenario.schema.json"
    drawable = {a for a, m in fault_kinds.REGISTRY.items() if hasattr(m, "draw")}
    assert set(soak.KINDS) == drawable
    assert drawable == registered, "every fault kind should be drawable by `harness soak` (give it a draw)"
    assert len(soak.KINDS) == len(set(soak.KINDS))
    assert set(soak.WEIGHTS) == set(soak.KINDS) and all(w > 0 for w in soak.WEIGHTS.values())


def test_every_kind_module_has_its_parts():
    folder = Path(fault_kinds.__file__).parent
    files = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
    assert files == set(fault_kinds.REGISTRY), "one module per action, named after it"
    for action, module in fault_kinds.REGISTRY.items():
        assert module.ACTION == action == module.__name__.rsplit(".", 1)[1]
        assert callable(module.run)
        assert module.RECORDS and module.__doc__, f"{action}: say what it does and records"
        for hook in ("prepare", "heal", "draw", "allowed"):
            assert getattr(module, hook, None) is None or callable(getattr(module, hook))


def test_each_drawn_step_is_of_its_own_kind():
    rng = random.Random(4242)
    pick = fault_kinds.Pick(REFERENCE, 1.0, list(REFERENCE.roles), REFERENCE.roles_flagged("consumer"))
    for action in soak.KINDS:
        step = fault_kinds.get(action).draw(rng, pick)
        assert step is not None and step["action"] == action


def test_an_unknown_action_fails_in_its_step_not_before_or_in_the_heal():
    class Ctx:
        released: list = []

        def release(self, step):
            self.released.append(step["index"])

    step = {"action": "no-such-fault", "index": 0}
    fault_kinds.prepare(Ctx(), step)  # nothing to prepare
    fault_kinds.heal(Ctx(), step)  # the default heal: release what it held
    assert Ctx.released == [0]
    with pytest.raises(ValueError, match="unknown fault action"):
        fault_kinds.run(Ctx(), step)


def test_the_runner_has_no_dispatch_of_its_own():
    assert not hasattr(ScenarioRun, "_run_step")
    source = Path(__import__("harness.runner", fromlist=["x"]).__file__).read_text(encoding="utf-8")
    for action in fault_kinds.REGISTRY:
        assert f'action == "{action}"' not in source


def test_no_kind_reaches_into_the_runner():
    """The kinds see only the FaultContext (chaos/context.py), through its public names."""
    import re

    folder = Path(fault_kinds.__file__).parent.parent
    offenders = [f"{path.relative_to(folder.parent)}:{n}" for path in sorted(folder.rglob("*.py"))
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
                 if re.search(r"\bctx\._", line) or "ScenarioRun" in line or "harness.runner" in line]
    assert not offenders, f"a fault kind calls a private name of its context or the runner: {offenders}"


def test_the_context_has_every_name_the_kinds_use():
    import dataclasses
    import re

    from chaos.context import FaultContext

    names = {f.name for f in dataclasses.fields(FaultContext)} | {n for n in vars(FaultContext) if not n.startswith("_")}
    folder = Path(fault_kinds.__file__).parent
    used = {m for path in folder.glob("*.py") for m in re.findall(r"\bctx\.([a-z_]+)", path.read_text(encoding="utf-8"))}
    assert used and used <= names, f"kinds use names the context lacks: {sorted(used - names)}"


def test_every_kind_says_what_shows_it_happened_and_checkers_import_it_light():
    """fault_coverage asks each kind's happened(); importing the kinds (as a checker does) pulls in neither the
    runner nor the observers."""
    import subprocess
    import sys

    for action, module in fault_kinds.REGISTRY.items():
        assert callable(getattr(module, "happened", None)), f"{action}: no happened(step, history, final)"
    code = ("import sys, harness.checkers.fault_coverage as f, chaos.kinds; "
            "print(sorted(m for m in ('harness.runner', 'harness.observe', 'harness.supervisor') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out


def test_a_kind_without_happened_is_not_proven(monkeypatch):
    from harness.checkers import fault_coverage
    from harness.history import History

    monkeypatch.delattr(fault_kinds.REGISTRY["start_instance"], "happened")
    done, why = fault_coverage._happened({"action": "start_instance", "index": 0}, History(()))
    assert not done and "no happened()" in why


def test_republish_waits_for_the_consumers_its_copies_must_race_on(monkeypatch):
    """Copies meant to race on two consumers are published once the work queue counts two (a second instance still
    starting took none of them on a loaded machine), and a count that never comes is noted, not waited forever."""
    import threading

    from chaos.kinds import republish, sigterm

    class _Ctx:
        stopping = threading.Event()

        def __init__(self):
            self.lines = []
            self.history = self

        def append(self, kind, **fields):
            self.lines.append({"type": kind, **fields})

    counts = iter([1, 1, 2])
    monkeypatch.setattr(sigterm, "consumers_now", lambda ctx: next(counts))
    ctx = _Ctx()
    republish._wait_for_consumers(ctx, {"index": 0}, 2)
    assert ctx.lines == []
    monkeypatch.setattr(sigterm, "consumers_now", lambda ctx: 1)
    clock = iter([0.0, 0.0, 11.0])
    monkeypatch.setattr(republish.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(republish.time, "sleep", lambda s: None)
    republish._wait_for_consumers(ctx, {"index": 0}, 2)
    assert ctx.lines and "had 1 consumers, not 2" in ctx.lines[0]["message"]


def test_a_hold_covering_a_fault_is_released_once_that_fault_is_in_force(tmp_path):
    """``until_fault``: roles held from before the workload stay held past ``hold_seconds`` until the named step's
    fault line is written (released by a clock alone, a loaded machine's consumers finished every job before the
    store refused anything), and a fault that never comes releases them at the step's timeout, noted."""
    import threading
    import time

    from chaos.kinds import hold
    from harness.history import HistoryWriter

    writer = HistoryWriter(tmp_path / "history.jsonl")

    class _Ctx:
        stopping = threading.Event()
        history = writer
        workload_started = time.monotonic()

        def __init__(self):
            self.released = None

        def release(self, step):
            self.released = time.monotonic()

    ctx = _Ctx()
    threading.Timer(0.3, lambda: writer.append("fault", action="s3_deny", phase="start", fault=1)).start()
    began = time.monotonic()
    hold.run(ctx, {"index": 0, "action": "hold", "hold": ["worker"], "hold_seconds": 0, "until_fault": 1,
                   "timeout": 10})
    assert ctx.released is not None and ctx.released - began >= 0.25
    never = _Ctx()
    hold.run(never, {"index": 0, "action": "hold", "hold": ["worker"], "hold_seconds": 0, "until_fault": 2,
                     "timeout": 0.3})
    writer.close()
    lines = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert never.released is not None and any("fault 2 was not in force" in x.get("message", "") for x in lines)


def test_the_adapter_view_of_the_kinds_is_what_the_adapter_has():
    """chaos/context.py names what the kinds read of an adapter (a Protocol, so that chaos/ stays below
    harness/adapter.py): every name of it is the Adapter's, and every ``ctx.adapter.X`` a kind reads is in it."""
    import re

    from chaos.context import AdapterView
    from harness.adapter import Adapter

    names = {n for n in vars(AdapterView) if not n.startswith("_")} | set(AdapterView.__annotations__)
    assert names and all(hasattr(Adapter, n) or n in Adapter.__annotations__ for n in names), names
    chaos = Path(__file__).resolve().parents[3] / "chaos"
    read = {m for f in chaos.rglob("*.py") for m in re.findall(r"ctx\.adapter\.([a-z_]+)", f.read_text())}
    assert read <= names, read - names


def test_only_the_broker_seam_imports_a_broker_client():
    """issue 24: everything the harness knows of RabbitMQ is in harness/broker/ — the runner, the kinds, load and
    the permutation use its names (harness/permute.py keeps the seeded order; taking the messages out and putting
    them back is harness.broker.permute_queue)."""
    import re

    root = Path(__file__).resolve().parents[3]
    client = re.compile(r"^\s*(import|from)\s+(aio_pika|aiormq|pika|kombu|amqp|amqpstorm)\b", re.M)
    offenders = [str(f.relative_to(root)) for d in ("harness", "chaos", "load") for f in (root / d).rglob("*.py")
                 if "broker" not in f.relative_to(root).parts[:2] and client.search(f.read_text())]
    assert offenders == [], offenders


@pytest.mark.parametrize("action", ["toxic", "restart_service"])
def test_a_step_whose_trigger_never_came_did_not_happen_though_another_on_its_service_did(action):
    """database-outages-past-lease, under load: the first cut's trigger never came, the second cut ran, and
    fault_coverage said "all 3 scheduled faults happened" — each start line now names its step."""
    from harness.history import History

    lines = [{"seq": 1, "t": 1.0, "type": "fault", "action": action, "phase": "start", "service": "postgres",
              "fault": 2},
             {"seq": 2, "t": 2.0, "type": "note", "fault": 1, "message": "trigger 'processing' never came"}]
    kind = fault_kinds.REGISTRY[action]
    done, why = kind.happened({"action": action, "service": "postgres", "index": 1}, History(lines), {})
    assert not done, why
    assert kind.happened({"action": action, "service": "postgres", "index": 2}, History(lines), {})[0]
    # A history recorded before the lines named their step is judged as it was.
    old = [{k: v for k, v in line.items() if k != "fault"} for line in lines[:1]]
    assert kind.happened({"action": action, "service": "postgres", "index": 1}, History(old), {})[0]


def test_start_instance_happened_only_when_its_step_started_one():
    from harness.history import History

    kind = fault_kinds.REGISTRY["start_instance"]
    started = [{"seq": 1, "t": 1.0, "type": "fault", "action": "start_instance", "phase": "done", "role": "worker#2",
                "fault": 3}]
    missed = [{"seq": 1, "t": 1.0, "type": "note", "fault": 3, "message": "trigger 'processing' never came"}]
    assert kind.happened({"action": "start_instance", "index": 3}, History(started), {})[0]
    done, why = kind.happened({"action": "start_instance", "index": 3}, History(missed), {})
    assert not done and "never came" in why


@pytest.mark.parametrize("action", ["sigstop", "sigkill", "sigkill_children"])
def test_a_signal_step_whose_trigger_never_came_did_not_happen_though_another_of_its_kind_did(action):
    """Two steps of one signal kind (an explored schedule, a team's own scenario): only the second's trigger came.
    Before each line named its step, both counted as happened and the first one's window as tested."""
    from harness.history import History

    extra = {"killed": [4242]} if action == "sigkill_children" else {}
    lines = [{"seq": 1, "t": 1.0, "type": "fault", "action": action, "phase": "start", "role": "worker", "pid": 7,
              "fault": 2, **extra},
             {"seq": 2, "t": 2.0, "type": "note", "fault": 1, "message": "trigger 'processing' never came"}]
    kind = fault_kinds.REGISTRY[action]
    done, why = kind.happened({"action": action, "role": "worker", "index": 1}, History(lines), {})
    assert not done, why
    landed = getattr(kind, "landed", None)  # the kinds that can be done without hitting their aim
    assert landed is None or not landed({"action": action, "index": 1}, History(lines))
    assert kind.happened({"action": action, "role": "worker", "index": 2}, History(lines), {})[0]
    # A history recorded before the lines named their step is judged as it was.
    old = [{k: v for k, v in line.items() if k != "fault"} for line in lines[:1]]
    assert kind.happened({"action": action, "role": "worker", "index": 1}, History(old), {})[0]


def test_a_signal_names_the_step_whose_thread_sends_it():
    """ProcessFaults writes the step index of the thread it runs on (the runner names each step's thread
    ``fault-<index>``); a signal from elsewhere (the heal) names none."""
    import threading

    from chaos.process import ProcessFaults

    class Lines:
        def __init__(self):
            self.lines = []

        def append(self, type_, **fields):
            self.lines.append({"type": type_, **fields})

    class Supervisor:
        class Instance:
            pid = 4242

        instances = {"worker": Instance()}

        def signal(self, name, sig):
            pass

    history = Lines()
    faults = ProcessFaults(Supervisor(), history)
    step = threading.Thread(target=faults.sigstop, args=("worker",), name="fault-3")
    step.start()
    step.join()
    faults.sigcont("worker")
    assert history.lines[0]["fault"] == 3 and history.lines[0]["action"] == "sigstop"
    assert "fault" not in history.lines[1]
