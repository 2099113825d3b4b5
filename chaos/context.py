"""The fault context: everything a fault kind (``chaos/kinds/<action>.py``) may use during a run, and the nemesis
support the kinds share — holds, triggers, targets, extra instances, the consumer sampler, restarts after a crash.

The runner of a scenario builds one ``FaultContext`` when its roles are defined and hands it to
every kind's ``prepare``, ``run`` and ``heal``; a kind sees nothing of the runner. What the runner fills in later
(the observer once it starts, the workload's start) is set on the context then.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:  # types only: the runner imports this module, and these import more of the harness
    from harness.broker import ConsumerSampler, Management, Tap
    from harness.history import HistoryWriter
    from harness.supervisor import Instance, Supervisor

    from .failpoints import FailpointFaults
    from .network import NetworkFaults
    from .process import ProcessFaults
    from .services import ServiceFaults

TERMINAL = ("ready", "failed")

# One fault step of the scenario's schedule (harness/nemesis.py): the scenario's TOML table plus ``index``.
Step = dict[str, Any]


class ObserverView(Protocol):
    """What the triggers and kinds read of the API observer: the accepted ids, their last seen states, one read."""

    ids: list[str]
    states: dict[str, str | None]

    def poll_one(self, attachment_id: str) -> None: ...


class AdapterView(Protocol):
    """What the fault kinds read of the implementation's adapter (harness/adapter.py ``Adapter`` is one): named
    here so that the kinds stay below the harness's adapter module, which the checkers sit under."""

    raw: dict[str, Any]

    @property
    def roles(self) -> dict[str, Any]: ...
    @property
    def http(self) -> dict[str, Any]: ...
    @property
    def broker(self) -> dict[str, Any]: ...
    @property
    def timings(self) -> dict[str, Any]: ...
    @property
    def vocabulary(self) -> Any: ...
    @property
    def operator_token(self) -> str: ...
    @property
    def replay_path(self) -> str: ...
    @property
    def reprocess_path(self) -> str | None: ...
    def has(self, capability: str) -> bool: ...
    def version_env(self, version: int) -> dict[str, str]: ...
    def roles_flagged(self, flag: str) -> list[str]: ...
    def window_role(self, window: str) -> str | None: ...
    def expand_roles(self, names: list[str], windows: list[str] = ...) -> list[str]: ...


@dataclass
class BrokerHandle:
    """The broker as the kinds use it: the management API (get, publish, depths, leaders), the tap (every message
    that reached the work queue), the tenant's direct AMQP URL(s) (not through any proxy) and the work queue."""

    management: Management
    tap: Tap
    amqp_url: str
    amqp_urls: str
    work_queue: str


