"""Run one scenario against one implementation on a running stack, and store everything in a run directory.

Order: fresh tenant → setup command → tap bound → roles started → observers →
pre-workload faults (failpoint arming, holds) → workload + timed faults →
heal (verified) → drain → final read → roles stopped → run.json, final.json →
checkers → reports. Every phase's duration is kept in run.json["timings"].
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import httpx

from chaos import FailpointFaults, NetworkFaults, ProcessFaults, ServiceFaults, heal_all
from chaos import kinds as fault_kinds
from chaos.context import BrokerHandle, FaultContext

from . import checkers, clock, http_clients, metrics, tenants_ahead, timing, workload
from .final_state import read_final, staging_retention_wait
from .history import History, HistoryWriter
from .nemesis import resolve_schedule, schedule_fingerprint
from .broker import Management, Tap, amqp_queue_depth, decode_payload
from .observe import ApiObserver, ObjectWatcher
from .paths import reports_dir
from .stack.ports import listener_port
from .supervisor import Supervisor
from .checkers.message_hygiene import storage_record

REPORTS_DIR = reports_dir()  # reports/runs under the checkout, else under the current directory
TERMINAL = ("ready", "failed")


def free_port() -> int:
    """A port for a role's listener: below the ephemeral range, so no proxy or connection takes it first."""
    return listener_port()


def wait_http_healthy(adapter, base_url: str, timeout: float | None = None) -> None:
    """Poll the HTTP role's health path (adapter [http]) until it answers 200, or raise TimeoutError."""
    timeout = timeout or float(adapter.http.get("startup_timeout_seconds", 30))
    path = adapter.http.get("health_path", "/healthz")
    deadline = time.monotonic() + timeout
    with http_clients.client(timeout=1) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(base_url + path).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{base_url}{path} not healthy after {timeout}s")


def run_environment(adapter, scenario, level: int, tenant, port: int, role_tmp: str) -> tuple[dict, dict]:
    """The timings in effect and the environment every role and the setup command start with (a role adds its own):
    the adapter's [env], a scenario's [timings] through the adapter's [timings_env], the tenant's proxied services."""
    timings_in_effect, timing_env = adapter.timing_overrides(scenario.raw.get("timings") or {})
    common = {**os.environ, **adapter.env, **timing_env, "HTTP_PORT": str(port), "LEVEL": str(level),
              "OPERATOR_TOKEN": adapter.operator_token, "FAILPOINTS": "", "TMPDIR": role_tmp}
    common.pop("VIRTUAL_ENV", None)
    return timings_in_effect, {**common, **tenant.env(proxied=True)}


def run_setup_command(adapter, env: dict, log_path: Path) -> tuple[int, float]:
    """Run the adapter's [setup] command once for a fresh tenant, its output in ``log_path``: (exit code, seconds)."""
    setup = adapter.setup
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with open(log_path, "wb") as log:
        done = subprocess.run(adapter.resolve_command(setup["command"]),
                              env={**env, **{k: str(v) for k, v in (setup.get("env") or {}).items()}},
                              stdout=log, stderr=subprocess.STDOUT, timeout=float(setup.get("timeout_seconds", 120)),
                              start_new_session=True)
    return done.returncode, time.monotonic() - began


def prepare_ahead(adapter, scenario, level: int, tenant):
    """For a grade's tenants made ahead: this run's port, role folder and environment chosen now, and the adapter's
    setup command run in the fresh tenant with them, as the run would at its start. None when the adapter has no
    setup command (nothing to gain). A setup that fails here raises: the grade drops the tenant and the run makes
    its own, meeting the same failure in its own history."""
    if not adapter.setup:
        return None
    port = int(adapter.http["port"]) or free_port()
    role_tmp = tempfile.mkdtemp(prefix="harness-roles-")
    log_fd, log_path = tempfile.mkstemp(prefix="harness-setup-", suffix=".log")
    os.close(log_fd)
    prepared = tenants_ahead.Prepared(port, role_tmp, log_path)
    try:
        _, env = run_environment(adapter, scenario, level, tenant, port, role_tmp)
        returncode, prepared.seconds = run_setup_command(adapter, env, Path(log_path))
        if returncode != 0:
            raise RuntimeError(f"setup command exited {returncode}")
    except BaseException:
        prepared.discard()
        raise
    return prepared


