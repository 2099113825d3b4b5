"""lease_renewal (BE-JOB-006.2) and owner_overlap (BE-JOB-006.3) over hand-made histories: valid, invalid, unknown,
and not exercised."""

from __future__ import annotations

from harness.checkers import lease_renewal, owner_overlap
from harness.checkers.base import INVALID, UNKNOWN, VALID
from harness_histories import ATT, T0, Builder, iso

LEASE = 4


def refused_and_delayed(objects=(), recovered_at=5.5, reclaim_at=12.0, ready_at=24.0, watch=True, cut_end=9.0,
                        latency=True):
    """One job claimed at 1.0; the consumers' database link cut from 1.5 to ``cut_end`` (delayed from 0 to 26);
    the recovering role takes the job back at ``recovered_at``; a new claim at ``reclaim_at`` ends ready."""
    b = Builder(lease=LEASE)
    if watch:
        b.add(0.0, "phase", name="object_watch_start", bucket="b")
    b.upload(0.1)
    if latency:
        b.add(0.0, "fault", action="toxic", toxic="latency", phase="start", service="postgres", role="worker",
              params={"ms": 300})
    b.add(0.0, "fault", action="toxic", toxic="latency", phase="start", service="s3", role="worker",
          params={"ms": 1000})
    b.add(1.5, "fault", action="toxic", toxic="cut", phase="start", service="postgres", role="worker", params={})
    b.add(cut_end, "fault", action="toxic", toxic="cut", phase="end", service="postgres", role="worker")
    for at, key in objects:
        b.add(at + 0.3, "object", key=key, size=10, last_modified=iso(T0 + at).replace(".", "x").split("x")[0] + "Z"
              if "." in iso(T0 + at) else iso(T0 + at))
    if latency:
        b.add(26, "fault", action="toxic", toxic="latency", phase="end", service="postgres", role="worker")
    b.add(26, "fault", action="toxic", toxic="latency", phase="end", service="s3", role="worker")
    if watch:
        b.add(27, "phase", name="object_watch_end", lists=100, errors=0)
    b.transitions(ATT, [(0.2, None, "queued", 1, "api"), (1.0, "queued", "processing", 1, "w"),
                        (recovered_at, "processing", "queued", 2, "s"), (reclaim_at, "queued", "processing", 2, "w"),
                        (ready_at, "processing", "ready", 2, "w")])
    return b


def test_refused_and_delayed_renewals_without_a_stale_effect_are_valid_and_exercised():
    # Objects of the first claim written in time (before the lease ran out), the new claim's after it began.
    # (The new claim's object is one its ready names: the builder's ready names variants/<id>/1/<variant>.)
    b = refused_and_delayed(objects=[(3.0, f"variants/{ATT}/t1/thumbnail"), (14.0, f"variants/{ATT}/1/thumbnail")])
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    assert any("delayed" in e["message"] for e in verdict.evidence)


def test_an_effect_begun_after_the_lease_ran_out_is_invalid_during_the_refusal_and_until_the_next_claim():
    # Lease out by 1.5 + 4; one slowed S3 round trip (1 s) and 0.5 s of slack: from 7.0 on, nothing may land.
    b = refused_and_delayed(objects=[(8.0, f"variants/{ATT}/t1/crop")])
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "no consumer held one" in verdict.evidence[0]["message"]
    assert verdict.evidence[0]["key"] == f"variants/{ATT}/t1/crop" and verdict.seed == 42
    # The link is back at 9, but the job was recovered meanwhile: its stale owner cannot revive the lease, and
    # nobody claims until 12 — an object landing at 10 is still an effect without a lease.
    b = refused_and_delayed(objects=[(10.0, f"variants/{ATT}/t1/optimized")])
    assert lease_renewal.check(b.history(), b.final, b.run).status == INVALID
    # Not recovered during the refusal (a lapsed lease may be revived once the link is back): only the refusal counts.
    b = refused_and_delayed(objects=[(10.0, f"variants/{ATT}/t1/optimized")], recovered_at=9.5)
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert all("no consumer held one" not in e["message"] for e in verdict.evidence)


