"""One observer thread: a daemon calling ``tick()`` at an interval until halted (the API observer, the object
watcher, the broker tap and the consumer sampler are each one)."""

from __future__ import annotations

import threading


class Poller(threading.Thread):
    """A daemon thread calling ``tick()`` every ``interval`` seconds until stopped; errors are counted, not fatal."""

    def __init__(self, name: str, interval: float):
        super().__init__(name=name, daemon=True)
        self.interval = interval
        self._halt = threading.Event()
        self.errors = 0
        self.last_error: str | None = None

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.tick()
            except Exception as exc:  # services under faults fail; keep observing
                self.errors += 1
                self.last_error = repr(exc)
            self._halt.wait(self.interval)

    def tick(self) -> None:
        raise NotImplementedError

    def halt(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(5)
