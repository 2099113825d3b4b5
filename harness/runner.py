"""Run one scenario against one implementation on a running stack, and store everything in a run directory.

Order: fresh tenant → setup command → tap bound → roles started → observers →
pre-workload faults (failpoint arming, holds) → workload + timed faults →
heal (verified) → drain → final read → roles stopped → run.json, final.json →
checkers → reports. Every phase's duration is kept in run.json["timings"].
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from chaos import FailpointFaults, NetworkFaults, ProcessFaults, ServiceFaults, heal_all
from chaos import kinds as fault_kinds
from chaos.context import BrokerHandle, FaultContext

from . import clock, drain, http_clients, metrics, tenants_ahead, timing, workload, workload_tail
from .final_state import read_final, staging_retention_wait
from .history import HistoryWriter
from .nemesis import resolve_schedule, schedule_fingerprint
from .broker import Management, Tap, amqp_queue_depth
from .observe import ApiObserver, ObjectWatcher
from .paths import reports_dir
from .run_check import check_run_dir
from .run_setup import (database_template, free_port, new_run_id, prepare_ahead, run_environment,  # noqa: F401
                        run_setup_command, wait_http_healthy, with_port)
from .supervisor import Supervisor
from .checkers.message_hygiene import storage_record

REPORTS_DIR = reports_dir()  # reports/runs under the checkout, else under the current directory
TERMINAL = ("ready", "failed")


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
                                   events=self.adapter.has("events"), vocabulary=self.adapter.vocabulary,
                                   events_reader=self.adapter.events_reader(self.env_direct, self.env))
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
            "isolation": self.supervisor.isolation if getattr(self, "supervisor", None) else {"isolated": False},
        }

    # --- phases ---------------------------------------------------------------------------------
    def _setup(self) -> None:
        # Unique per run: two grades with the same seed on one stack (grade-many, a rerun) never share a tenant.
        tenant_name = f"h{self.seed % 100000}-{uuid.uuid4().hex[:6]}-{self.scenario.name[:20]}"
        # Its own Toxiproxy proxies: a cut or a toxic of this run reaches only its roles, so runs can share a stack.
        # A grade may have made it ahead while the previous scenario drained (harness/tenants_ahead.py).
        # [setup] template = true: the database is cloned from the stack's template, where the setup command ran once
        # (made now by the first run that needs it: that time is this run's setup_command part).
        template, made_seconds = database_template(self.adapter, self.scenario, self.level, self.stack)
        if made_seconds:
            timing.add(self, "setup_command", made_seconds)
        with timing.split(self, "tenant"):
            self.tenant = tenants_ahead.take_or_make(self, tenant_name, template)
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
        elif self.adapter.setup and getattr(self.tenant, "template", ""):
            (self.run_dir / "logs").mkdir(exist_ok=True)
            if template is not None and template.log_path and Path(template.log_path).exists():
                shutil.copyfile(template.log_path, self.run_dir / "logs" / "setup.log")
            self.history.append("note", message="database cloned from the template the setup command ran in once "
                                "([setup] template = true)", template=self.tenant.template,
                                setup_seconds=round(template.setup_seconds, 3) if template is not None else None)
            self.log(f"setup: database cloned from template {self.tenant.template}")
        elif self.adapter.setup:
            if template is not None and not template.ok:
                self.history.append("note", message="no database template (its setup failed, or it could not be "
                                    "made): the setup command runs in this tenant", error=template.error)
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
        if self.adapter.interpolated_keys:  # ${VAR} in the adapter's env values: resolved per instance at its start
            self.supervisor.prepare_env = self.adapter.interpolate_env
        self.faults = self._fault_context()
        counts = {role: n for key, n in (self.scenario.raw.get("roles") or {}).items()
                  for role in self.adapter.expand_roles([key])}
        for name, role in self.adapter.roles.items():
            command = self.adapter.resolve_command(role.command)
            skew = self._skew_env(name)
            # A Go or static program, out of libfaketime's reach: its clock is moved by clockshift (harness/clock.py).
            shifted = clock.skew_command(command, self.skew[name]) if name in self.skew else None
            if shifted is not None:
                command, skew = shifted, {k: v for k, v in skew.items() if k == "TZ"}
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
            self.observer = ApiObserver(self.base_url, self.history, events=self.adapter.has("events"),
                                        vocabulary=self.adapter.vocabulary,
                                        events_reader=self.adapter.events_reader(self.env_direct, self.env))
            from .ready_snapshot import ReadySnapshot

            self.observer.on_ready = ReadySnapshot(self.env_direct, self.history)  # duplicate_effects' before-image
            self.observer.on_version_ready = self.observer.on_ready.version_ready  # level 5: version_isolation's
            self.observer.start()
            self.faults.observer = self.observer
            if self.scenario.raw.get("watch_objects"):
                self.objects = ObjectWatcher(self.env_direct, self.history)
                self.history.append("phase", name="object_watch_start", bucket=self.objects.bucket)
                self.objects.start()
                self.faults.objects = self.objects  # the object_written trigger
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
        self.metrics_urls[instance] = f"http://127.0.0.1:{port}{self.adapter.metrics_path(role)}"
        return metrics.instance_env(declared.get("env") or {}, port)

    def _read_metrics(self) -> None:
        """One read of every /metrics the adapter declares, after the drain: a ``metrics`` event per instance with
        the totals of the metrics the adapter names (today the expiry counter), or why it could not be read."""
        names = {n for n in [self.adapter.expiry.get("metric")] if n}
        declared = self.scenario.checks
        if not names or (declared is not None and "expiry_metric" not in declared):
            return
        http_role = self.adapter.http.get("role", "api")
        urls = {http_role: f"{self.base_url}{self.adapter.metrics_path(http_role)}", **self.metrics_urls}
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
        return clock.run_role_env(self, role)

    def _verify_skew(self, only: list[str] | None = None) -> None:
        clock.verify_run(self, only)

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
            instance_env=self._metrics_env, after_release=self._verify_released,
            tenant_links={role: {var: self.env[var] for var in links if var in self.env}
                          for role, links in self.role_links.items()})

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
        uploader = workload.Uploader(client, self.history, retries=8, retry_delay=0.5,
                                     path=self.adapter.vocabulary.upload_path())
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

        tail_spec = w.get("tail") or {}
        tail_n = min(int(tail_spec.get("uploads", 0)), len(self.ops))
        main_ops, tail_ops = self.ops[:len(self.ops) - tail_n], self.ops[len(self.ops) - tail_n:]
        tail = None
        if tail_ops:  # uploads sent once the consumers are seen back (harness/workload_tail.py)
            tail = threading.Thread(target=workload_tail.run_tail, name="workload-tail", daemon=True, args=(
                tail_spec, tail_ops), kwargs=dict(
                send=lambda op: uploader.upload(op, on_accepted=self.observer.watch), observer=self.observer,
                history=self.history, consumer_roles=self.adapter.expand_roles(["@consumers"]),
                stopping=self.stopping, log=self.log))
            tail.start()
        with ThreadPoolExecutor(int(w.get("concurrency", 2))) as pool:
            list(pool.map(one, enumerate(main_ops)))
        if tail is not None:
            tail.join()
        workload.idempotency_probes(uploader, main_ops, self.seed, int(w.get("repeat_keys", 0)),
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
        self.faults.finish_looks()  # before the heal restarts a crashed role the look is still reading
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
        drain.wait_drained(self)

    def _count_left_after_consumers_stop(self) -> None:
        drain.count_left_after_consumers_stop(self)

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
                self.history.append("note", message="closing the run's tenant (its proxies, its S3 key) failed", error=repr(exc))
        timing.add(self, "teardown", time.monotonic() - teardown_began)
