"""A run's start, outside the run itself: its listener port, the environment its roles and the setup command start
with, the adapter's setup command (run by the run, or ahead by a grade in a tenant made ahead), the health wait, and
the run's id. ``harness.runner`` re-exports these names (the grade, the load roles and the tests import them there).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from . import http_clients, isolation, tenants_ahead
from .stack.ports import listener_port
from .stack.process import run_group


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
    # Isolated, a submission starts from a scrubbed environment (PATH, the locale), never the grader's own.
    inherited = isolation.base_environ() if isolation.enabled() else os.environ
    common = {**inherited, **adapter.env, **timing_env, "HTTP_PORT": str(port), "LEVEL": str(level),
              "OPERATOR_TOKEN": adapter.operator_token, "FAILPOINTS": "", "TMPDIR": role_tmp}
    common.pop("VIRTUAL_ENV", None)
    return timings_in_effect, {**common, **tenant.env(proxied=True)}


def run_setup_command(adapter, env: dict, log_path: Path) -> tuple[int, float]:
    """Run the adapter's [setup] command once for a fresh tenant, its output in ``log_path``: (exit code, seconds)."""
    setup = adapter.setup
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    argv = adapter.resolve_command(setup["command"])
    env = {**env, **{k: str(v) for k, v in (setup.get("env") or {}).items()}}
    env = adapter.interpolate_env(env)  # the adapter's ${VAR} references (harness/vocabulary.py)
    timeout = float(setup.get("timeout_seconds", 120))
    with open(log_path, "wb") as log:
        if isolation.enabled():  # the submission's own code: contained like its roles, nothing left running after
            returncode, _ = isolation.run_contained(argv, env, f"setup-{log_path.stem}", timeout, stdout=log,
                                                    stderr=subprocess.STDOUT)
        else:
            returncode = run_group(argv, env, log, timeout)
    return returncode, time.monotonic() - began


# What differs from one tenant to the next in the environment the setup command sees: left out of a template's key.
TENANT_VARIABLES = ("DATABASE_URL", "AMQP_URL", "AMQP_URLS", "S3_ENDPOINT_URL", "S3_BUCKET", "S3_ACCESS_KEY",
                    "S3_SECRET_KEY", "HTTP_PORT", "TMPDIR")


class _NoTenant:
    @staticmethod
    def env(proxied: bool = True) -> dict:
        return {}


def template_key(adapter, scenario, level: int) -> str:
    """Which database template a run's tenant may be cloned from: the adapter file, its setup command and the
    environment that command sees, less the tenant's own values (its URLs, bucket, port and folder). Two scenarios
    whose [timings] give the setup different variables get different templates."""
    _, env = run_environment(adapter, scenario, level, _NoTenant(), 0, "")
    env = {**env, **{k: str(v) for k, v in (adapter.setup.get("env") or {}).items()}}
    seen = {k: v for k, v in env.items() if k not in TENANT_VARIABLES}
    material = json.dumps([str(Path(adapter.path).resolve()), list(adapter.setup["command"]), sorted(seen.items())])
    return hashlib.sha256(material.encode()).hexdigest()


def database_template(adapter, scenario, level: int, stack):
    """``(template, seconds)`` for a run's tenant: the stack's database template for this adapter and environment,
    made now (the setup command run once, against a database of its own) when it is the first, with the seconds
    this call spent making it (0 when it was made already). ``(None, 0)`` unless the adapter opts in with
    ``[setup] template = true`` (every other adapter: the setup command runs in each tenant, as before). A template
    whose setup failed is returned not ``ok``: its tenants are made empty and their runs run the setup themselves,
    meeting the failure in their own history."""
    if not getattr(adapter, "setup_template", False) or not hasattr(stack, "database_template"):
        return None, 0.0
    key = template_key(adapter, scenario, level)

    def make(tenant) -> tuple[bool, float, str]:
        port = int(adapter.http["port"]) or free_port()
        role_tmp = tempfile.mkdtemp(prefix="harness-roles-")
        log_path = Path(stack.run_dir) / "logs" / f"setup-template-{key[:16]}.log"
        try:
            _, env = run_environment(adapter, scenario, level, tenant, port, role_tmp)
            returncode, seconds = run_setup_command(adapter, env, log_path)
        finally:
            shutil.rmtree(role_tmp, ignore_errors=True)
        return returncode == 0, seconds, str(log_path)

    began = time.monotonic()
    template, made = stack.database_template(key, make)
    return template, (time.monotonic() - began if made else 0.0)


def prepare_ahead(adapter, scenario, level: int, tenant):
    """For a grade's tenants made ahead: this run's port, role folder and environment chosen now, and the adapter's
    setup command run in the fresh tenant with them, as the run would at its start. None when the adapter has no
    setup command (nothing to gain), or the tenant's database was cloned from a template (its setup already ran).
    A setup that fails here raises: the grade drops the tenant and the run makes its own, meeting the same failure
    in its own history."""
    if not adapter.setup or getattr(tenant, "template", ""):
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
