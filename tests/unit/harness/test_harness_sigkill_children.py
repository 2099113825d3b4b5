"""The sigkill_children fault kind (issue 23 defect 1: render processes killed as an OOM killer does): which
processes it takes, and what its history shows to fault_coverage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from chaos.kinds import sigkill_children
from harness.history import History


def history_of(*events) -> History:
    return History.from_lines(json.dumps({"type": "fault", "t": 1.0, **event}) for event in events)


def test_only_the_leaves_of_the_roles_process_tree_are_taken_never_the_role_itself():
    # role 10 -> fork server 11 -> renders 12, 13; role 10 -> tracker 14; an unrelated 20 -> 21
    children = {10: [11, 14], 11: [12, 13], 20: [21]}
    assert sigkill_children.leaf_descendants(10, children) == [12, 13, 14]
    assert sigkill_children.leaf_descendants(12, children) == []


def test_on_real_processes_the_grandchild_is_found_and_zombies_are_not():
    script = "import subprocess,sys,time; p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(30)']); " \
             "print(p.pid, flush=True); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(parent.stdout.readline())
        me = os.getpid()
        assert grandchild in sigkill_children.leaf_descendants(me)
        assert parent.pid not in sigkill_children.leaf_descendants(me)  # it has a child: a fork server stays
        os.kill(grandchild, 9)
        time.sleep(0.3)  # a zombie now (its parent sleeps, never reaps it): not taken again
        assert grandchild not in sigkill_children.leaf_descendants(me)
    finally:
        parent.kill()
        parent.wait()


def test_happened_needs_a_child_killed_and_a_role_without_children_is_landed_not_exercised():
    killed = history_of({"action": "sigkill_children", "phase": "start", "role": "worker", "killed": [5, 6]})
    assert sigkill_children.happened({}, killed, {})[0]
    none = history_of({"action": "sigkill_children", "phase": "start", "role": "worker", "killed": []})
    ok, why = sigkill_children.happened({}, none, {})
    assert not ok and "no child processes" in why
    assert sigkill_children.landed({}, none)
    assert not sigkill_children.landed({}, history_of())
