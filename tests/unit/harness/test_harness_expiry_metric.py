"""expiry_metric: every job that ended expired is counted by the adapter's expiry metric, read after the drain."""

from __future__ import annotations

from harness.checkers import expiry_metric
from harness.metrics import instance_env, totals
from harness_histories import Builder

METRIC = "shop_jobs_expired_total"
EXPIRED = ("a-expired-1", "a-expired-2")


def builder(metric=METRIC) -> Builder:
    b = Builder()
    b.run["adapter"]["expiry"] = {"error_code": "expired", **({"metric": metric} if metric else {})}
    for n, attachment_id in enumerate(EXPIRED):
        b.upload(n, attachment_id, job_id=f"j{n}")
        b.transitions(attachment_id, [(n + 0.1, None, "queued", 1, "api"), (n + 5, "queued", "failed", 1, "x")],
                      error_code="expired")
    return b


def read(b: Builder, instance: str, value: float | None, ok: bool = True, at: float = 20) -> None:
    b.add(at, "metrics", instance=instance, role=instance.split("#")[0], url=f"http://127.0.0.1:1/{instance}",
          alive=True, ok=ok, values={} if value is None else {METRIC: value},
          **({} if ok else {"error": "ConnectError: refused"}))


def check(b: Builder):
    return expiry_metric.check(b.history(), b.final, b.run)


def test_every_expired_job_counted_across_roles_is_valid_and_exercised():
    b = builder()
    read(b, "api", None)
    read(b, "worker", 1)
    read(b, "sweeper", 1)
    v = check(b)
    assert (v.status, v.exercised) == ("valid", True), v.summary
    assert v.evidence[0]["per_instance"] == {"api": None, "worker": 1, "sweeper": 1}


def test_expired_jobs_the_metric_never_counted_are_invalid_with_their_ids():
    b = builder()
    read(b, "api", 0)
    read(b, "worker", 0)
    v = check(b)
    assert v.status == "invalid" and "no metric counts expiry" in v.summary
    assert set(v.evidence[0]["attachment_ids"]) == set(EXPIRED) and v.seed == 42


def test_an_undercount_after_a_restart_or_an_unread_role_is_unknown_not_invalid():
    restarted = builder()
    restarted.add(1, "role", role="worker", action="start", pid=1)
    restarted.add(3, "role", role="worker", action="start", pid=2)
    read(restarted, "worker", 1)
    v = check(restarted)
    assert v.status == "unknown" and "restarted" in v.summary
    unread = builder()
    read(unread, "worker", 1)
    read(unread, "sweeper", None, ok=False)
    v = check(unread)
    assert v.status == "unknown" and "could not be read" in v.summary


def test_no_metric_declared_or_none_read_is_unknown_and_nothing_expired_is_not_exercised():
    assert check(builder(metric=None)).status == "unknown"
    assert check(builder()).status == "unknown"  # expired jobs, but no /metrics read
    b = Builder()
    b.run["adapter"]["expiry"] = {"error_code": "expired", "metric": METRIC}
    v = check(b)
    assert (v.status, v.exercised) == ("valid", False)


def test_totals_sum_a_counter_over_its_labels_and_the_env_template_takes_the_port():
    text = ("# TYPE shop_jobs_expired counter\n"
            'shop_jobs_expired_total{role="worker"} 2\nshop_jobs_expired_total{role="sweeper"} 3\n'
            'shop_jobs_expired_created{role="worker"} 1.7e9\nother_total 9\n')
    assert totals(text, {METRIC}) == {METRIC: 5.0}
    assert totals("shop_jobs_expired_total 4\n", {METRIC}) == {METRIC: 4.0}  # untyped, as a hand-written registry
    assert instance_env({"LISTEN": "127.0.0.1:{metrics_port}", "X": "1"}, 4711) == {"LISTEN": "127.0.0.1:4711",
                                                                                     "X": "1"}


def test_jobs_expired_only_by_a_non_consumer_role_count_through_that_roles_metrics():
    """Issue 12: the sweeper expires queued jobs nobody claimed — the counter of the role that expired them is
    read and summed like any other (the worker's stays at zero)."""
    b = builder()
    read(b, "api", None)
    read(b, "worker", None)
    read(b, "sweeper", 2)
    v = check(b)
    assert (v.status, v.exercised) == ("valid", True), v.summary
    assert v.evidence[0]["per_instance"]["sweeper"] == 2


def test_a_metric_that_is_not_one_of_expiry_proves_nothing():
    """Issue 20, item 5: any counter large enough passed before (valid); now only a metric of expiry counts."""
    for other in ("http_requests_total", "shop_jobs_total", 'shop_jobs_total{outcome="failed"}'):
        b = builder(metric=other)
        for instance in ("api", "worker"):
            b.add(20, "metrics", instance=instance, role=instance, url="http://127.0.0.1:1/m", alive=True, ok=True,
                  values={other: 500.0})
        v = check(b)
        assert v.status == "unknown" and "not one of expiry" in v.summary, (other, v.summary)
    labelled = 'shop_jobs_total{outcome="expired"}'
    b = builder(metric=labelled)
    b.add(20, "metrics", instance="worker", role="worker", url="http://127.0.0.1:1/m", alive=True, ok=True,
          values={labelled: 2.0})
    assert check(b).status == "valid"


def test_a_label_selector_counts_only_its_samples():
    text = ('# TYPE shop_jobs counter\n'
            'shop_jobs_total{outcome="expired",role="worker"} 2\nshop_jobs_total{outcome="ready",role="worker"} 40\n'
            'shop_jobs_total{outcome="expired",role="sweeper"} 3\n')
    spec = 'shop_jobs_total{outcome="expired"}'
    assert totals(text, {spec}) == {spec: 5.0}
    assert totals(text, {"shop_jobs_total"}) == {"shop_jobs_total": 45.0}
    assert totals(text, {'shop_jobs_total{outcome="expired",role="sweeper"}'}) == {
        'shop_jobs_total{outcome="expired",role="sweeper"}': 3.0}


def test_no_read_where_the_scenario_does_not_ask_for_the_check_is_not_exercised_not_unknown():
    # clock-skew-expiry expires jobs but does not list expiry_metric: the runner reads no /metrics there, and a level-5
    # grade printed "unknown: no /metrics was read" for a read it never meant to make.
    b = builder()
    b.run["scenario"] = {"name": "clock-skew-expiry", "checks": ["clock_agreement", "expiry"]}
    v = check(b)
    assert (v.status, v.exercised) == ("valid", False) and "does not ask for expiry_metric" in v.summary
    b.run["scenario"]["checks"].append("expiry_metric")
    v = check(b)
    assert v.status == "unknown" and "no /metrics was read" in v.summary
