"""Tenants prepared ahead: while scenarios run (and drain), a background thread makes the next scenarios' tenants
(database, vhost, bucket and the tenant's private Toxiproxy proxies), so a scenario's setup takes one ready.

When the grade passes ``prepare`` (``runner.prepare_ahead``), the adapter's setup command runs ahead too, in that
fresh tenant, with the environment the run will give its roles (its port and role folder chosen then): the contract
makes it a one-shot per fresh tenant, before any role. The tap, the role proxies and the roles still start in the
run itself, in the same order. A tenant is fresh and private either way (a unique name per run); one made ahead has
only existed a few seconds longer, touched by nothing but its setup command. A setup that fails ahead drops the
tenant: the run makes its own and meets the failure in its own history.

With ``template`` (an adapter that opts in with ``[setup] template = true``: ``runner.database_template``), each
tenant's database is cloned from the stack's database template, made by the first tenant that needs it (the setup
command runs there once); ``prepare`` then has no setup command to run in it.

A scenario that restarts a shared service (``grade.runs_alone``, on a stack given to the grade) must not overlap a
tenant being made: the grade calls ``hold()`` before it (waits for a tenant under way, drops the ready ones, makes
none) and ``resume()`` after.

``HARNESS_TENANTS_AHEAD=0`` turns it off (every tenant is made in its run, as before), e.g. to measure the gain.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass


def tenant_name(seed: int, scenario_name: str) -> str:
    """Unique per run: two grades with the same seed on one stack (grade-many, a rerun) never share a tenant."""
    return f"h{int(seed) % 100000}-{uuid.uuid4().hex[:6]}-{scenario_name[:20]}"


def enabled() -> bool:
    return os.environ.get("HARNESS_TENANTS_AHEAD", "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass
class Prepared:
    """What was chosen and done ahead for one run besides its tenant (``runner.prepare_ahead``)."""

    port: int
    role_tmp: str
    log_path: str
    seconds: float = 0.0

    def discard(self) -> None:
        shutil.rmtree(self.role_tmp, ignore_errors=True)
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


class TenantsAhead:
    def __init__(self, stack, seed: int, scenario_names: list[str], depth: int = 2, progress=None,
                 held: bool = False, prepare=None, template=None):
        self.stack = stack
        self.prepare = prepare  # (scenario name, tenant) -> Prepared | None, run after the tenant is made
        self.template = template  # scenario name -> (DatabaseTemplate | None, seconds spent making it now)
        self.prepared: dict[str, Prepared] = {}  # tenant name -> what was prepared ahead for its run
        self.setup_seconds = 0.0
        self.seed = int(seed)
        self.plan = list(scenario_names)  # in the order the grade starts them
        self.depth = max(1, int(depth))
        self.say = progress or (lambda text: None)
        self.ready: dict[str, object] = {}  # scenario -> tenant made ahead, not yet taken
        self.making: str | None = None
        self.skip: set[str] = set()  # taken (or made on the spot) before their turn came
        self.used = self.missed = 0
        self.seconds = 0.0
        self.errors: list[str] = []
        self.held = 1 if held else 0  # held from the start: ``resume()`` lets it begin
        self.closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="tenants-ahead", daemon=True)
        self._thread.start()

    # --- the background thread ------------------------------------------------------------------
    def _next(self) -> str | None:
        while self.plan and (self.plan[0] in self.skip or self.plan[0] in self.ready):
            self.plan.pop(0)
        return self.plan[0] if self.plan else None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self.closed and (self.held or len(self.ready) >= self.depth or self._next() is None):
                    self._cond.wait(0.5)
                if self.closed:
                    return
                scenario = self.plan.pop(0)
                self.making = scenario
            began = time.monotonic()
            tenant = None
            try:
                template = None
                if self.template is not None:
                    template, made_seconds = self.template(scenario)
                    self.setup_seconds += made_seconds  # the setup command, once, in the template
                tenant = self.stack.new_tenant(tenant_name(self.seed, scenario), private_proxies=True,
                                               **({"template": template} if template is not None else {}))
            except Exception as exc:  # the run makes its own and meets the same problem there, in its history
                self.errors.append(f"{scenario}: {exc!r}")
            if tenant is not None and self.prepare is not None:
                try:
                    prepared = self.prepare(scenario, tenant)
                    if prepared is not None:
                        self.prepared[tenant.name] = prepared
                        self.setup_seconds += prepared.seconds
                except Exception as exc:  # dropped: the run makes its own tenant and runs its setup itself
                    self.errors.append(f"{scenario}: setup ahead: {exc!r}")
                    self._close(tenant)
                    tenant = None
            with self._cond:
                self.seconds += time.monotonic() - began
                self.making = None
                if tenant is not None:
                    if self.closed or scenario in self.skip:
                        self._close(tenant)
                    else:
                        self.ready[scenario] = tenant
                self._cond.notify_all()

    def _close(self, tenant) -> None:
        prepared = self.prepared.pop(tenant.name, None)
        if prepared is not None:
            prepared.discard()
        try:
            self.stack.close_tenant(tenant)
        except Exception as exc:
            self.errors.append(f"closing {tenant.name}: {exc!r}")

    # --- the runs' side -------------------------------------------------------------------------
    def take(self, scenario: str, timeout: float = 30.0):
        """The tenant made ahead for ``scenario`` (waiting for one under way), or None: the run makes its own."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.making == scenario and time.monotonic() < deadline:
                self._cond.wait(0.2)
            tenant = None if self.held else self.ready.pop(scenario, None)
            if tenant is None:
                self.skip.add(scenario)
                self.missed += 1
            else:
                self.used += 1
            self._cond.notify_all()
            return tenant

    def take_prepared(self, tenant) -> Prepared | None:
        """What was prepared ahead for the run that took ``tenant`` (its setup command's result), if anything."""
        with self._cond:
            return self.prepared.pop(tenant.name, None)

    def hold(self) -> None:
        """No tenant is made from now until ``resume()`` (a shared service is about to restart)."""
        with self._cond:
            self.held += 1
            while self.making is not None:
                self._cond.wait(0.2)
            dropped = list(self.ready.items())
            self.ready.clear()
            for scenario, tenant in dropped:
                self.plan.insert(0, scenario)  # made again after the resume
                self._close(tenant)

    def resume(self) -> None:
        with self._cond:
            self.held = max(0, self.held - 1)
            self._cond.notify_all()

    def close(self) -> dict:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        self._thread.join(60)
        with self._cond:
            for tenant in self.ready.values():
                self._close(tenant)
            self.ready.clear()
        return self.stats()

    def stats(self) -> dict:
        return {"used": self.used, "missed": self.missed, "seconds": round(self.seconds, 2), "depth": self.depth,
                **({"setup_seconds": round(self.setup_seconds, 2)} if self.prepare is not None else {}),
                **({"errors": self.errors[:10]} if self.errors else {})}


def take_or_make(run, name: str, template=None):
    """The run's tenant: the one made ahead for it by the grade, else a new one (``harness run``, a miss), cloned
    from ``template`` when one is given (``runner.database_template``)."""
    ahead = getattr(run, "tenants_ahead", None)
    tenant = ahead.take(run.scenario.name) if ahead is not None else None
    if tenant is not None:
        run.history.append("note", message="tenant prepared ahead by the grade", tenant=tenant.name)
        run.prepared_ahead = ahead.take_prepared(tenant)
        return tenant
    if template is not None:
        return run.stack.new_tenant(name, private_proxies=True, template=template)
    return run.stack.new_tenant(name, private_proxies=True)
