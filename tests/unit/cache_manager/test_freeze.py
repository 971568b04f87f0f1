"""The leader's garbage-collector settings (issue 18): the state frozen when planning starts,
given back when a leadership ends."""

import gc

from loraplane.cache_manager.leader import freeze_state, thaw_state


def test_state_frozen_then_thawed() -> None:
    freeze_state()
    try:
        assert gc.get_freeze_count() > 0
        thaw_state(still_leading=True)  # another shard still leads: frozen again
        assert gc.get_freeze_count() > 0
    finally:
        thaw_state(still_leading=False)
    assert gc.get_freeze_count() == 0
