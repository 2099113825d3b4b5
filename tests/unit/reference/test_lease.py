import asyncio

from reference.lease import Lease, LeaseLapsed, LeaseLost


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


def test_a_lapsed_lease_is_revived_when_the_database_answers_again():
    """An outage longer than the lease: renewals fail past the deadline (lapsed, not lost); the first renewal
    that gets through revives it, and effects waiting in wait_live go on — the job keeps its attempt."""
    async def scenario():
        import time
        down_until = time.monotonic() + 0.5

        async def renew():
            if time.monotonic() < down_until:
                raise ConnectionError("db down")
            return True

        lease = Lease(lease_seconds=0.3, renew_seconds=0.05, claimed_at_monotonic=time.monotonic(),
                      renew=renew).start()
        await asyncio.sleep(0.35)
        lapsed = not lease.live()
        try:
            lease.ensure_live()
            raise AssertionError("expected LeaseLapsed")
        except LeaseLapsed:
            pass
        await asyncio.wait_for(lease.wait_live(), 2.0)
        live = lease.live()
        await lease.stop()
        return lapsed, live, lease

    lapsed, live, lease = asyncio.run(scenario())
    assert lapsed and live and lease.lost_reason is None and lease.lapses == 1


def test_waiting_on_a_lapsed_lease_ends_in_lease_lost_when_it_was_taken_over():
    async def scenario():
        import time
        answers = iter([ConnectionError("down")] * 8 + [False])

        async def renew():
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return answer

        lease = Lease(lease_seconds=0.2, renew_seconds=0.05, claimed_at_monotonic=time.monotonic(),
                      renew=renew).start()
        try:
            await asyncio.wait_for(lease.wait_live(), 5.0)
            await asyncio.sleep(0.3)
            await asyncio.wait_for(lease.wait_live(), 5.0)
        except LeaseLost as exc:
            return str(exc)
        finally:
            await lease.stop()

    assert "taken over" in asyncio.run(scenario())
