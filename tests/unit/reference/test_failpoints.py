import asyncio
import subprocess
import sys
import time

import pytest

from reference.failpoints import CRASH_EXIT_CODE, WINDOWS, FailpointError, Failpoints, parse_failpoints


def test_parses_every_action_and_count_prefix():
    points = parse_failpoints("a=crash; b=pause(250);c=error;d=3*error;e=2*pause(10)")
    assert {n: (p.action, p.pause_ms, p.remaining) for n, p in points.items()} == {
        "a": ("crash", 0.0, None), "b": ("pause", 250.0, None), "c": ("error", 0.0, None),
        "d": ("error", 0.0, 3), "e": ("pause", 10.0, 2),
    }


@pytest.mark.parametrize("spec", ["a", "a=", "a=boom", "a=pause()", "a=pause(x)", "=crash", "a=*crash", "A B=crash",
                                  "a=-1*crash"])
def test_rejects_malformed_specs(spec):
    with pytest.raises(ValueError):
        parse_failpoints(spec)


def test_empty_spec_arms_nothing():
    assert parse_failpoints("") == {} and parse_failpoints(None) == {} and parse_failpoints(" ; ;") == {}
    Failpoints("").hit("after_commit_before_ack")  # unarmed: no effect


def test_error_raises_only_for_first_n_hits():
    points = Failpoints("w=2*error")
    for _ in range(2):
        with pytest.raises(FailpointError):
            points.hit("w")
    points.hit("w")
    points.hit("other")
    assert points.points["w"].hits == 3


def test_pause_blocks_sync_and_yields_async():
    points = Failpoints("w=1*pause(120)")
    started = time.monotonic()
    asyncio.run(points.ahit("w"))
    assert time.monotonic() - started >= 0.11
    started = time.monotonic()
    asyncio.run(points.ahit("w"))  # count used up
    assert time.monotonic() - started < 0.05


def test_crash_exits_immediately_without_cleanup():
    code = (
        "import atexit, sys\n"
        "from reference.failpoints import Failpoints\n"
        "atexit.register(lambda: print('cleanup ran'))\n"
        "Failpoints('after_commit_before_ack=crash').hit('after_commit_before_ack')\n"
        "print('survived')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == CRASH_EXIT_CODE
    assert "survived" not in done.stdout and "cleanup ran" not in done.stdout
    assert "FAILPOINT after_commit_before_ack fired: crash" in done.stderr


def test_the_five_windows_are_named_as_in_the_design():
    assert list(WINDOWS) == ["after_staging_before_record", "after_commit_before_publish",
                             "after_publish_before_confirm", "after_s3_write_before_commit", "after_commit_before_ack"]
