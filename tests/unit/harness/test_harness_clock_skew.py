"""clock_skew (harness/clock.py): role groups resolve to the adapter's roles with a scaled offset, the libfaketime
environment keeps monotonic clocks real, and staging_safety says unknown when an offset is not shown in effect."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness import adapter as adapter_mod
from harness import clock
from harness.checkers import staging_safety
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness.scenarios import find, for_grade
from harness_histories import Builder

REPO = Path(__file__).resolve().parents[3]


def test_groups_resolve_to_the_adapters_roles_with_a_scaled_offset():
    sut = adapter_mod.load(REPO / "reference" / "adapter.toml")
    entries = [{"roles": ["@window", "@recovers_work"], "offset": {"of": "staging_retention_seconds", "times": 0.75}}]
    assert clock.resolve(entries, sut, ["after_staging_before_record"], sut.timings) == {"api": 3.75, "sweeper": 3.75}
    assert clock.resolve([{"roles": "@consumers", "offset": 2}], sut, [], sut.timings) == {"worker": 2.0}


def test_faketime_env_prepends_the_fix_and_the_library_and_keeps_monotonic_real():
    env = clock.faketime_env(3.75, "/lib/libfaketime.so.1", {"LD_PRELOAD": "/lib/other.so"}, "/t/fix.so")
    assert env == {"LD_PRELOAD": "/t/fix.so /lib/libfaketime.so.1 /lib/other.so", "FAKETIME": "+3.750",
                   "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


# A correct program that sleeps the ways Python 3.11+ does (time.sleep: clock_nanosleep(CLOCK_MONOTONIC,
# TIMER_ABSTIME); a subprocess wait with a timeout sleeps in a loop; a thread sleeping) and reports its wall clock.
SLEEPER = """
import subprocess, sys, threading, time
began = time.monotonic()
time.sleep(0.05)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
try:
    child.wait(timeout=0.1)
except subprocess.TimeoutExpired:
    pass
child.kill(); child.wait()
done = []
t = threading.Thread(target=lambda: (time.sleep(0.05), done.append(1))); t.start(); t.join(5)
assert done, "the sleeping thread died"
print(time.time(), time.monotonic() - began, flush=True)
"""


def sleep_under(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SLEEPER], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60)


def test_a_program_that_sleeps_keeps_working_with_its_clock_skewed():
    """The false alarm: libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 turned Python's time.sleep into
    OSError EINVAL, so every upload of a correct Python API that sleeps failed in clock-skew-staging. With the
    harness's fix preloaded first, the program sleeps as without a skew and its wall clock is still moved."""
    lib, fix, why = clock.libraries()
    if lib is None:  # bootstrap installs faketime; without it the harness records `unavailable`
        return
    assert fix is not None, why  # a C compiler is there wherever bootstrap ran (it builds the fix)
    for offset in (100.0, -100.0):
        import time

        before = time.time()
        done = sleep_under(clock.faketime_env(offset, lib, os.environ, fix))
        assert done.returncode == 0, (offset, done.stderr[-800:])
        wall, slept = (float(x) for x in done.stdout.split())
        assert offset - 2 < wall - before < offset + 30, (offset, wall - before)
        assert 0.2 <= slept < 20, slept  # monotonic clocks stay real: the sleeps took their real time