def with_port(url: str, port: int) -> str:
    """``url`` with its port replaced (a role's own proxy in front of the same service)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = parts.netloc.rsplit(":", 1)[0] if parts.port is not None else parts.netloc
    return urlunsplit(parts._replace(netloc=f"{netloc}:{port}"))


def new_run_id(name: str, seed: int) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{name}-s{seed}-{os.getpid() % 10000:04d}{random.randrange(100):02d}"


class ScenarioRun:
    def __init__(self, scenario, adapter, stack, seed: int, level: int | None = None, run_dir: Path | None = None,
                 progress=None):
        self.scenario = scenario
        self.adapter = adapter
        self.stack = stack
        self.seed = int(seed)
        self.level = int(level or adapter.level)
        self.run_dir = Path(run_dir or REPORTS_DIR / new_run_id(scenario.name, self.seed))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.say = progress or (lambda text: None)
        self.timings: dict[str, float] = {}
        self.stopping = threading.Event()
        self.metrics_urls: dict[str, str] = {}  # instance -> its /metrics, for roles besides the HTTP role
        self.schedule = resolve_schedule(list(scenario.raw.get("faults") or []), self.seed,
                                         {**adapter.timings, **(scenario.raw.get("timings") or {})})
        w = scenario.raw["workload"]
        self.ops = workload.plan(self.seed, int(w.get("uploads", 0)), int(w.get("bad", 0)), int(w.get("poison", 0)),
                                 int(w.get("max_side", 96)), poison_at=w.get("poison_at") or (),
                                 min_side=int(w.get("min_side", 16)), heavy=int(w.get("heavy", 0)),
                                 heavy_side=int(w.get("heavy_side", 4000)), hostile=w.get("hostile") or ())
        self.t0 = time.monotonic()
        self.timings_in_effect = adapter.timings
        self.faults: FaultContext | None = None  # built with the roles (_start_roles): all a fault kind sees

    # --- helpers --------------------------------------------------------------------------------
    @contextmanager
    def phase(self, name: str):
        began = time.monotonic()
        self.history.append("phase", name=f"{name}_start")
        try:
            yield
        finally:
            took = time.monotonic() - began
            self.timings[name] = round(self.timings.get(name, 0) + took, 3)
            self.history.append("phase", name=f"{name}_end", seconds=round(took, 3))

    def log(self, text: str) -> None:
        self.say(f"[{time.monotonic() - self.t0:6.1f}s] {self.scenario.name}: {text}")

    def abort(self) -> None:
        """Ask this run, from another thread, to end early (its grade was interrupted): the phase under way stops
        waiting, the next ones are not entered, and the teardown stops the roles as usual."""
        self.stopping.set()

    def _check_not_aborted(self, phase: str) -> None:
        if self.stopping.is_set():
            raise RuntimeError(f"run aborted before {phase}: its grade was interrupted")

    # --- the run --------------------------------------------------------------------------------
    def execute(self) -> dict:
        self.history = HistoryWriter(self.run_dir / "history.jsonl")
        self.history.append("note", message="run start", scenario=self.scenario.name, seed=self.seed,
                            sut=self.adapter.name, level=self.level,
                            workload_fingerprint=workload.fingerprint(self.ops),
                            schedule_fingerprint=schedule_fingerprint(self.schedule))
        error = None
        final = {"read_ok": False, "errors": ["run did not reach the final read"], "attachments": {}}
        self.supervisor = self.tenant = None
        self.observer = self.tap = self.objects = None
        try:
            with self.phase("setup"):
                self._setup()
            self._check_not_aborted("start_roles")
            with self.phase("start_roles"):
                self._start_roles()
            self._check_not_aborted("the workload")
            with self.phase("faults_and_workload"):
                self._workload_and_faults()
            self._check_not_aborted("heal")
            with self.phase("heal"):
                self._heal()
            self._check_not_aborted("drain")
            with self.phase("drain"):
                self._drain()
            self._check_not_aborted("the final read")
            with self.phase("final_read"):
                retention_wait = staging_retention_wait(self.history.path, self.timings_in_effect,
                                                        self.scenario.raw.get("checks"), time.time())
                if retention_wait:  # staged originals of tries that got no 202 outlive their retention first
                    self.history.append("note", message="final read waits out the staging retention",
                                        seconds=round(retention_wait, 2))
                    with timing.split(self, "retention_wait"):
                        self.stopping.wait(retention_wait)
                self._read_metrics()
                final = read_final(self.base_url, self._attachment_ids(), self.env_direct, self.tap,
                                   events=self.adapter.has("events"))
                work = amqp_queue_depth(self.tenant.direct.amqp_url, self.adapter.broker["work_queue"])
                if work is not None:
                    final.setdefault("queues", {})["work"] = work
                    self.history.append("queue", queue=self.adapter.broker["work_queue"], dead_letter=False,
                                        final=True, **work)
                with timing.split(self, "consumers_stop_count"):
                    self._count_left_after_consumers_stop()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.log(f"run error: {error}")
            self.history.append("note", message="run error", error=error)
        finally:
            with self.phase("stop"):
                self._teardown()
        run = self.run_record(error)
        (self.run_dir / "final.json").write_text(json.dumps(final, indent=1, sort_keys=True, default=str))
        (self.run_dir / "run.json").write_text(json.dumps(run, indent=1, sort_keys=True, default=str))
        self.history.close()
        from .report import write_scenario_reports

        began = time.monotonic()
        results = check_run_dir(self.run_dir, write=False)
        run["timings"]["check"] = round(time.monotonic() - began, 3)
        (self.run_dir / "run.json").write_text(json.dumps(run, indent=1, sort_keys=True, default=str))
        results["timings"] = run["timings"]
        results["timings_detail"] = run.get("timings_detail", {})
        write_scenario_reports(self.run_dir, results)
        return results

    def run_record(self, error) -> dict:
        return {
            "run_id": self.run_dir.name,
            "scenario": self.scenario.to_dict(),
            "seed": self.seed,
            "level": self.level,
            "adapter": {**self.adapter.summary(), "timings": self.timings_in_effect},
            # message_hygiene: the bucket, the S3 endpoints' host:port and the secrets' hashes the roles were given
            "storage": storage_record(getattr(self, "env", None) or {}, self.adapter.operator_token,
                                      getattr(self, "env_direct", None) or {},
                                      *(getattr(self, "role_links", None) or {}).values()),
            "workload": [op.describe() for op in self.ops],
            "workload_fingerprint": workload.fingerprint(self.ops),
            "schedule": self.schedule,
            "schedule_fingerprint": schedule_fingerprint(self.schedule),
            "window_hits": self.faults.window_hits if self.faults else [],
            "timings": dict(self.timings),
            "timings_detail": dict(getattr(self, "timings_detail", {})),  # the phases' parts (harness/timing.py)
            "error": error,
            "started_at": datetime.fromtimestamp(time.time() - (time.monotonic() - self.t0), timezone.utc).isoformat(),
        }

    # --- phases ---------------------------------------------------------------------------------
    def _setup(self) -> None:
        # Unique per run: two grades with the same seed on one stack (grade-many, a rerun) never share a tenant.
        tenant_name = f"h{self.seed % 100000}-{uuid.uuid4().hex[:6]}-{self.scenario.name[:20]}"
        # Its own Toxiproxy proxies: a cut or a toxic of this run reaches only its roles, so runs can share a stack.
        # A grade may have made it ahead while the previous scenario drained (harness/tenants_ahead.py).
        with timing.split(self, "tenant"):
            self.tenant = tenants_ahead.take_or_make(self, tenant_name)
            self.toxiproxy = self.stack.tenant_toxiproxy(self.tenant)
        prepared = getattr(self, "prepared_ahead", None)  # the setup command already run by the grade, if any
        self.port = prepared.port if prepared else int(self.adapter.http["port"]) or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        # Each run's roles get a private temporary folder, as a container would, removed when they stop: whatever
        # they leave there (pool sockets of a killed process, spooled uploads) is not left on the machine.
        self.role_tmp = prepared.role_tmp if prepared else tempfile.mkdtemp(prefix="harness-roles-")
        self.timings_in_effect, self.env = run_environment(self.adapter, self.scenario, self.level, self.tenant,
                                                           self.port, self.role_tmp)
        with timing.split(self, "tenant"):  # a role's own proxies are the tenant's too
            self.role_links = self._role_links()
        self.skew = clock.resolve(self.scenario.raw.get("clock_skew") or [], self.adapter,
                                  self.scenario.raw.get("windows") or [], self.timings_in_effect)
        self.zones = clock.resolve_tz(self.scenario.raw.get("clock_skew") or [], self.adapter,
                                      self.scenario.raw.get("windows") or [])
        self.clock_groups = clock.groups_of(self.scenario.raw.get("clock_skew") or [], self.adapter,
                                            self.scenario.raw.get("windows") or [])
        self.env_direct = self.tenant.env(proxied=False)
        if prepared:
            (self.run_dir / "logs").mkdir(exist_ok=True)
            shutil.move(prepared.log_path, self.run_dir / "logs" / "setup.log")
            self.history.append("note", message="setup command run ahead by the grade, in this tenant with this "
                                "run's environment", seconds=round(prepared.seconds, 3))
            self.log(f"setup: run ahead ({prepared.seconds:.1f}s)")
        elif self.adapter.setup:
            with timing.split(self, "setup_command"):
                self.log(f"setup: {' '.join(self.adapter.resolve_command(self.adapter.setup['command']))}")
                returncode, _ = run_setup_command(self.adapter, self.env, self.run_dir / "logs" / "setup.log")
                if returncode != 0:
                    raise RuntimeError(f"setup command exited {returncode}; see logs/setup.log")
        broker = self.adapter.broker
        self.management = Management(self.tenant.rabbitmq_management_url, self.tenant.direct.amqp_url,
                                     management_urls=getattr(self.tenant, "rabbitmq_management_urls", ()))
        self.tap = Tap(self.management, self.history, broker["work_queue"], broker.get("dead_letter_queue"))
        with timing.split(self, "tap_prepare"):
            self.tap.prepare()
            # Every delivery from the work queue is traced for the whole run (delivery_accounting, ack_after_commit).
            self.tap.trace_deliveries()

    def _start_roles(self) -> None:
        self.supervisor = Supervisor(self.run_dir, self.history, on_exit=lambda i, info: self.faults.on_exit(i, info))
        self.faults = self._fault_context()
        counts = {role: n for key, n in (self.scenario.raw.get("roles") or {}).items()
                  for role in self.adapter.expand_roles([key])}
        for name, role in self.adapter.roles.items():
            command = self.adapter.resolve_command(role.command)
            skew = self._skew_env(name)
            for index in range(int(counts.get(name, role.instances))):
                instance = name if index == 0 else f"{name}#{index + 1}"
                self.supervisor.add(instance, name, command, {**self.env, **role.env, **skew,
                                                              **self.role_links.get(name, {}),
                                                              **self._metrics_env(instance, name)})
        # Each fault kind's prepare (chaos/kinds/): a failpoint armed before the workload is armed at first start (no
        # extra restart needed); a role held before the workload (a backlog builds up) is never started until its
        # release.
        for step in self.schedule:
            fault_kinds.prepare(self.faults, step)
        with timing.split(self, "role_spawn"):
            for name in self.supervisor.instances:
                if name not in self.faults.held:
                    self.supervisor.start(name, self.faults.first_start_env(name))
        with timing.split(self, "role_healthy"):
            self._wait_healthy()
            self._verify_skew()
        # The topology may be declared by the roles at start, so the tap mirrors it only now (and keeps it in
        # sync); a work queue that only a held consumer declares appears later and is picked up then.
        with timing.split(self, "topology"):
            self.tap.wait_for_topology(float(self.adapter.http.get("startup_timeout_seconds", 30)) / 3)
        self._start_observers()

    def _start_observers(self) -> None:
        with timing.split(self, "observers"):
            self.observer = ApiObserver(self.base_url, self.history, events=self.adapter.has("events"))
            from .ready_snapshot import ReadySnapshot

            self.observer.on_ready = ReadySnapshot(self.env_direct, self.history)  # duplicate_effects' before-image
            self.observer.on_version_ready = self.observer.on_ready.version_ready  # level 5: version_isolation's
            self.observer.start()
            self.faults.observer = self.observer
            if self.scenario.raw.get("watch_objects"):
                self.objects = ObjectWatcher(self.env_direct, self.history)
                self.history.append("phase", name="object_watch_start", bucket=self.objects.bucket)
                self.objects.start()
            if self.scenario.raw.get("exactness") == "approximate":
                self.tap.trace_deliveries()  # a timed kill's evidence of its window: redeliveries (fault_coverage)
            self.tap.start()

    def _metrics_env(self, instance: str, role: str) -> dict[str, str]:
        """The listener variables of an instance of a role that serves /metrics besides the HTTP role (adapter
        [metrics]); its URL is kept for the read after the drain."""
        declared = self.adapter.raw.get("metrics") or {}
        if role not in (declared.get("roles") or []):
            return {}
        port = free_port()
        self.metrics_urls[instance] = f"http://127.0.0.1:{port}{declared.get('path', '/metrics')}"
        return metrics.instance_env(declared.get("env") or {}, port)

    def _read_metrics(self) -> None:
        """One read of every /metrics the adapter declares, after the drain: a ``metrics`` event per instance with
        the totals of the metrics the adapter names (today the expiry counter), or why it could not be read."""
        names = {n for n in [self.adapter.expiry.get("metric")] if n}
        declared = self.scenario.checks
        if not names or (declared is not None and "expiry_metric" not in declared):
            return
        urls = {self.adapter.http.get("role", "api"): f"{self.base_url}/metrics", **self.metrics_urls}
        for instance, url in urls.items():
            alive = instance in self.supervisor.instances and self.supervisor.instances[instance].alive()
            self.history.append("metrics", instance=instance, role=instance.split("#")[0], url=url, alive=alive,
                                **metrics.read(url, names))

    def _role_links(self) -> dict[str, dict[str, str]]:
        """Role -> URL variables through proxies of its own, for every role a network fault of the schedule targets
        (``role`` on a toxic step): that fault then reaches those roles alone, the others keep their links."""
        links: dict[str, dict[str, str]] = {}
        variables = {"postgres": "DATABASE_URL", "rabbitmq": "AMQP_URL", "s3": "S3_ENDPOINT_URL"}
        for step in self.schedule:
            if step["action"] != "toxic" or not step.get("role"):
                continue
            for role in self.adapter.expand_roles([step["role"]], self.scenario.raw.get("windows") or []):
                var = variables[step["service"]]
                if var in links.get(role, {}):
                    continue
                port = self.stack.role_proxy(self.tenant, role, step["service"])
                links.setdefault(role, {})[var] = with_port(self.env[var], port)
                if var == "AMQP_URL" and self.env.get("AMQP_URLS"):  # a cluster: this role's one link, no list
                    links[role]["AMQP_URLS"] = links[role][var]
        if links:
            self.toxiproxy = self.stack.tenant_toxiproxy(self.tenant)
        return links

    def _skew_env(self, role: str) -> dict:
        """LD_PRELOAD=libfaketime + FAKETIME (and TZ) for a role the scenario's clock_skew names (harness/clock.py)."""
        zone = {"TZ": self.zones[role]} if role in self.zones else {}
        if role not in self.skew:
            return zone
        lib = clock.library()
        if lib is None:
            return zone
        return {**clock.faketime_env(self.skew[role], lib, {**self.env, **self.adapter.roles[role].env}), **zone}

    def _verify_skew(self, only: list[str] | None = None) -> None:
        """Record, per skewed instance, whether its clock offset is shown to be in effect (harness/clock.py), and the
        TZ each zoned instance started with."""
        for name, instance in self.supervisor.instances.items():
            if instance.role in self.zones and only is None:
                self.history.append("observe", source="clock_tz", role=name, tz=self.zones[instance.role],
                                    groups=self.clock_groups.get(instance.role, []), status="set",
                                    reason="TZ set in the role's environment at start")
        if not self.skew:
            return
        from .supervisor import group_members

        lib = clock.library()
        with http_clients.client(base_url=self.base_url) as client:
            for name, instance in self.supervisor.instances.items():
                if instance.role not in self.skew or (only is not None and name not in only):
                    continue
                offset = self.skew[instance.role]
                if lib is None:
                    found = {"status": "unavailable", "reason": "libfaketime not found (Debian: apt-get install "
                             "faketime; or set HARNESS_LIBFAKETIME)"}
                else:
                    http = self.adapter.http.get("health_path", "/healthz") if instance.role == self.adapter.http["role"] else None
                    found = clock.verify(instance, offset, group_members, http, client if http else None)
                self.history.append("observe", source="clock_skew", role=name, offset_seconds=offset,
                                    groups=self.clock_groups.get(instance.role, []), **found)
                self.log(f"clock of {name} +{offset:g}s: {found['status']} ({found['reason']})")

    def _wait_healthy(self, timeout: float | None = None) -> None:
        wait_http_healthy(self.adapter, self.base_url, timeout)

    def _fault_context(self) -> FaultContext:
        """All the fault kinds see of this run (chaos/context.py): built once, with the roles; the observer and the
        workload's start are set on it when they exist."""
        broker = BrokerHandle(self.management, self.tap, self.tenant.direct.amqp_url,
                              str(getattr(self.tenant.direct, "amqp_urls", "") or ""),
                              self.adapter.broker["work_queue"])
        return FaultContext(
            adapter=self.adapter, seed=self.seed, windows=list(self.scenario.raw.get("windows") or []),
            schedule=self.schedule, supervisor=self.supervisor, history=self.history, stack=self.stack,
            broker=broker, base_url=self.base_url, stopping=self.stopping, log=self.log,
            processes=ProcessFaults(self.supervisor, self.history), network=NetworkFaults(self.toxiproxy, self.history),
            services=ServiceFaults(self.stack, self.history), failpoints=FailpointFaults(self.supervisor, self.history),
            instance_env=self._metrics_env, after_release=self._verify_released)

    def _verify_released(self, names: list[str]) -> None:
        """Roles held from the start were not skew-verified then: once their processes are up."""
        if any(self.supervisor.instances[n].role in self.skew for n in names):
            def verify_released():
                time.sleep(0.5)
                self._verify_skew(names)
            threading.Thread(target=verify_released, daemon=True).start()

    def _workload_and_faults(self) -> None:
        w = self.scenario.raw["workload"]
        client = http_clients.client(base_url=self.base_url)
        uploader = workload.Uploader(client, self.history, retries=8, retry_delay=0.5)
        self.workload_started = self.faults.workload_started = time.monotonic()
        nemesis = threading.Thread(target=self._nemesis, name="nemesis", daemon=True)
        nemesis.start()
        spacing = float(w.get("spacing_seconds", 0.1))
        paced = bool(w.get("paced", False))
        self.log(f"workload: {len(self.ops)} uploads (seed {self.seed}), {len(self.schedule)} faults")

        def one(indexed):
            index, op = indexed
            wait = spacing * index
            if paced:  # an even rate: upload i at spacing × i after the start, whichever thread sends it
                wait = max(0.0, self.workload_started + spacing * index - time.monotonic())
            if self.stopping.wait(wait):
                return  # aborted: the rest of the workload is not sent
            uploader.upload(op, on_accepted=self.observer.watch)

        with ThreadPoolExecutor(int(w.get("concurrency", 2))) as pool:
            list(pool.map(one, enumerate(self.ops)))
        workload.idempotency_probes(uploader, self.ops, self.seed, int(w.get("repeat_keys", 0)),
                                    int(w.get("conflicting_keys", 0)), on_accepted=self.observer.watch)
        self.faults.workload_done.set()
        self.log(f"workload done: {len(self.observer.ids)} accepted of {len(self.ops)}")
        with timing.split(self, "faults_after_workload"):  # the nemesis's steps still under way
            nemesis.join(float(self.scenario.raw.get("nemesis_timeout_seconds", 90)))
        client.close()

    # --- nemesis --------------------------------------------------------------------------------
    def _nemesis(self) -> None:
        threads = []
        for step in self.schedule:
            thread = threading.Thread(target=self._run_step_safely, args=(step,), daemon=True,
                                      name=f"fault-{step['index']}")
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()

    def _run_step_safely(self, step) -> None:
        """A fault step's own thread: its kind (chaos/kinds/<action>.py) waits for the trigger, applies the fault,
        undoes it; a failure is recorded, never raised into the run."""
        try:
            fault_kinds.run(self.faults, step)
        except Exception as exc:
            self.history.append("note", message="fault step failed", fault=step["index"], error=repr(exc))
            self.log(f"fault step {step['index']} failed: {exc!r}")

    # --- heal / drain / teardown ----------------------------------------------------------------
    def _heal(self) -> None:
        for step in self.schedule:
            fault_kinds.heal(self.faults, step)  # the kind's heal; by default the release of the roles the step held
        repaired = heal_all(self.supervisor, self.toxiproxy, self.faults.expected_running(), self.history, self.stack)
        if repaired:  # a role restarted by the heal (an armed API, say) must answer before the drain reads it
            self._wait_healthy()
        self.log("healed and verified" + (f" (repaired: {'; '.join(repaired)})" if repaired else ""))

    def _attachment_ids(self) -> list[str]:
        ids = list(self.observer.ids) if self.observer else []
        return ids

    def drain_budget(self) -> float:
        """The scenario's drain time, but never shorter than this implementation needs to recover a job whose
        owner died: its lease plus two sweeps, twice (a retry may need a second recovery), plus slack."""
        t = self.timings_in_effect
        recovery = 2 * (float(t.get("lease_seconds", 0)) + 2 * float(t.get("sweep_interval_seconds", 0))) + 10
        return max(float(self.scenario.raw.get("drain_seconds", 25)), recovery)

    def _drain(self) -> None:
        """Wait until every accepted upload is terminal. The budget counts from the last progress (a job ending), so
        a backlog that drains slowly on a loaded machine is not mistaken for lost work; a run with no progress for a
        whole budget ends, and so does one past four budgets in all."""
        budget = self.drain_budget()
        began = last_progress = time.monotonic()
        last_report, done_before = 0.0, -1
        while (time.monotonic() - last_progress < budget and time.monotonic() - began < 4 * budget
               and not self.stopping.is_set()):
            states = [self.observer.states.get(a) for a in self.observer.ids]
            pending = [s for s in states if s not in TERMINAL]
            if not pending:
                break
            if len(states) - len(pending) > done_before:
                done_before, last_progress = len(states) - len(pending), time.monotonic()
            if time.monotonic() - last_report > 3:
                last_report = time.monotonic()
                self.log(f"draining: {len(pending)} of {len(states)} not terminal")
            time.sleep(0.2)
        timing.add(self, "drain_wait", time.monotonic() - began)
        deadline = time.monotonic() + budget
        # The work queue must empty too: counted exactly over AMQP, not from the lagging management statistics.
        queue_deadline = min(deadline, time.monotonic() + 10)
        while time.monotonic() < queue_deadline:
            depth = amqp_queue_depth(self.tenant.direct.amqp_url, self.adapter.broker["work_queue"]) or {}
            if not depth.get("ready"):
                break
            time.sleep(0.3)
        timing.add(self, "queue_wait", time.monotonic() - deadline + budget)
        self.faults.stop_sampler()  # the backlog is gone: nothing left to bound
        settle = float(self.scenario.raw.get("settle_seconds", 0.5))
        with timing.split(self, "settle"):  # lets what a fault set off after the last terminal state show
            time.sleep(settle)
        self.observer.tick()
        self.tap.drain_once()
        states = [self.observer.states.get(a) for a in self.observer.ids]
        self.log(f"drained: {sum(s == 'ready' for s in states)} ready, {sum(s == 'failed' for s in states)} failed, "
                 f"{sum(s not in TERMINAL for s in states)} other")

    def _count_left_after_consumers_stop(self) -> None:
        """After the drain and the final read, nothing may be left in the work queue, ready or unacked
        (delivery_accounting). Every consumer instance is stopped — which returns any unacked delivery to ready —
        and the queue is counted exactly (passive declare). When something is left, a late harmless duplicate may
        have been in flight at the stop: the consumers get one bounded settle (``queue_settle_seconds``, running,
        until the queue is empty and a moment more to settle what they took), then are stopped and counted again;
        the second count is the one judged. What is left is named by one look with requeue: the run is over, it
        changes nothing that is judged."""
        if self.stopping.is_set():
            return
        queue, url = self.adapter.broker["work_queue"], self.tenant.direct.amqp_url
        consumers = self.faults.consumers()

        def stop_and_count() -> dict | None:
            self.faults.extra_stopped.update(consumers)  # no restart timer may bring one back now
            if consumers:
                with ThreadPoolExecutor(len(consumers), thread_name_prefix="stop-consumers") as pool:
                    list(pool.map(lambda name: self.supervisor.stop(name, 3), consumers))
            return amqp_queue_depth(url, queue)

        after, settle = stop_and_count(), None
        if after and after.get("ready") and not self.stopping.is_set():
            bound = float(self.scenario.raw.get("queue_settle_seconds", 6.0))
            began, emptied = time.monotonic(), None
            self.faults.extra_stopped.difference_update(consumers)
            for name in consumers:
                self.supervisor.ensure_running(name, {"FAILPOINTS": ""})
            while time.monotonic() - began < bound and not self.stopping.is_set():
                exact = amqp_queue_depth(url, queue) or {}
                if exact.get("ready") == 0 and exact.get("consumers"):
                    emptied = emptied or time.monotonic()
                    if time.monotonic() - emptied >= 1.0:
                        break
                else:
                    emptied = None
                time.sleep(0.25)
            settle = {"first_ready": after.get("ready"), "seconds": round(time.monotonic() - began, 2),
                      "emptied": emptied is not None}
            after = stop_and_count()
        left = []
        if after and after.get("ready"):
            try:
                for message in self.management.get(queue, 20, requeue=True):
                    body = decode_payload(message)[0] or {}
                    left.append({"job_id": body.get("job_id"), "attachment_id": body.get("attachment_id"),
                                 "attempt": body.get("attempt"), "redelivered": message.get("redelivered")})
            except Exception as exc:
                self.history.append("note", message="could not name the messages left in the work queue",
                                    error=repr(exc))
            self.log(f"{after.get('ready')} messages left in {queue} once every consumer stopped")
        self.history.append("queue", kind="after_consumers_stopped", queue=queue, dead_letter=False,
                            ready=None if after is None else after.get("ready"),
                            consumers=None if after is None else after.get("consumers"),
                            stopped=consumers, **({"settle": settle} if settle else {}),
                            **({"messages": left} if left else {}))

    def _teardown(self) -> None:
        self.stopping.set()
        if self.faults is not None:
            self.faults.cancel_restarts()
            self.faults.stop_sampler()
        for poller in (self.observer, self.tap, self.objects):
            if poller is not None:
                poller.halt()
        if self.objects is not None:
            self.history.append("phase", name="object_watch_end", lists=self.objects.lists, errors=self.objects.errors,
                                last_error=self.objects.last_error)
        if self.supervisor is not None:
            with timing.split(self, "role_stop"):
                self.supervisor.stop_all()
        teardown_began = time.monotonic()
        if getattr(self, "role_tmp", None):
            shutil.rmtree(self.role_tmp, ignore_errors=True)
        if self.tenant is not None:
            try:
                self.stack.close_tenant(self.tenant)
            except Exception as exc:
                self.history.append("note", message="removing the run's proxies failed", error=repr(exc))
        timing.add(self, "teardown", time.monotonic() - teardown_began)


