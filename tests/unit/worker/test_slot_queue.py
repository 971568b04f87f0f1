"""The slot queue's order, bound and bookkeeping (pure, clock passed in)."""

from __future__ import annotations

import pytest

from loraplane.v1 import common_pb2
from loraplane.worker.slot_queue import QueueFull, SlotQueue

I = common_pb2.REQUEST_CLASS_INTERACTIVE
C = common_pb2.REQUEST_CLASS_CANARY
B = common_pb2.REQUEST_CLASS_BACKGROUND
U = common_pb2.REQUEST_CLASS_UNSPECIFIED


def test_interactive_before_canary_before_background_fifo_within() -> None:
    q: SlotQueue[str] = SlotQueue(10, age_step_s=100.0)  # arrivals within seconds: no ageing
    for t, (klass, name) in enumerate([(B, "b1"), (C, "c1"), (B, "b2"), (I, "i1"), (U, "u1"),
                                       (C, "c2"), (I, "i2")]):
        q.push(klass, now=float(t), deadline=t + 30.0, payload=name)
    assert [t.payload for t in q] == ["i1", "u1", "i2", "c1", "c2", "b1", "b2"]


def test_a_newcomer_queues_behind_its_class_and_the_classes_before_it() -> None:
    q: SlotQueue[str] = SlotQueue(10, age_step_s=100.0)
    assert q.ahead_of(B, 0.0) == 0 and q.ahead_of(I, 0.0) == 0  # empty: straight to the slot
    q.push(B, 0.0, 30.0, "b1")
    q.push(C, 1.0, 31.0, "c1")
    assert q.ahead_of(I, 2.0) == 0  # an interactive request may try at once
    assert q.ahead_of(C, 2.0) == 1  # behind c1
    assert q.ahead_of(B, 2.0) == 2  # behind c1 and b1


def test_bounded_and_removal_frees_room() -> None:
    q: SlotQueue[str] = SlotQueue(2)
    a = q.push(B, 0.0, 1.0, "a")
    q.push(I, 0.5, 1.5, "b")
    with pytest.raises(QueueFull, match="2 requests already wait"):
        q.push(I, 1.0, 2.0, "c")
    assert q.position(a) == 1
    q.remove(a)
    q.remove(a)  # idempotent
    assert len(q) == 1 and q.position(a) == -1
    c = q.push(B, 1.0, 2.0, "c")
    assert [t.payload for t in q] == ["b", "c"] and (c.enqueued_at, c.deadline) == (1.0, 2.0)


def test_unknown_classes_rank_as_background_and_depth_must_be_positive() -> None:
    q: SlotQueue[str] = SlotQueue(3, age_step_s=100.0)
    q.push(99, 0.0, 1.0, "odd")
    q.push(B, 0.1, 1.0, "b")
    q.push(C, 0.2, 1.0, "c")
    assert [t.payload for t in q] == ["c", "odd", "b"]
    with pytest.raises(ValueError):
        SlotQueue(0)


def test_a_joining_request_lifts_the_load_it_needs_never_lowers_it() -> None:
    q: SlotQueue[str] = SlotQueue(10, age_step_s=100.0)
    bg = q.push(B, 0.0, 30.0, "bg-load-of-v")
    q.push(I, 1.0, 1.3, "i-early")
    q.push(B, 2.0, 32.0, "bg-other")
    # an interactive request for v arrives: v's load moves to where it would queue
    # (behind the interactive request that came before it, ahead of every background one)
    assert q.inherit(bg, I, 3.0)
    assert [t.payload for t in q] == ["i-early", "bg-load-of-v", "bg-other"]
    # a background request for v changes nothing (it would queue later)
    assert not q.inherit(bg, B, 4.0)
    assert [t.payload for t in q] == ["i-early", "bg-load-of-v", "bg-other"]
    q.remove(bg)
    assert not q.inherit(bg, I, 5.0)  # no longer queued


P, G, S = common_pb2.PRIORITY_PLATINUM, common_pb2.PRIORITY_GOLD, common_pb2.PRIORITY_SILVER


def test_tenant_priority_orders_within_a_class() -> None:
    q: SlotQueue[str] = SlotQueue(10, age_step_s=100.0)
    q.push(I, 0.0, 1.0, "silver", S)
    q.push(I, 0.1, 1.0, "gold", G)
    q.push(B, 0.2, 30.0, "platinum-bg", P)
    q.push(I, 0.3, 1.0, "platinum", P)
    assert [t.payload for t in q] == ["platinum", "gold", "silver", "platinum-bg"]


def test_ageing_bounds_how_long_a_waiter_is_overtaken() -> None:
    """Silver background (band 10) against gold interactive (band 1) with a 1 s step: only
    interactive requests that arrive by 9 s after it go first; later ones queue behind."""
    q: SlotQueue[str] = SlotQueue(10, age_step_s=1.0)
    q.push(B, 0.0, 30.0, "bg", S)
    for t in (1.0, 8.9, 9.0, 9.1, 12.0):
        q.push(I, t, t + 1.0, f"i@{t}", G)
    assert [t.payload for t in q] == ["i@1.0", "i@8.9", "i@9.0", "bg", "i@9.1", "i@12.0"]
    assert q.ahead_of(I, 9.5, G) == 5 and q.ahead_of(I, 5.0, G) == 1
