"""A faster grade (issue 13): where a grade's time went (harness/timing.py) and tenants made ahead
(harness/tenants_ahead.py), without services."""

from __future__ import annotations

import threading
import time

from harness import tenants_ahead, timing
from harness.report.summary import grade_md


class _Tenant:
    def __init__(self, name: str) -> None:
        self.name = name


class _Stack:
    """new_tenant/close_tenant only, counting calls; ``slow`` seconds per tenant."""

    def __init__(self, slow: float = 0.0, fail_for: str | None = None) -> None:
        self.made: list[str] = []
        self.closed: list[str] = []
        self.slow = slow
        self.fail_for = fail_for
        self.lock = threading.Lock()

    def new_tenant(self, name: str, private_proxies: bool = False):
        assert private_proxies, "a grade's tenants always have their own proxies"
        time.sleep(self.slow)
        if self.fail_for and self.fail_for in name:
            raise RuntimeError("vhost refused")
        with self.lock:
            self.made.append(name)
        return _Tenant(name)

    def close_tenant(self, tenant) -> None:
        with self.lock:
            self.closed.append(tenant.name)


def _wait(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_tenants_are_made_ahead_in_start_order_and_at_most_depth_at_once():
    stack = _Stack()
    ahead = tenants_ahead.TenantsAhead(stack, 4242, ["a", "b", "c", "d"], depth=2)
    assert _wait(lambda: len(ahead.ready) == 2)
    time.sleep(0.1)
    assert sorted(ahead.ready) == ["a", "b"]  # never more than depth ready
    assert [n.rsplit("-", 1)[1] for n in stack.made] == ["a", "b"]
    tenant = ahead.take("a")
    assert tenant is not None and tenant.name.endswith("-a") and tenant.name.startswith("h4242-")
    assert _wait(lambda: "c" in ahead.ready)
    assert ahead.take("b") is not None and ahead.take("c") is not None
    assert _wait(lambda: "d" in ahead.ready)
    stats = ahead.close()
    assert stats["used"] == 3 and stats["missed"] == 0
    assert [n.rsplit("-", 1)[1] for n in stack.closed] == ["d"]  # made but never taken: its proxies removed


def test_a_scenario_taken_before_its_turn_makes_its_own_and_is_never_made_ahead():
    stack = _Stack(slow=0.05)
    ahead = tenants_ahead.TenantsAhead(stack, 1, ["a", "b", "c"], depth=1)
    assert ahead.take("c") is None  # not made yet: the run makes its own
    assert _wait(lambda: "a" in ahead.ready)
    assert ahead.take("a") is not None
    assert _wait(lambda: "b" in ahead.ready)
    time.sleep(0.2)
    ahead.close()
    assert not any(n.endswith("-c") for n in stack.made)
    assert ahead.stats()["missed"] == 1


def test_hold_waits_for_the_tenant_under_way_drops_the_ready_ones_and_makes_none_until_resume():
    stack = _Stack(slow=0.2)
    ahead = tenants_ahead.TenantsAhead(stack, 1, ["a", "b", "c"], depth=2)
    assert _wait(lambda: ahead.making is not None)
    ahead.hold()  # a service restart is next: nothing is being made now
    assert ahead.making is None and not ahead.ready
    made = len(stack.made)
    time.sleep(0.5)
    assert len(stack.made) == made, "a tenant was made while held"
    assert ahead.take("a") is None  # held: the exclusive scenario makes its own
    ahead.resume()
    assert _wait(lambda: "b" in ahead.ready)
    ahead.close()
    assert set(stack.closed) >= {n for n in stack.made if n.endswith("-b") or n.endswith("-c")} - set()


def test_held_from_the_start_makes_nothing_until_resumed():
    stack = _Stack()
    ahead = tenants_ahead.TenantsAhead(stack, 1, ["a"], held=True)
    time.sleep(0.3)
    assert stack.made == []
    ahead.resume()
    assert _wait(lambda: "a" in ahead.ready)
    assert ahead.take("a") is not None
    ahead.close()


def test_a_failed_tenant_is_left_to_the_run_which_meets_the_problem_itself():
    # Not "-a": a tenant's name carries six random hex digits, which may well start with an "a".
    stack = _Stack(fail_for="-first")
    ahead = tenants_ahead.TenantsAhead(stack, 1, ["first", "second"], depth=1)
    assert _wait(lambda: "second" in ahead.ready)
    assert ahead.take("first") is None
    assert ahead.stats()["errors"] and "vhost refused" in ahead.stats()["errors"][0]
    ahead.close()


def test_take_or_make_falls_back_to_a_new_tenant_and_notes_one_made_ahead():
    class _History:
        def __init__(self) -> None:
            self.lines: list[dict] = []

        def append(self, type_, **fields) -> None:
            self.lines.append({"type": type_, **fields})

    class _Scenario:
        name = "s"

    class _Run:
        scenario, history = _Scenario(), _History()

        def __init__(self, stack) -> None:
            self.stack = stack

    stack = _Stack()
    run = _Run(stack)
    assert tenants_ahead.take_or_make(run, "h1-own-s").name == "h1-own-s"  # no grade: made on the spot
    ahead = tenants_ahead.TenantsAhead(stack, 1, ["s"])
    assert _wait(lambda: "s" in ahead.ready)
    run.tenants_ahead = ahead
    tenant = tenants_ahead.take_or_make(run, "h1-unused-s")
    assert tenant.name != "h1-unused-s"
    assert run.history.lines[-1]["message"] == "tenant prepared ahead by the grade"
    ahead.close()


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("HARNESS_TENANTS_AHEAD", "0")
    assert not tenants_ahead.enabled()
    monkeypatch.delenv("HARNESS_TENANTS_AHEAD")
    assert tenants_ahead.enabled()


class _Clock:
    timings_detail: dict


def test_split_and_add_sum_parts_of_a_phase():
    run = _Clock()
    with timing.split(run, "tenant"):
        time.sleep(0.01)
    with timing.split(run, "tenant"):
        pass
    timing.add(run, "settle", 0.5)
    timing.add(run, "settle", -1)  # never negative
    assert run.timings_detail["tenant"] >= 0.01 and run.timings_detail["settle"] == 0.5


def test_summary_rows_per_phase_and_part_with_the_rest_and_the_slowest():
    runs = [("one", {"setup": 2.0, "start_roles": 3.0, "check": 0.1},
             {"tenant": 0.5, "setup_command": 1.2, "tap_prepare": 0.1, "role_healthy": 2.5}),
            ("two", {"setup": 4.0, "start_roles": 1.0, "check": 0.1},
             {"tenant": 1.0, "setup_command": 2.8, "tap_prepare": 0.1, "role_healthy": 0.8})]
    summary = timing.summarise(runs, wall=6.0, parallel=2, extra={"tenants_ahead": {"used": 1, "missed": 1,
                                                                                    "seconds": 0.7}})
    by = {(r["level"], r["key"]): r for r in summary["rows"]}
    assert by[(0, "setup")]["seconds"] == 6.0 and by[(0, "setup")]["slowest"] == "two"
    assert by[(1, "setup_command")]["seconds"] == 4.0 and by[(1, "setup_command")]["mean"] == 2.0
    assert by[(0, "setup")]["share"] == round(6.0 / 10.2, 3)
    # start_roles: 4.0 in all, 3.3 in its timed part: 0.7 in "the rest" of it.
    others = [r for r in summary["rows"] if r["key"] == "other"]
    assert any(abs(r["seconds"] - 0.7) < 1e-6 for r in others)
    lines = timing.table_lines(summary)
    assert lines[0].startswith("phase") and "setup_command" in "\n".join(lines)
    assert "10.2 scenario-seconds in 6.0s of wall time, up to 2 side by side" in lines[-1]
    assert "tenants prepared ahead: 1 used, 1 made on the spot" in lines[-1]
    assert "<table>" in timing.html_table(summary)
    assert timing.table_lines({}) == [] and timing.html_table({}) == ""


def test_a_grade_summary_shows_the_table():
    summary = timing.summarise([("one", {"setup": 1.0}, {"tenant": 0.4})], wall=1.0)
    text = grade_md({"sut": {"name": "x", "level": 4}, "level": 4, "verdict": "valid", "requirements": {},
                     "scenarios": [], "skipped": [], "timings": {"total": 1.0}, "time_went": summary})
    assert "## Where the time went" in text and "database, vhost, bucket, proxies" in text


class _Run:
    """What take_or_make needs of a run: its scenario, history and (after) what was prepared ahead for it."""

    def __init__(self, scenario: str, ahead, stack) -> None:
        self.scenario = type("S", (), {"name": scenario})()
        self.tenants_ahead, self.stack = ahead, stack
        self.notes: list[dict] = []
        self.history = type("H", (), {"append": lambda _, type_, **f: self.notes.append({"type": type_, **f})})()


def test_the_setup_prepared_ahead_goes_to_its_run_and_a_failed_one_drops_the_tenant(tmp_path):
    stack = _Stack()
    discarded: list[str] = []

    def prepare(scenario: str, tenant):
        if scenario == "bad":
            raise RuntimeError("setup command exited 3")
        folder = tmp_path / scenario
        folder.mkdir()
        log = tmp_path / f"{scenario}.log"
        log.write_text("migrated\n")
        prepared = tenants_ahead.Prepared(8000 + len(discarded), str(folder), str(log), seconds=0.5)
        prepared.discard = lambda: discarded.append(scenario)
        return prepared

    ahead = tenants_ahead.TenantsAhead(stack, 7, ["a", "bad", "c"], depth=3, prepare=prepare)
    assert _wait(lambda: sorted(ahead.ready) == ["a", "c"] and ahead.making is None)
    assert [n.rsplit("-", 1)[1] for n in stack.closed] == ["bad"]  # its tenant dropped, not handed out half-made
    run = _Run("a", ahead, stack)
    tenant = tenants_ahead.take_or_make(run, "unused")
    assert tenant.name.endswith("-a") and run.prepared_ahead.role_tmp == str(tmp_path / "a")
    assert run.notes and run.notes[0]["message"] == "tenant prepared ahead by the grade"
    bad = _Run("bad", ahead, stack)
    stack_tenant = tenants_ahead.take_or_make(bad, "h7-own-bad")  # a miss: the run makes its own, runs its setup
    assert stack_tenant.name == "h7-own-bad" and getattr(bad, "prepared_ahead", None) is None
    stats = ahead.close()  # "c" never taken: its tenant closed and what was prepared for it discarded
    assert discarded == ["c"]
    assert stats["used"] == 1 and stats["missed"] == 1 and stats["setup_seconds"] == 1.0
    assert any("setup ahead" in e for e in stats["errors"])