def check_run_dir(run_dir: Path, write: bool = True) -> dict:
    """Recompute the verdicts of a stored run from history.jsonl + final.json + run.json alone."""
    run_dir = Path(run_dir)
    history = History.load(run_dir / "history.jsonl")
    final = json.loads((run_dir / "final.json").read_text())
    run = json.loads((run_dir / "run.json").read_text())
    verdicts = checkers.run_checks(history, final, run)
    declared = (run.get("scenario") or {}).get("checks")
    statuses = [v.status for v in verdicts if checkers.counts(v, declared)]
    if run.get("error"):
        statuses.append(checkers.UNKNOWN)
    results = {
        "report_version": 1,
        "kind": "scenario",
        "run_id": run["run_id"],
        "scenario": {k: run["scenario"].get(k) for k in ("name", "description", "windows", "requirements",
                                                          "verifies", "level", "exactness", "checks")},
        "seed": run["seed"],
        "level": run["level"],
        "sut": {"name": run["adapter"]["name"], "path": run["adapter"].get("path"), "level": run["adapter"]["level"]},
        "verdict": checkers.combine(statuses),
        "error": run.get("error"),
        "verdicts": [v.to_dict() for v in verdicts],
        "window_hits": run.get("window_hits", []),
        "timings": run.get("timings", {}),
        "timings_detail": run.get("timings_detail", {}),
        "history_lines": len(history),
        "reproduce": f"harness run {run['scenario']['name']} --seed {run['seed']} --sut {run['adapter'].get('path') or run['adapter']['name']} --level {run['level']}",
    }
    if write:
        from .report import write_scenario_reports

        write_scenario_reports(run_dir, results)
    return results
