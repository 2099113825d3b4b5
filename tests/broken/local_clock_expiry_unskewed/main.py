"""Broken on purpose, and out of the offset's reach: ``local_clock_expiry`` in a worker no clock preload reaches.

The worker judges expiry at the claim by its own wall clock against the ``expires_at`` the producer stamped (the bug of
``tests/broken/local_clock_expiry``). At start it re-executes itself without ``LD_PRELOAD``: its wall clock is the
real one whatever the scenario asks, as for a Go or static binary (they read the clock without libc). With the
offset never applied the bug is never provoked; only the time zones reach the worker, and they change how a time is
written, not what the clock reads. The harness must not vouch for BE-JOB-005.4 here: ``clock_agreement`` is
``unknown`` (the worker's /metrics Date header shows no offset), never ``valid`` on time zones alone.
"""

import os
import runpy
import sys
from pathlib import Path

if "faketime" in os.environ.get("LD_PRELOAD", ""):  # THE SHAPE: the clock offset never reaches this process
    os.execve(sys.executable, [sys.executable, *sys.argv],
              {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})

runpy.run_path(str(Path(__file__).resolve().parents[1] / "local_clock_expiry" / "main.py"), run_name="__main__")