@dataclass
class FaultContext:
    adapter: AdapterView
    seed: int
    windows: list[str]
    schedule: list[Step]
    supervisor: Supervisor
    history: HistoryWriter
    stack: Any  # the run's stack (harness/stack): one broker node or a cluster, read by the kinds that need which
    broker: BrokerHandle
    base_url: str
    stopping: threading.Event
    log: Callable[[str], None]
    # The fault mechanisms (chaos/): process signals, Toxiproxy, service restarts, failpoint arming.
    processes: ProcessFaults | None = None
    network: NetworkFaults | None = None
    services: ServiceFaults | None = None
    failpoints: FailpointFaults | None = None
    # Extra environment of a new instance (its /metrics listener), and what to do once held roles run again.
    instance_env: Callable[[str, str], dict[str, str]] = lambda name, role: {}
    # Role -> the tenant-wide values of the URL variables that role's own proxied links replace (the runner's
    # _role_links: a ``toxic`` with ``role`` reaches only the instances on those links). An extra instance started
    # with ``link = "tenant"`` gets these back, so a role-scoped network fault misses it.
    tenant_links: dict[str, dict[str, str]] = field(default_factory=dict)
    after_release: Callable[[list[str]], None] = lambda names: None
    observer: ObserverView | None = None
    objects: Any = None  # the run's object watcher (scenario watch_objects): the object_written trigger reads it
    workload_started: float = 0.0
    workload_done: threading.Event = field(default_factory=threading.Event)
    # Shared state of the nemesis.
    held: set[str] = field(default_factory=set)
    peer_held: dict[str, int] = field(default_factory=dict)  # consumer instance -> the peek step holding it
    extra_stopped: set[str] = field(default_factory=set)  # stopped on purpose: no restart brings them back
    hits: dict[str, threading.Event] = field(default_factory=dict)
    window_hits: list[dict[str, Any]] = field(default_factory=list)
    restart_after: dict[str, float] = field(default_factory=dict)
    restart_timers: list[threading.Timer] = field(default_factory=list)
    looks: list[threading.Event] = field(default_factory=list)  # set once a crashed instance's look is over
    version_instances: dict[int, list[str]] = field(default_factory=dict)  # level 5: start_version's instances
    sampler: ConsumerSampler | None = None

    # --- targets --------------------------------------------------------------------------------
    def instances_of(self, role: str | None) -> list[str]:
        return [n for n, i in self.supervisor.instances.items() if i.role == role]

    def consumers(self) -> list[str]:
        return [n for r in self.adapter.expand_roles(["@consumers"]) for n in self.instances_of(r)]

    def role(self, step: Step) -> str:
        """The role a step targets: named, or a group (default ``@consumers``: the adapter's consumer roles)."""
        roles = self.adapter.expand_roles([step.get("role") or "@consumers"], self.windows)
        if not roles:
            raise ValueError(f"scenario targets {step.get('role') or '@consumers'!r}, which the adapter does not define")
        return roles[0]

    def target(self, step: Step) -> str:
        role = self.role(step)
        names = self.instances_of(role)
        if not names:
            raise ValueError(f"scenario targets role {role!r} which the adapter does not define")
        return names[0]

    def failpoint_instance(self, step: Step) -> str:
        role = step.get("role") or self.adapter.window_role(step["window"])
        return self.instances_of(role)[0]

    # --- triggers -------------------------------------------------------------------------------
    def wait_trigger(self, step: Step, delay: float = 0.0) -> bool:
        """Wait for the step's trigger; False if it never came within the step timeout."""
        deadline = time.monotonic() + float(step.get("timeout", 30))
        if "at" in step and step.get("at") is not None:
            time.sleep(max(0.0, self.workload_started + float(step["at"]) - time.monotonic()))
        when = step.get("when")
        if when:
            while not self.condition(when):
                if time.monotonic() > deadline or self.stopping.is_set():
                    self.history.append("note", message=f"trigger {when!r} never came", fault=step["index"])
                    return False
                time.sleep(0.02)
        time.sleep(delay)
        return True

    def condition(self, when: str) -> bool:
        observer = self.observer
        if observer is None:
            return False
        states = observer.states
        if when == "accepted":
            return bool(observer.ids)
        if when == "processing":
            if any(s == "processing" for s in list(states.values())):
                return True
            # Processing can last a fraction of a second: look at the unfinished ones now, not at the next poll.
            for attachment_id in [a for a in observer.ids if states.get(a) not in TERMINAL][:3]:
                try:
                    observer.poll_one(attachment_id)
                except Exception:
                    pass
            return any(s == "processing" for s in list(states.values()))
        if when == "ready":
            return any(s == "ready" for s in list(states.values()))
        if when == "message":
            return bool(self.broker.tap.tapped())
        if when == "idle":
            return self.workload_done.is_set() and all(states.get(a) in TERMINAL for a in observer.ids)
        if when == "object_written":
            # A consumer's effect reached the bucket: with a job seen processing (so every accepted upload is known),
            # the object watch has seen more keys than uploads were accepted (each stages one original), so at least
            # one is a variant — a claim has begun writing. Needs watch_objects; an original staged by an upload not
            # yet answered (several at once) or never accepted may set it off early.
            seen = getattr(self.objects, "seen", None)
            return (seen is not None and any(s == "processing" for s in list(states.values()))
                    and len(seen) > len(observer.ids))
        raise ValueError(f"unknown trigger {when!r}")

    # --- holds ----------------------------------------------------------------------------------
    def peek_peers(self, step: Step) -> list[str]:
        """For a crash whose delivery the harness looks for (``peek_queue``): every consumer instance but the one
        the step crashes. They are held with the step's roles — a running one would take the returned delivery
        before the look (two worker instances, the usual deployment)."""
        if not step.get("peek_queue") or step["action"] not in ("failpoint", "sigkill"):
            return []
        try:
            target = self.failpoint_instance(step) if step["action"] == "failpoint" else self.target(step)
        except (ValueError, IndexError, KeyError):
            return []  # a step whose role the adapter lacks fails where it runs, never in a release or the heal
        return [n for n in self.consumers() if n != target]

    def hold(self, step: Step) -> None:
        roles = self.adapter.expand_roles(step.get("hold") or [])
        names = [n for r in roles for n in self.instances_of(r)]
        peers = [n for n in self.peek_peers(step) if n not in names]
        if not names and not peers:
            return
        for name in peers:
            self.peer_held[name] = step["index"]
        for name in names + peers:
            self.held.add(name)
            if self.supervisor.instances[name].alive():
                self.supervisor.stop(name)
        self.history.append("phase", name="hold_start", roles=roles, instances=names + peers, fault=step["index"],
                            **({"consumer_peers": peers} if peers else {}))
        self.log(f"holding {', '.join(names)}" + ("" if step["action"] == "hold" else
                                                   " (so lease recovery cannot mask the fault)"))

    def release(self, step: Step) -> None:
        roles = self.adapter.expand_roles(step.get("hold") or [])
        # An instance another step holds as a peek's peer stays down until that step releases it.
        names = [n for r in roles for n in self.instances_of(r)
                 if n in self.held and self.peer_held.get(n, step["index"]) == step["index"]]
        names += [n for n in self.peek_peers(step) if n in self.held and n not in names
                  and self.peer_held.get(n) == step["index"]]
        for name in names:
            self.peer_held.pop(name, None)
        if not names:
            return
        for name in names:
            self.held.discard(name)
            self.supervisor.ensure_running(name, {"FAILPOINTS": ""})
        self.history.append("phase", name="hold_end", roles=roles, instances=names, fault=step["index"])
        self.after_release(names)
        self.log(f"released {', '.join(names)}")

    def expected_running(self) -> set[str]:
        return {n for n in self.supervisor.instances if n not in self.held and n not in self.extra_stopped}

    # --- instances ------------------------------------------------------------------------------
    def start_extra_instance(self, role: str, link: str = "role") -> str:
        """One more instance of ``role``: its first instance's command and environment. ``link = "role"`` (the
        default) keeps the role's own proxied links, so a ``toxic`` with ``role`` reaches it too; ``link = "tenant"``
        puts it on the tenant-wide links instead (the URL variables its role's own proxies replaced are set back to
        the tenant's), so such a toxic reaches the role's other instances and never this one — a network fault on
        one instance (an old owner's link delayed, the new owner's not)."""
        if link not in ("role", "tenant"):
            raise ValueError(f"start_extra_instance: link {link!r} is not 'role' or 'tenant'")
        existing = self.instances_of(role)
        template = self.supervisor.instances[existing[0]]
        name = f"{role}#{len(existing) + 1}"
        links = self.tenant_links.get(role, {}) if link == "tenant" else {}
        self.supervisor.add(name, role, template.command, {**template.env, **links, **self.instance_env(name, role)})
        self.supervisor.start(name, {"FAILPOINTS": ""})
        if link == "tenant":
            self.history.append("note", message="extra instance on the tenant-wide links (link = tenant: "
                                f"{', '.join(sorted(links)) or 'its role has no links of its own'}): a toxic on its "
                                "role's own links does not reach it", role=name)
        self.log(f"started extra instance {name}" + (" (tenant links)" if link == "tenant" else ""))
        return name

    def first_start_env(self, name: str) -> dict[str, str]:
        """FAILPOINTS of an instance's first start: the windows of untimed failpoint steps it hosts, armed now."""
        from .failpoints import failpoints_value

        arms = {}
        for step in self.schedule:
            if step["action"] == "failpoint" and step.get("at") is None and step.get("when") is None:
                if self.failpoint_instance(step) == name:
                    arms[step["window"]] = step.get("spec", "1*crash")
                    self.history.append("fault", action="failpoint", phase="arm", role=name, window=step["window"],
                                        spec=step.get("spec", "1*crash"))
                    self.hits.setdefault(name, threading.Event())
        return {"FAILPOINTS": failpoints_value(arms)} if arms else {}

    # --- the consumer sampler -------------------------------------------------------------------
    def start_sampler(self, step: Step) -> None:
        """Sample every consumer of the work queue (prefetch, unacked) from now until the drain (hold, permute)."""
        if self.sampler is not None:
            return
        from harness.broker import ConsumerSampler

        queue = self.broker.work_queue
        self.sampler = ConsumerSampler(self.broker.management, self.history, queue)
        self.history.append("phase", name="consumer_sampling_start", queue=queue, fault=step["index"])
        self.sampler.start()

    def stop_sampler(self) -> None:
        if self.sampler is not None and self.sampler.is_alive():
            self.sampler.halt()
            self.history.append("phase", name="consumer_sampling_end", ticks=self.sampler.ticks,
                                errors=self.sampler.errors, last_error=self.sampler.last_error)

    # --- exits and restarts ---------------------------------------------------------------------
    def on_exit(self, instance: Instance, info: dict[str, Any]) -> None:
        """The supervisor's exit callback: an armed role that exits on its own is a failpoint hit (its jobs looked at
        while it is down, then restarted ``restart_after`` later); any other unexpected exit is restarted."""
        if self.stopping.is_set():
            return
        if instance.armed and not info["expected"]:
            peers = [n for n in self.consumers() if n != instance.name and self.supervisor.instances[n].alive()]
            hit = {"role": instance.name, "windows": sorted(instance.armed), "returncode": info["returncode"],
                   "exactness": "exact", "wall": time.time()}
            self.window_hits.append(hit)
            for window in sorted(instance.armed):
                self.history.append("fault", action="crash", phase="hit", role=instance.name, window=window,
                                    returncode=info["returncode"], consumers_running=peers)
            self.log(f"failpoint hit: {instance.name} crashed in {', '.join(sorted(instance.armed))}")
            self.hits.setdefault(instance.name, threading.Event()).set()
            self.schedule_restart(instance.name, float(self.restart_after.get(instance.name, 0.5)),
                                  look=instance.name)
        elif not info["expected"]:
            self.history.append("note", message="role exited unexpectedly; restarting", role=instance.name,
                                returncode=info["returncode"])
            self.schedule_restart(instance.name, 0.5)

    def look_while_down(self, name: str, limit: int = 50, within: float | None = None) -> None:
        """While a crashed instance is down, one read of every accepted job not yet seen terminal: what its crash
        left committed is seen before anything it runs again could change it (fault_coverage's window evidence).
        At most ``limit`` jobs, within ``within`` seconds (the restart waits for the look)."""
        observer = self.observer
        if observer is None:
            return
        until = None if within is None else time.monotonic() + within
        pending = [a for a in list(observer.ids) if observer.states.get(a) not in TERMINAL][:limit]
        read = []
        for attachment_id in pending:
            if self.stopping.is_set():
                return
            if until is not None and time.monotonic() > until:
                break
            try:
                observer.poll_one(attachment_id)
                read.append(attachment_id)
            except Exception:
                pass
        self.history.append("observe", source="look_while_down", role=name, read=len(read), pending=len(pending),
                            ready=sorted(a for a in read if observer.states.get(a) == "ready"))

    def schedule_restart(self, name: str, delay: float, look: str | None = None) -> None:
        began = time.monotonic()
        looked = threading.Event()
        if look is not None:
            self.looks.append(looked)

        def restart() -> None:
            if look is not None:
                try:
                    self.look_while_down(look, within=max(0.3, 0.8 * delay))
                finally:
                    looked.set()
                time.sleep(max(0.0, delay - (time.monotonic() - began)))
            if self.stopping.is_set() or name in self.held or name in self.extra_stopped:
                return
            self.supervisor.ensure_running(name, {"FAILPOINTS": ""})
        timer = threading.Timer(0.0 if look is not None else delay, restart)
        timer.daemon = True
        self.restart_timers.append(timer)
        timer.start()

    def finish_looks(self, timeout: float = 10.0) -> None:
        """Wait (bounded) for the looks at crashed instances still under way: the heal restarts an armed role at
        once, and a look finished after that restart no longer shows what the crash alone left committed (a loaded
        machine's TypeScript grade once lost a window's evidence so)."""
        deadline = time.monotonic() + timeout
        for looked in list(self.looks):
            looked.wait(max(0.0, deadline - time.monotonic()))

    def cancel_restarts(self) -> None:
        for timer in self.restart_timers:
            timer.cancel()
