"""Unit tests write histories strictly: a history line naming a field its type's model (harness/events.py) does not
name raises there, instead of being written as a run would."""
import pytest


@pytest.fixture(autouse=True)
def _strict_history(monkeypatch):
    monkeypatch.setenv("HARNESS_HISTORY_STRICT", "1")