def test_the_fix_is_built_from_its_source_and_found_again(tmp_path, monkeypatch):
    if clock.library() is None or not (shutil.which("cc") or shutil.which("gcc")):
        return
    source = tmp_path / "faketime_fix.c"
    source.write_bytes(clock.FIX_SOURCE.read_bytes() + b"\n/* a copy */\n")
    monkeypatch.setattr(clock, "FIX_SOURCE", source)
    monkeypatch.setattr(clock.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.delenv("HARNESS_FAKETIME_FIX", raising=False)
    built = clock.fix_library()
    assert built and os.path.isfile(built) and clock.fix_library(build=False) == built
    monkeypatch.setenv("HARNESS_FAKETIME_FIX", str(tmp_path / "missing.so"))
    assert clock.fix_library() is None


def test_a_scenario_skews_only_adapters_declaring_the_timing_it_scales_with():
    scenario = find("clock-skew-staging")
    sut = adapter_mod.load(REPO / "reference" / "adapter.toml")
    lacking = adapter_mod.Adapter(path=sut.path, raw={**sut.raw, "timings": {
        k: v for k, v in sut.timings.items() if k != "staging_retention_seconds"}})
    assert scenario in for_grade([scenario], sut, 4)[0]
    skipped = for_grade([scenario], lacking, 4)[1]
    assert skipped and "staging_retention_seconds" in skipped[0][1]


def test_the_offset_reaches_a_python_role_and_is_seen_mapped():
    lib = clock.library()
    if lib is None:  # bootstrap installs faketime; without it the harness records `unavailable`
        return
    env = {**os.environ, **clock.faketime_env(100.0, lib, os.environ, clock.fix_library())}
    probe = subprocess.Popen([sys.executable, "-c", "import time, sys; print(time.time()); sys.stdout.flush(); "
                              "time.sleep(3)"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        import time

        skewed = float(probe.stdout.readline())
        assert 98 < skewed - time.time() < 102

        class Running:
            pid = probe.pid

            def alive(self):
                return probe.poll() is None

        found = clock.verify(Running(), 100.0, lambda pgid: [probe.pid])
        assert found["status"] == "preloaded" and found["libfaketime_mapped"] and not found["go_binary"]
    finally:
        probe.kill()
        probe.wait()


def skewed_run(status: str):
    b = Builder()
    b.add(0.5, "observe", source="clock_skew", role="sweeper", offset_seconds=3.75, status=status, reason="why")
    return b


def test_staging_safety_is_unknown_unless_every_offset_is_in_effect():
    for status, expected in (("verified", VALID), ("preloaded", VALID), ("cannot_apply", UNKNOWN),
                             ("unavailable", UNKNOWN), ("ineffective", UNKNOWN)):
        b = skewed_run(status)
        verdict = staging_safety.check(b.history(), b.final, b.run)
        assert verdict.status == expected, (status, verdict.summary)
        if expected == UNKNOWN:
            assert status in verdict.summary and "sweeper" in verdict.summary


def test_a_violation_under_an_unverified_offset_stays_invalid():
    b = skewed_run("cannot_apply")
    b.attachments["a"] = {"body": {"state": "queued", "original": {"key": "staging/a"}, "variants": []},
                          "objects": {"staging/a": {"exists": False}}}
    assert staging_safety.check(b.history(), b.final, b.run).status == INVALID


def test_a_go_implementation_runs_under_clockshift_or_skips_the_scenario_with_the_reason(monkeypatch):
    go = REPO / "examples" / "go-pipeline" / "adapter.toml"
    if not (go.parent / "bin" / "gopipe").is_file():  # built by scripts/bootstrap.sh
        return
    scenario = find("clock-skew-staging")
    assert clock.cannot_skew(adapter_mod.load(REPO / "reference" / "adapter.toml"), scenario.raw) is None
    program = adapter_mod.load(go).resolve_command(adapter_mod.load(go).roles["sweeper"].command)
    assert clock.needs_clockshift(program[0])
    if clock.clockshift() is not None:  # bootstrap builds it
        chosen, skipped = for_grade([scenario], adapter_mod.load(go), 4)
        assert chosen and not skipped
        assert clock.skew_command(program, 3.75)[1:4] == ["3.750", "--", program[0]]
    monkeypatch.setattr(clock, "clockshift", lambda build=True: None)  # no C compiler: nothing can move it
    chosen, skipped = for_grade([scenario], adapter_mod.load(go), 4)
    assert not chosen and "a Go or static program reads the clock without libc" in skipped[0][1]


GO_CLOCK = """package main

import (
	"fmt"
	"time"
)

func main() {
	began := time.Now()
	time.Sleep(100 * time.Millisecond)
	fmt.Println(float64(time.Now().UnixNano())/1e9, time.Since(began).Seconds())
}
"""


def test_clockshift_moves_the_wall_clock_of_a_go_program_and_of_a_sleeping_python_one(tmp_path):
    """Hole 10 (issue 20): libfaketime never reached a Go program (its runtime reads the clock through the vDSO), so
    clock-skew scenarios ran it on the real clock. clockshift moves the wall clock any program reads, Go included,
    and leaves its monotonic clock and sleeps alone."""
    shifter = clock.clockshift()
    if shifter is None or not shutil.which("go"):  # bootstrap builds it (cc) and the Go example (go)
        return
    import time

    (tmp_path / "main.go").write_text(GO_CLOCK)
    (tmp_path / "go.mod").write_text("module clockprobe\n\ngo 1.21\n")
    subprocess.run(["go", "build", "-o", "probe", "."], cwd=tmp_path, check=True, capture_output=True, timeout=300,
                   env={**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"})
    assert clock.needs_clockshift(str(tmp_path / "probe"))
    for offset in (100.0, -100.0):
        before = time.time()
        done = subprocess.run(clock.skew_command([str(tmp_path / "probe")], offset), capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        wall, slept = (float(x) for x in done.stdout.split())
        assert offset - 2 < wall - before < offset + 20, (offset, wall - before)
        assert 0.09 < slept < 10, slept
    before = time.time()
    done = subprocess.run([shifter, "100", "--", sys.executable, "-c", SLEEPER], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-800:]
    wall, slept = (float(x) for x in done.stdout.split())
    assert 98 < wall - before < 130 and 0.2 <= slept < 20


def test_a_program_under_clockshift_stops_and_resumes_with_its_process_group():
    """The harness pauses a role with SIGSTOP to its process group: under clockshift every thread of the program
    stops (the tracer lives outside the group) and SIGCONT resumes it; SIGTERM ends it with its own status."""
    shifter = clock.clockshift()
    if shifter is None:
        return
    import signal
    import time

    from harness.supervisor import group_members, process_state

    probe = subprocess.Popen([shifter, "50", "--", sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"],
                             start_new_session=True)
    try:
        time.sleep(0.8)
        assert clock.traced_by_clockshift(probe.pid)
        os.killpg(probe.pid, signal.SIGSTOP)
        time.sleep(0.5)
        assert {process_state(pid) for pid in group_members(probe.pid)} <= {"T", "t"}
        os.killpg(probe.pid, signal.SIGCONT)
        time.sleep(0.5)
        assert probe.poll() is None and {process_state(pid) for pid in group_members(probe.pid)} & {"S", "R"}
        os.killpg(probe.pid, signal.SIGTERM)
        assert probe.wait(10) == -signal.SIGTERM
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
