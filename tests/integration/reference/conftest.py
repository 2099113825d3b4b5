"""Fixture `pipeline`: the reference roles against a fresh tenant of the real stack."""

from __future__ import annotations

import os

import pytest

from reference_support import REPO, SHORT_TIMINGS, Pipeline, free_port


@pytest.fixture
def pipeline(tenant, tmp_path):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("FAILPOINTS", "LEVEL", "PREFETCH", "DATABASE_URL", "AMQP_URL", "S3_"))}
    env.update(tenant.env(proxied=True))
    env.update(SHORT_TIMINGS)
    env["HTTP_PORT"] = str(free_port())
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    system = Pipeline(tenant, tmp_path, env)
    system.migrate()
    yield system
    system.stop_all()
    for role in system.roles.values():  # logs are shown when a test fails
        print(f"----- {role.name} ({role.log_path}) -----\n{role.log()[-4000:]}")
