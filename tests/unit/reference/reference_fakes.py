"""Fakes shared by the worker and relay decision tests."""

from __future__ import annotations


class RecordingBackoff:
    """A backoff policy that always answers ``seconds`` and remembers what it was asked."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.asked: list[int] = []

    def delay(self, failures_before: int) -> float:
        self.asked.append(failures_before)
        return self.seconds
