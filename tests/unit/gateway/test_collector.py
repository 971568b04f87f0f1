"""The gateway process's garbage-collector settings after start (``tune_collector``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from loraplane.gateway.__main__ import tune_collector
from loraplane.gateway.settings import GatewaySettings


@pytest.fixture
def collector() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_freezes_what_start_built_and_sets_the_gen0_threshold(collector: None) -> None:
    live = [object() for _ in range(10)]  # something start "built"
    _, gen1, gen2 = gc.get_threshold()
    tune_collector(GatewaySettings(gc_gen0_threshold=12_345))
    assert gc.get_threshold() == (12_345, gen1, gen2)
    assert gc.get_freeze_count() >= len(live)


def test_zero_keeps_the_default_threshold(collector: None) -> None:
    before = gc.get_threshold()
    tune_collector(GatewaySettings(gc_gen0_threshold=0))
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() > 0


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="gc_gen0_threshold"):
        GatewaySettings(gc_gen0_threshold=-1)
