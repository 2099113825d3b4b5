import asyncio

from reference.lease import Lease, LeaseLost


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_local_deadline_stops_new_effects():
    clock = Clock()
    lease = Lease(lease_seconds=4, renew_seconds=1, claimed_at_monotonic=clock.now, renew=None, clock=clock)
    lease.ensure_live()
    clock.now += 3.7  # inside the safety margin before the deadline
    assert not lease.live()
    try:
        lease.ensure_live()
        raise AssertionError("expected LeaseLost")
    except LeaseLost:
        pass


def test_renewal_extends_and_takeover_loses():
    async def scenario():
        answers = iter([True, True, False])

        async def renew():
            return next(answers)

        lease = Lease(lease_seconds=0.5, renew_seconds=0.05, claimed_at_monotonic=asyncio.get_running_loop().time(),
                      renew=renew).start()
        await asyncio.sleep(0.3)
        await lease.stop()
        return lease

    lease = asyncio.run(scenario())
    assert lease.lost_reason and "taken over" in lease.lost_reason and not lease.live()


def test_renewal_errors_keep_trying_until_the_deadline():
    async def scenario():
        calls = 0

        async def renew():
            nonlocal calls
            calls += 1
            raise ConnectionError("db down")

        import time
        lease = Lease(lease_seconds=0.3, renew_seconds=0.05, claimed_at_monotonic=time.monotonic(),
                      renew=renew).start()
        await asyncio.sleep(0.5)
        await lease.stop()
        return lease, calls

    lease, calls = asyncio.run(scenario())
    assert calls >= 3 and not lease.live()
