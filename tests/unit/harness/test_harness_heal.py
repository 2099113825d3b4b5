"""heal_all undoes every fault and verifies it; it refuses to call a system healed that is not."""

from __future__ import annotations

import os
import sys

import pytest

from chaos import HealError, heal_all
from harness.supervisor import Supervisor

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class FakeToxiproxy:
    def __init__(self, stuck=False):
        self.dirty, self.stuck, self.resets = True, stuck, 0

    def is_clean(self):
        return not self.dirty

    def reset(self):
        self.resets += 1
        self.dirty = self.stuck


def test_heal_all_continues_paused_restarts_dead_and_disarms(tmp_path):
    sup = Supervisor(tmp_path)
    for name in ("worker", "relay", "api"):
        sup.add(name, name, SLEEPER, dict(os.environ))
    sup.start("worker")
    sup.start("relay", {"FAILPOINTS": "after_commit_before_publish=1*crash"})
    sup.start("api")
    sup.pause("worker")
    sup.kill("api")
    toxi = FakeToxiproxy()
    try:
        repaired = heal_all(sup, toxi, {"worker", "relay", "api"}, timeout=10)
        assert {"worker was paused", "relay was armed", "api was down"} <= set(repaired)
        assert any("toxiproxy" in r for r in repaired) and toxi.resets == 1
        assert sup.problems({"worker", "relay", "api"}) == []
        assert sup.instances["relay"].armed == {}
    finally:
        sup.stop_all()


def test_heal_all_raises_when_it_cannot_verify(tmp_path):
    sup = Supervisor(tmp_path)
    try:
        with pytest.raises(HealError, match="toxiproxy not clean"):
            heal_all(sup, FakeToxiproxy(stuck=True), set(), timeout=0.5)
    finally:
        sup.stop_all()