def test_writes_near_the_lease_end_and_originals_are_not_called_effects_without_a_lease():
    # 6.5: within one slowed round trip of the lease end (a write sent in time may land late); the original is the
    # API's; an object landing while an upload was unanswered is not attributed.
    b = refused_and_delayed(objects=[(6.5, f"variants/{ATT}/t1/crop"), (8.0, f"staging/{ATT}")])
    assert lease_renewal.check(b.history(), b.final, b.run).status == VALID
    b.add(7.5, "invoke", op="late", f="upload", kind="good")
    b.add(8.5, "object", key="staging/other", size=5, last_modified=iso(T0 + 8).split(".")[0] + "Z")
    assert lease_renewal.check(b.history(), b.final, b.run).status == VALID


def test_a_job_left_with_an_owner_that_cannot_renew_is_invalid_at_level_4():
    b = refused_and_delayed(recovered_at=12.5, cut_end=12.0, reclaim_at=13.0)
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "not recovered" in verdict.evidence[0]["message"]


def test_without_an_object_watch_or_a_delayed_claim_it_is_not_exercised():
    b = refused_and_delayed(watch=False)
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and not verdict.exercised and "object watch" in verdict.summary
    b = refused_and_delayed(latency=False)
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and not verdict.exercised and "delayed renewals" in verdict.summary


def test_no_lease_timing_is_unknown_and_no_fault_is_not_exercised():
    b = refused_and_delayed()
    del b.run["adapter"]["timings"]["lease_seconds"]
    assert lease_renewal.check(b.history(), b.final, b.run).status == UNKNOWN
    quiet = Builder()
    quiet.upload(0)
    quiet.transitions(ATT, [(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "w"),
                            (2, "processing", "ready", 1, "w")])
    verdict = lease_renewal.check(quiet.history(), quiet.final, quiet.run)
    assert verdict.status == VALID and not verdict.exercised


# --- owner_overlap ----------------------------------------------------------------------------------------------

def paused_owner(steps):
    b = Builder(lease=LEASE)
    b.upload(0)
    b.add(1.2, "fault", action="sigstop", phase="start", role="worker")
    b.add(11, "fault", action="sigcont", phase="end", role="worker")
    b.transitions(ATT, steps)
    return b


