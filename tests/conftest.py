"""Shared fixtures: the real stack (session scope), a fresh tenant per test, no fault leaking between tests."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.stack import Stack, Tenant

REPO_ROOT = Path(__file__).resolve().parents[1]
PRIVATE_TMP = pytest.StashKey[str]()
TMP_BEFORE = pytest.StashKey[tuple]()


def pytest_configure(config: pytest.Config) -> None:
    # Started in the background (nohup, a CI runner), the test process inherits SIGINT as ignored; the tests of
    # interrupt handling, like the CLI, need Python's own handler: set it rather than assume it.
    from harness.stack.process import interrupt_on_ctrl_c

    interrupt_on_ctrl_c()
    # pytest's temporary folders go under the checkout's git-ignored .run/pytest instead of /tmp, so a test run
    # leaves nothing in /tmp. pytest still numbers, locks and prunes them there (with tmp_path_retention_policy
    # "failed", only the folders of failed tests, from the last 3 runs, stay for a look).
    if config.option.basetemp is None and not os.environ.get("PYTEST_DEBUG_TEMPROOT"):
        root = REPO_ROOT / ".run" / "pytest"
        root.mkdir(parents=True, exist_ok=True)
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(root)
    # Everything the tests start (roles, their process pools, this process's own pools) gets one private
    # temporary folder, removed at the end: a killed process pool leaves its /tmp/pymp-* folder behind otherwise.
    system_tmp = tempfile.gettempdir()
    config.stash[TMP_BEFORE] = (system_tmp, set(os.listdir(system_tmp)))
    private = tempfile.mkdtemp(prefix="harness-tests-")
    os.environ["TMPDIR"] = tempfile.tempdir = private
    config.stash[PRIVATE_TMP] = private


def pytest_unconfigure(config: pytest.Config) -> None:
    private = config.stash.get(PRIVATE_TMP, None)
    if private:
        # This process's own multiprocessing folders (pymp-*) are removed by multiprocessing at exit; remove the
        # private folder after them (a finalizer of lower priority), so neither trips over the other.
        from multiprocessing.util import Finalize

        Finalize(None, shutil.rmtree, args=(private,), kwargs={"ignore_errors": True}, exitpriority=-200)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true",
                     help="run soak/load/benchmark tests at full size instead of the short CI size")
    parser.addoption("--long", action="store_true",
                     help="also run the long runs (marker `long`) that `make test` leaves to `make test-long`")


LONG_SKIP = ("a long run, left out of `make test` (CI) to keep it within 45 minutes: `make test-long` runs it; "
             "its last result is in docs/TRACK-RECORD.md (Long runs)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the long runs out unless asked for: by ``--long``, by a ``-m`` naming them, or by node id (one long
    test named on the command line runs, as a person reproducing it expects)."""
    if config.getoption("--long") or "long" in (config.getoption("-m") or ""):
        return
    named = {(Path(arg.split("::", 1)[0]).resolve(), arg.split("::")[-1].split("[", 1)[0])
             for arg in config.args if "::" in arg}
    for item in items:
        if item.get_closest_marker("long") is None:
            continue
        if (Path(item.path).resolve(), getattr(item, "originalname", item.name)) in named:
            continue
        item.add_marker(pytest.mark.skip(reason=LONG_SKIP))


@pytest.fixture(scope="session")
def full_size(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--full") or os.environ.get("FULL_SIZE") == "1")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    """PostgreSQL 15, RabbitMQ, SeaweedFS S3 and Toxiproxy, private to this test session.

    Its logs stay in the session's tmp folder; its data goes with `stop()`.
    """
    run_dir = tmp_path_factory.mktemp("stack")
    started = Stack.start(run_dir)
    print(f"\n[stack] ready in {started.ready_seconds['total']:.1f}s: "
          + ", ".join(f"{k} {v:.1f}s" for k, v in started.ready_seconds.items() if k != "total"))
    yield started
    started.stop()


@pytest.fixture
def tenant(stack: Stack, request: pytest.FixtureRequest) -> Iterator[Tenant]:
    """A fresh database, vhost and bucket for this test (its S3 key removed after it: harness/stack/stack.py)."""
    tenant = stack.new_tenant(f"{request.node.name[:24]}-{uuid.uuid4().hex[:8]}")
    yield tenant
    try:
        stack.close_tenant(tenant)
    except Exception as exc:  # a test that left a service down: _no_fault_leaks below says so
        print(f"[tenant] closing {tenant.name} failed: {exc!r}")


@pytest.fixture(autouse=True)
def _no_fault_leaks(request: pytest.FixtureRequest):
    """After every test that used the stack: every toxic removed, every proxy enabled, every service up."""
    yield
    if "stack" not in request.fixturenames:
        return
    stack: Stack = request.getfixturevalue("stack")
    for name in ("postgres", "rabbitmq", "s3", "toxiproxy"):
        if not stack.alive(name):
            stack.restart(name)
    stack.toxiproxy.reset()


# --- measurements in the CI log ---------------------------------------------------------------------------
# Benchmarks and load runs print lines tagged [bench], [load] or [stack]; pytest hides the output of passing
# tests, so collect those lines and repeat them in the terminal summary, where CI logs keep them.
_MEASUREMENT_TAGS = ("[bench]", "[load]", "[stack]", "[grade]")
_measurements: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for line in report.capstdout.splitlines():
        if line.strip().startswith(_MEASUREMENT_TAGS):
            _measurements.append(f"{report.nodeid.split('::')[-1]}: {line.strip()}")


def pytest_terminal_summary(terminalreporter) -> None:
    system_tmp, before = terminalreporter.config.stash.get(TMP_BEFORE, (None, set()))
    if system_tmp:  # the suite must leave nothing in the machine's temporary folder
        left = sorted(set(os.listdir(system_tmp)) - before - {Path(terminalreporter.config.stash[PRIVATE_TMP]).name})
        _measurements.append(f"[tmp] new entries in {system_tmp} after the tests: {', '.join(left[:20]) or 'none'}")
    if _measurements:
        terminalreporter.section("measurements (ratios are against a baseline taken in the same run)")
        for line in _measurements:
            terminalreporter.write_line(line)
