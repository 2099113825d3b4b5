"""Issue 23 defect 1: render processes killed (as an OOM killer or a cgroup kill does) never stall the worker.

The harness has no fault kind that signals a role's child processes, so this runs on the reference directly: the
worker's render processes are found as its grandchildren (worker → forkserver → pool processes, by parent PID,
never by name) and SIGKILLed while idle; every job uploaded afterwards must still become ready, on its first
attempt (a render that never started spends none)."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from reference_support import sample_jpeg, wait_for

pytestmark = pytest.mark.integration


def _render_processes(worker_pid: int) -> list[psutil.Process]:
    """The worker's pool processes: children of its children (the forkserver's forks)."""
    worker = psutil.Process(worker_pid)
    return [grandchild for child in worker.children() for grandchild in child.children()]


def test_jobs_complete_after_every_idle_render_process_was_killed(pipeline):
    pipeline.start_all(worker={"WORKER_CONCURRENCY": "4", "IMAGE_WORKERS": "2"})
    worker_pid = pipeline.roles["worker"].process.pid
    killed = wait_for(lambda: len(_render_processes(worker_pid)) == 2 and _render_processes(worker_pid), 30,
                      what="two render processes")
    for process in killed:
        os.kill(process.pid, signal.SIGKILL)
    print("killed render processes", [p.pid for p in killed])
    time.sleep(1.0)  # the executors notice their dead processes while idle
    ids = [pipeline.upload(sample_jpeg(900 + n)).json()["attachment_id"] for n in range(6)]
    for attachment_id in ids:
        status = pipeline.wait_state(attachment_id, timeout=60)
        assert status["attempt"] == 1, status  # the dead processes cost no job an attempt
    assert pipeline.roles["worker"].alive()
    replacements = _render_processes(worker_pid)
    assert len(replacements) == 2 and not {p.pid for p in replacements} & {p.pid for p in killed}
    for attachment_id in ids:
        pipeline.assert_exactly_once(attachment_id)