def test_owner_overlap_is_exercised_when_the_old_owner_wakes_while_the_new_one_works():
    b = paused_owner([(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                      (6, "processing", "queued", 2, "sweeper"), (7, "queued", "processing", 2, "worker#2"),
                      (14, "processing", "ready", 2, "worker#2")])
    verdict = owner_overlap.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised and "at work at once" in verdict.summary


def test_a_stale_commit_while_the_new_owner_works_is_invalid():
    b = paused_owner([(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                      (6, "processing", "queued", 2, "sweeper"), (7, "queued", "processing", 2, "worker#2"),
                      (11.5, "processing", "ready", 1, "worker"), (14, "processing", "ready", 2, "worker#2")])
    verdict = owner_overlap.check(b.history(), b.final, b.run)
    assert verdict.status == INVALID and "while the new owner was still working" in verdict.evidence[0]["message"]


def test_a_new_owner_done_before_the_old_one_woke_is_not_an_overlap():
    b = paused_owner([(0.1, None, "queued", 1, "api"), (1, "queued", "processing", 1, "worker"),
                      (6, "processing", "queued", 2, "sweeper"), (7, "queued", "processing", 2, "worker#2"),
                      (8, "processing", "ready", 2, "worker#2")])
    verdict = owner_overlap.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and not verdict.exercised and "done before" in verdict.summary
    del b.run["adapter"]["timings"]["lease_seconds"]
    assert owner_overlap.check(b.history(), b.final, b.run).status == UNKNOWN


# --- a fault on one role's own link ------------------------------------------------------------------------------

def test_a_role_scoped_toxic_goes_to_that_roles_own_proxy_and_is_recorded_with_the_role():
    from chaos import NetworkFaults
    from harness.runner import with_port

    assert with_port("postgresql://u:p@127.0.0.1:5432/db", 6000) == "postgresql://u:p@127.0.0.1:6000/db"
    assert with_port("http://127.0.0.1:8333", 7000) == "http://127.0.0.1:7000"
    calls = []

    class FakeProxies:
        def cut(self, name):
            calls.append(("cut", name))

        def restore(self, name):
            calls.append(("restore", name))

    b = Builder()

    class Recorder:
        def append(self, type_, **fields):
            return b.add(0, type_, **fields)

    faults = NetworkFaults(FakeProxies(), Recorder())
    faults.apply("postgres", "cut", role="worker")
    faults.remove("postgres", "cut", None, role="worker")
    faults.apply("postgres", "cut")
    assert calls == [("cut", "postgres@worker"), ("restore", "postgres@worker"), ("cut", "postgres")]
    recorded = [e for e in b.events if e["type"] == "fault"]
    assert [e.get("role") for e in recorded] == ["worker", "worker", None]
    assert all(e["service"] == "postgres" for e in recorded)


def test_a_held_claim_whose_writes_were_all_done_before_its_lease_ran_out_did_not_hit_the_window():
    # Issue 20, hole 12: renewal_ignored (a failed renewal taken as renewed) graded on lease-renewal-delayed-and-refused
    # was invalid on one run and valid on the next. Its three writes land 2 s apart after the render; when the render
    # was quick, the last one landed at 6.9 (Last-Modified 6) — before 7.0, when the lease surely had run out (cut at
    # 1.5 + lease 4 + one slowed round trip 1 + 0.5). Nothing was left to write without a lease, so the run proves
    # nothing either way. Before the fix: valid and exercised; now unknown where the scenario relies on this check.
    objects = [(2.9, f"variants/{ATT}/t1/thumbnail"), (4.9, f"variants/{ATT}/t1/crop"),
               (6.0, f"variants/{ATT}/t1/optimized"), (14.0, f"variants/{ATT}/1/thumbnail")]
    b = refused_and_delayed(objects=objects)
    b.run["scenario"] = {"name": "lease-renewal-delayed-and-refused", "checks": ["lease_renewal"]}
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "window not hit" in verdict.summary, verdict.summary
    assert any("no effect was due without a lease" in e["message"] for e in verdict.evidence)
    # In a scenario that does not rely on it: valid, not exercised.
    b.run["scenario"] = {"name": "other", "checks": []}
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and not verdict.exercised
    # The same run with the third write withheld (what a correct owner does once its lease ran out) hit the window:
    # a write was due and none began; valid and exercised.
    b = refused_and_delayed(objects=objects[:2] + objects[3:])
    b.run["scenario"] = {"name": "lease-renewal-delayed-and-refused", "checks": ["lease_renewal"]}
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
    # And when the last write landed later (the slow render of the runs that caught it): invalid.
    b = refused_and_delayed(objects=objects[:2] + [(8.2, f"variants/{ATT}/t1/optimized")] + objects[3:])
    assert lease_renewal.check(b.history(), b.final, b.run).status == INVALID


def test_a_held_claims_object_landing_only_after_the_window_closed_is_not_a_pass():
    # The other way to miss (a render slow on a loaded machine): the stale owner's first write landed at 13.0, after
    # the next claim (12.0) — outside the window, and at a key the job's ready does not name: whose it is cannot be
    # told. Before the fix: valid and exercised (a write was due, none seen in the window); now unknown.
    b = refused_and_delayed(objects=[(13.0, f"variants/{ATT}/t1/thumbnail"), (15.0, f"variants/{ATT}/1/thumbnail")])
    b.run["scenario"] = {"name": "lease-renewal-delayed-and-refused", "checks": ["lease_renewal"]}
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert verdict.status == UNKNOWN and "after the window closed" in verdict.summary, verdict.summary
    # Objects after the window that ready names (the new claim's) leave it proven.
    b = refused_and_delayed(objects=[(15.0, f"variants/{ATT}/1/thumbnail")])
    b.run["scenario"] = {"name": "lease-renewal-delayed-and-refused", "checks": ["lease_renewal"]}
    verdict = lease_renewal.check(b.history(), b.final, b.run)
    assert verdict.status == VALID and verdict.exercised, verdict.summary
