from __future__ import annotations

import pytest

from load.images import corpus
from load.prefetch import ChannelSample, evaluate
from load.targets import NotLoopback, require_loopback


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:1", "http://127.3.2.1", "http://[::1]:80"])
def test_loopback_targets_are_allowed(url):
    assert require_loopback(url) == url


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "http://192.168.1.2", "http://example.com", "http://8.8.8.8"])
def test_other_targets_are_refused(url):
    with pytest.raises(NotLoopback):
        require_loopback(url)


def test_corpus_is_seeded():
    assert corpus(3, count=3) == corpus(3, count=3)
    assert corpus(3, count=3) != corpus(4, count=3)


def test_prefetch_verdict_catches_an_overfull_channel():
    within = [ChannelSample(1.0, "ch1", 4, 4), ChannelSample(2.0, "ch1", 4, 2)]
    assert evaluate(within).ok
    over = within + [ChannelSample(3.0, "ch1", 4, 5)]
    verdict = evaluate(over)
    assert not verdict.ok and verdict.violations[0].unacked == 5 and "EXCEEDED" in str(verdict)


def test_unlimited_prefetch_is_a_violation_and_no_samples_prove_nothing():
    assert not evaluate([ChannelSample(1.0, "ch1", 0, 1)]).ok
    assert not evaluate([]).ok
