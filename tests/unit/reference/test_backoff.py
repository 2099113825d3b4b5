import random
import statistics

from reference.backoff import AttemptBudget, FullJitterBackoff, reconnect_delays


def test_ceiling_doubles_then_caps():
    policy = FullJitterBackoff(base_seconds=1, cap_seconds=600)
    assert [policy.ceiling(n) for n in range(12)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]
    assert policy.ceiling(10_000) == 600


def test_delays_stay_within_zero_and_ceiling_and_are_jittered():
    policy = FullJitterBackoff(base_seconds=0.2, cap_seconds=2)
    rng = random.Random(7)
    for n in range(8):
        samples = [policy.delay(n, rng) for _ in range(200)]
        assert all(0 <= s <= policy.ceiling(n) for s in samples)
        assert len(set(samples)) > 150  # jittered, not a fixed schedule


def test_delays_grow_on_average_until_the_cap():
    policy = FullJitterBackoff(base_seconds=1, cap_seconds=600)
    rng = random.Random(11)
    means = [statistics.mean(policy.delay(n, rng) for _ in range(2000)) for n in range(6)]
    assert all(later > earlier * 1.6 for earlier, later in zip(means, means[1:]))


def test_attempt_budget_counts_per_round():
    budget = AttemptBudget(max_attempts=5)
    assert not budget.exhausted(4) and budget.exhausted(5)
    assert not budget.exhausted(7, attempt_base=5) and budget.exhausted(10, attempt_base=5)


def test_reconnect_delays_are_positive_and_capped():
    delays = reconnect_delays(0.1, 1.0)
    values = [next(delays) for _ in range(50)]
    assert all(0.05 <= v <= 1.0 for v in values)
