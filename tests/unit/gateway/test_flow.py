"""Flow control: priority bands with ageing, headroom, fair share (pure, clock injected),
and the asyncio controller that executes it."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest

from loraplane.gateway.flow import FlowConfig, FlowController, FlowQueue, QueueWaitExceeded
from loraplane.shared.ordering import BANDS, aged_key, band, overtaking_bound_s, wait_bound_s
from loraplane.v1 import common_pb2 as c

INTERACTIVE = c.REQUEST_CLASS_INTERACTIVE
BACKGROUND = c.REQUEST_CLASS_BACKGROUND
CANARY = c.REQUEST_CLASS_CANARY
PLATINUM, GOLD, SILVER, BRONZE = (c.PRIORITY_PLATINUM, c.PRIORITY_GOLD, c.PRIORITY_SILVER,
                                  c.PRIORITY_BRONZE)


def test_bands_order_class_then_priority() -> None:
    order = [
        (INTERACTIVE, PLATINUM), (INTERACTIVE, GOLD), (INTERACTIVE, SILVER),
        (INTERACTIVE, BRONZE), (CANARY, PLATINUM), (CANARY, BRONZE),
        (BACKGROUND, PLATINUM), (BACKGROUND, BRONZE),
    ]
    bands = [band(k, p) for k, p in order]
    assert bands == sorted(bands) and len(set(bands)) == len(bands)
    assert band(c.REQUEST_CLASS_UNSPECIFIED, c.PRIORITY_UNSPECIFIED) == band(INTERACTIVE, BRONZE)
    assert overtaking_bound_s(band(BACKGROUND, BRONZE), 1.0) == 11.0
    assert aged_key(0, 5.0) < aged_key(1, 5.0)


def _queue(**kw: object) -> FlowQueue[str]:
    return FlowQueue(FlowConfig(**kw))  # type: ignore[arg-type]


def _idle() -> list[int]:
    return [0] * BANDS


def _drain(q: FlowQueue[str]) -> list[str]:
    """Everything, in service order, on a worker with nothing running (no limit set)."""
    out = []
    while (w := q.pop_next(_idle())) is not None:
        out.append(w.payload)
    return out


def _admit_all(q: FlowQueue[str], running: list[int]) -> list[str]:
    """Admit while anything may be; ``running`` counts the admitted by band."""
    got = []
    while (w := q.pop_next(running)) is not None:
        running[w.band] += 1
        got.append(w.payload)
    return got


def test_interactive_before_background_and_gold_before_silver() -> None:
    q = _queue(max_in_flight_per_worker=0)  # no limit: pure order
    q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64, now=0.0,
           payload="bg")
    q.push(tenant="globex", request_class=INTERACTIVE, priority=SILVER, cost=8, now=0.1,
           payload="silver-i")
    q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8, now=0.2,
           payload="gold-i")
    assert _drain(q) == ["gold-i", "silver-i", "bg"]


def test_ageing_bounds_overtaking() -> None:
    """A bronze background request arriving at t=0 (band 11, 1 s step) is overtaken only by
    interactive platinum requests that arrive before t=11 s; later ones queue behind it."""
    q = _queue(max_in_flight_per_worker=0, age_step_s=1.0)
    q.push(tenant="b", request_class=BACKGROUND, priority=BRONZE, cost=64, now=0.0,
           payload="old-bg")
    for i, t in enumerate((1.0, 5.0, 10.9, 11.1, 12.0)):
        q.push(tenant="p", request_class=INTERACTIVE, priority=PLATINUM, cost=8, now=t,
               payload=f"i@{t}")
    assert _drain(q) == ["i@1.0", "i@5.0", "i@10.9", "old-bg", "i@11.1", "i@12.0"]


def test_no_starvation_under_saturating_interactive_load() -> None:
    """Interactive requests keep arriving faster than they are served (the queue grows); a
    background request is still admitted: only interactive requests that arrived within its
    band's head start go before it, every later one after it."""
    cfg = FlowConfig(max_in_flight_per_worker=4, platinum_reserve=0, interactive_reserve=1)
    q: FlowQueue[float] = FlowQueue(cfg)
    head_start = overtaking_bound_s(band(BACKGROUND, SILVER), cfg.age_step_s) - (
        overtaking_bound_s(band(INTERACTIVE, GOLD), cfg.age_step_s))
    q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64, now=0.0,
           payload=-1.0)
    running = _idle()
    running[band(INTERACTIVE, GOLD)] = 4
    ib = band(INTERACTIVE, GOLD)
    before_bg: list[float] = []
    admitted_bg_at = None
    for step in range(1000):  # every 50 ms: two interactive arrive, one running one ends
        now = step * 0.05
        for j in range(2):
            q.push(tenant=f"t{j}", request_class=INTERACTIVE, priority=GOLD, cost=8, now=now,
                   payload=now)
        running[ib] -= 1  # one interactive request ends
        while (w := q.pop_next(running)) is not None:
            running[w.band] += 1
            if w.payload < 0:
                admitted_bg_at = now
            elif admitted_bg_at is None:
                before_bg.append(w.payload)
        if admitted_bg_at is not None:
            break
    assert admitted_bg_at is not None, "background request starved"
    assert before_bg and max(before_bg) <= head_start  # a tie goes to the better band


@pytest.mark.parametrize(("clients", "step", "longest", "seed"),
                         [(16, 0.5, 0.4, 1), (16, 1.0, 0.2, 2), (9, 0.5, 1.0, 3),
                          (40, 0.25, 0.3, 4)])
def test_background_wait_is_within_the_documented_bound(
    clients: int, step: float, longest: float, seed: int,
) -> None:
    """``clients`` closed-loop gold interactive streams saturate a worker (each sends its
    next request as its previous one ends; every request holds its slot between half and
    all of ``longest``); bursts of silver background requests arrive, as many as
    background may run beside interactive requests (2). Simulated with
    an injected clock: every background request is overtaken only by requests that
    arrived within its window ``(10 - 1) * step``, and waits at most
    :func:`wait_bound_s` (the window, then one slot for each request still ahead of it:
    the other clients' waiting requests and the earlier one of its burst)."""
    import heapq
    import random

    rnd = random.Random(seed)
    cfg = FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2, interactive_reserve=2,
                     age_step_s=step)
    burst = cfg.background_slots_with_interactive
    q: FlowQueue[tuple[str, float]] = FlowQueue(cfg)
    gold, bg = band(INTERACTIVE, GOLD), band(BACKGROUND, SILVER)
    slots = cfg.cap(gold)  # the room the background requests share with gold interactive
    running = _idle()
    ends: list[tuple[float, int, int]] = []  # (time, seq, band) of running requests
    seq = itertools.count()
    admitted: list[tuple[float, int, float, str]] = []  # (at, band, arrived, kind)
    bursts = [2.0 + 7.0 * k for k in range(4)]
    until = bursts[-1] + 30.0
    now = 0.0

    def admit() -> None:
        while (w := q.pop_next(running)) is not None:
            running[w.band] += 1
            kind, arrived = w.payload
            admitted.append((now, w.band, arrived, kind))
            heapq.heappush(ends, (now + rnd.uniform(longest / 2, longest), next(seq), w.band))

    for _ in range(clients):
        q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8, now=now,
               payload=("i", now))
    admit()
    while now < until:
        if bursts and bursts[0] <= ends[0][0]:
            now = bursts.pop(0)
            for _ in range(burst):
                q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64,
                       now=now, payload=("bg", now))
        else:
            now, _, b = heapq.heappop(ends)
            running[b] -= 1
            if b == gold:  # the stream sends its next request at once
                q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8,
                       now=now, payload=("i", now))
        admit()
    window = overtaking_bound_s(bg, step) - overtaking_bound_s(gold, step)
    bound = wait_bound_s(bg, overtaker_band=gold, ahead=clients - slots + burst - 1,
                         slots=slots,
                         longest_s=longest, age_step_s=step)
    bgs = [(i, a) for i, a in enumerate(admitted) if a[3] == "bg"]
    assert len(bgs) == 4 * burst  # every one admitted: none starved
    for i, (at, _, arrived, _) in bgs:
        assert at - arrived <= bound, (arrived, at - arrived, bound)
        overtakers = [a[2] for a in admitted[:i] if a[2] > arrived]
        assert all(o <= arrived + window for o in overtakers), (arrived, max(overtakers))
    # the bound is not slack: a burst waits past its window (gold requests went first)
    assert max(at - arrived for _, (at, _, arrived, _) in bgs) > window


def test_wait_bound_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="slots >= 1"):
        wait_bound_s(10, overtaker_band=1, ahead=0, slots=0, longest_s=1.0)


def test_background_keeps_fewer_slots_while_interactive_requests_run() -> None:
    """With interactive requests in flight, background is admitted up to
    ``background_slots_with_interactive``; with none, up to its whole room."""
    cfg = FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2, interactive_reserve=2,
                     background_slots_with_interactive=2)
    q: FlowQueue[str] = FlowQueue(cfg)
    running = _idle()
    running[band(INTERACTIVE, GOLD)] = 1
    for i in range(8):
        q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64,
               now=i * 0.001, payload=f"bg{i}")
    assert _admit_all(q, running) == ["bg0", "bg1"]
    q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8, now=0.1,
           payload="gold")
    assert _admit_all(q, running) == ["gold"]  # interactive is not held back by it
    running[band(INTERACTIVE, GOLD)] = 0  # the interactive requests ended
    assert _admit_all(q, running) == ["bg2", "bg3"]  # the whole room (limit - reserves)
    off = FlowQueue(FlowConfig(background_slots_with_interactive=0))
    busy = _idle()
    busy[band(INTERACTIVE, GOLD)] = 1
    for i in range(8):
        off.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64,
                 now=i * 0.001, payload=f"bg{i}")
    assert len(_admit_all(off, busy)) == 4  # no such cap: the room alone


def test_background_cap_held_for_the_hold_window_after_interactive_ends() -> None:
    """The cap stays in force for ``interactive_hold_s`` after the last interactive request
    on the worker ended (a quiet stream's next request comes within it), then background
    gets its whole room again; with no window it is released the instant interactive
    ends."""
    cfg = FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2, interactive_reserve=2,
                     background_slots_with_interactive=2, interactive_hold_s=0.5)
    q: FlowQueue[str] = FlowQueue(cfg)
    running = _idle()
    gold = band(INTERACTIVE, GOLD)
    running[gold] = 1
    for i in range(8):
        q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64,
               now=9.0 + i * 0.001, payload=f"bg{i}")

    def admit(now: float, ended: float | None) -> list[str]:
        got = []
        while (w := q.pop_next(running, now=now, interactive_ended_at=ended)) is not None:
            running[w.band] += 1
            got.append(w.payload)
        return got

    assert admit(9.0, None) == ["bg0", "bg1"]  # interactive running: the cap
    running[gold] = 0  # the last interactive request ended at 10.0
    assert q.background_held(running, now=10.0, interactive_ended_at=10.0)
    assert q.hold_ends_at(running, 10.0) == 10.5
    assert admit(10.0, 10.0) == []  # held the instant it ends ...
    assert admit(10.499, 10.0) == []  # ... and throughout the window
    running[gold] = 1  # the stream's next request: the window no longer matters
    assert q.hold_ends_at(running, 10.0) is None
    assert admit(10.2, 10.0) == []
    running[gold] = 0  # it ended at 10.3: a new window
    assert admit(10.7, 10.3) == []  # past the first window, inside the second
    assert not q.background_held(running, now=10.8, interactive_ended_at=10.3)
    assert admit(10.8, 10.3) == ["bg2", "bg3"]  # released after it: the whole room
    assert admit(11.0, 10.3) == []  # and no more than that room
    # no window (0): released the instant interactive ends, as before the window
    now_q: FlowQueue[str] = FlowQueue(cfg.model_copy(update={"interactive_hold_s": 0.0}))
    busy = _idle()
    busy[band(BACKGROUND, SILVER)] = 2
    now_q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64, now=0.0,
               payload="bg")
    assert now_q.hold_ends_at(busy, 10.0) is None
    assert now_q.pop_next(busy, now=10.0, interactive_ended_at=10.0) is not None
    # no cap at all: no window either
    off: FlowQueue[str] = FlowQueue(cfg.model_copy(update={"background_slots_with_interactive": 0}))
    assert not off.background_held(busy, now=10.0, interactive_ended_at=10.0)
    assert off.hold_ends_at(busy, 10.0) is None


def test_background_cap_holds_a_request_back_at_most_its_bound() -> None:
    """A background request held back by the cap (interactive running, or its window) is
    admitted within its room once it has waited ``background_cap_max_hold_s``, so the cap
    never takes it to its class's wait limit; the time that happens is announced."""
    cfg = FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2, interactive_reserve=2,
                     background_slots_with_interactive=2, interactive_hold_s=0.5,
                     background_cap_max_hold_s=10.0)
    q: FlowQueue[str] = FlowQueue(cfg)
    running = _idle()
    running[band(INTERACTIVE, GOLD)] = 1
    running[band(BACKGROUND, SILVER)] = 2  # at the cap
    for i, t in enumerate((100.0, 103.0, 104.0)):
        q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64, now=t,
               payload=f"bg{i}")
    assert q.pop_next(running, now=109.9) is None  # held: waited 9.9 s
    assert q.cap_changes_at(running, now=109.9, interactive_ended_at=None) == 110.0
    w = q.pop_next(running, now=110.0)  # waited its 10 s: only its room decides now
    assert w is not None and w.payload == "bg0"
    running[w.band] += 1
    assert q.pop_next(running, now=110.0) is None  # the next waited 7 s: still held
    assert q.cap_changes_at(running, now=110.0, interactive_ended_at=None) == 113.0
    w = q.pop_next(running, now=113.0)
    assert w is not None and w.payload == "bg1"
    running[w.band] += 1  # 4 running: the room is full, the bound lifts only the cap
    assert q.pop_next(running, now=120.0) is None
    assert q.cap_changes_at(running, now=120.0, interactive_ended_at=None) is None
    # within the window the bound applies the same; the window's close is announced first
    running[band(INTERACTIVE, GOLD)] = 0
    running[band(BACKGROUND, SILVER)] = 2
    q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64, now=200.0,
           payload="late")
    assert q.cap_changes_at(running, now=200.1, interactive_ended_at=199.9) == 200.4
    # no bound (0): held for as long as interactive requests run
    nob: FlowQueue[str] = FlowQueue(cfg.model_copy(update={"background_cap_max_hold_s": 0.0}))
    nob.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64, now=0.0,
             payload="bg")
    busy = _idle()
    busy[band(INTERACTIVE, GOLD)] = 1
    busy[band(BACKGROUND, SILVER)] = 2
    assert nob.pop_next(busy, now=1000.0) is None
    assert nob.cap_changes_at(busy, now=1000.0, interactive_ended_at=None) is None


def test_others_capped_beside_platinum_through_its_hold_window_and_bound() -> None:
    """While platinum interactive requests run, and for ``interactive_hold_s`` after the
    last one ended, every other band together runs at most ``others_slots_with_platinum``
    requests (better bands first); a waiter held ``platinum_cap_max_hold_s`` is judged by
    its room alone; 0 turns the cap off."""
    cfg = FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2, interactive_reserve=2,
                     background_slots_with_interactive=2, interactive_hold_s=0.5,
                     others_slots_with_platinum=2, platinum_cap_max_hold_s=5.0)
    q: FlowQueue[str] = FlowQueue(cfg)
    running = _idle()
    plat = band(INTERACTIVE, PLATINUM)
    running[plat] = 1
    for i in range(6):
        q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8,
               now=10.0 + i * 0.001, payload=f"gold{i}")
        q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64,
               now=10.0 + i * 0.001, payload=f"bg{i}")

    def admit(now: float, ended: float | None = None) -> list[str]:
        got = []
        while (w := q.pop_next(running, now=now, platinum_ended_at=ended)) is not None:
            running[w.band] += 1
            got.append(w.payload)
        return got

    assert admit(10.0) == ["gold0", "gold1"]  # two others beside platinum, the better first
    q.push(tenant="p", request_class=INTERACTIVE, priority=PLATINUM, cost=8, now=10.1,
           payload="plat2")
    assert admit(10.1) == ["plat2"]  # platinum itself is never held by it
    running[plat] = 0  # both platinum requests ended at 11.0: the window opens
    assert q.cap_changes_at(running, now=11.0, interactive_ended_at=None,
                            platinum_ended_at=11.0) == 11.5
    assert admit(11.0, 11.0) == [] and admit(11.499, 11.0) == []  # held through it
    got = admit(11.5, 11.0)  # closed: gold takes its room, background its cap beside it
    assert got == ["gold2", "gold3", "gold4", "gold5"], got
    assert sum(running) == 6
    # the bound: a waiter held back 5 s from its arrival is admitted within its room
    for b in range(BANDS):
        running[b] = 0
    running[plat] = 1
    running[band(INTERACTIVE, GOLD)] = 2
    q2: FlowQueue[str] = FlowQueue(cfg)
    q2.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8, now=20.0,
            payload="late")
    assert q2.pop_next(running, now=24.9) is None
    assert q2.cap_changes_at(running, now=24.9, interactive_ended_at=None) == 25.0
    w = q2.pop_next(running, now=25.0)
    assert w is not None and w.payload == "late"
    # off: only the rooms decide
    off: FlowQueue[str] = FlowQueue(cfg.model_copy(update={"others_slots_with_platinum": 0}))
    busy = _idle()
    busy[plat] = 1
    for i in range(8):
        off.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8,
                 now=i * 0.001, payload=f"g{i}")
    assert len(_admit_all(off, busy)) == 6  # limit - platinum_reserve
    assert off.cap_changes_at(busy, now=1.0, interactive_ended_at=None,
                              platinum_ended_at=None) is None


def test_headroom_keeps_slots_for_interactive_and_platinum() -> None:
    cfg = FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2, interactive_reserve=2)
    q: FlowQueue[str] = FlowQueue(cfg)
    for i in range(48):
        q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64,
               now=i * 0.001, payload=f"bg{i}")
    running = _idle()
    _admit_all(q, running)
    assert sum(running) == 4  # background fills up to limit - both reserves, no more
    q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8, now=0.1,
           payload="gold")
    q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8, now=0.1,
           payload="gold2")
    q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8, now=0.1,
           payload="gold3")
    assert _admit_all(q, running) == ["gold", "gold2"]  # up to limit - platinum_reserve
    q.push(tenant="p", request_class=INTERACTIVE, priority=PLATINUM, cost=8, now=0.2,
           payload="plat")
    assert _admit_all(q, running) == ["plat"]


def test_an_aged_band_full_of_its_own_requests_does_not_hold_the_line() -> None:
    """globex's background waiters have aged past gold interactive, but background is at
    its cap with its own requests: holding the line could not help it, so acme's
    interactive request is admitted at once (the quiet tenant never waits)."""
    cfg = FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2, interactive_reserve=2,
                     age_step_s=0.5, background_slots_with_interactive=0)  # rooms alone
    q: FlowQueue[str] = FlowQueue(cfg)
    running = _idle()
    running[band(BACKGROUND, SILVER)] = 4
    running[band(INTERACTIVE, GOLD)] = 1
    q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64, now=0.0,
           payload="old-bg")
    q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8, now=20.0,
           payload="acme")
    assert q.head_band() == band(BACKGROUND, SILVER)  # its turn by age ...
    assert _admit_all(q, running) == ["acme"]  # ... but the gold request takes its own room
    running[band(BACKGROUND, SILVER)] -= 1
    assert _admit_all(q, running) == ["old-bg"]


def test_an_aged_band_kept_out_by_better_bands_of_its_group_is_served_first() -> None:
    """Gold background fills the background room; an old bronze background request's turn
    has come: newer gold background requests no longer overtake it, while interactive
    requests (slots it could not use) still go on."""
    cfg = FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2, interactive_reserve=2,
                     age_step_s=0.5, background_slots_with_interactive=0)  # rooms alone
    q: FlowQueue[str] = FlowQueue(cfg)
    running = _idle()
    running[band(BACKGROUND, GOLD)] = 4
    q.push(tenant="old", request_class=BACKGROUND, priority=BRONZE, cost=64, now=0.0,
           payload="old-bronze-bg")
    q.push(tenant="new", request_class=BACKGROUND, priority=GOLD, cost=64, now=20.0,
           payload="new-gold-bg")
    q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8, now=20.0,
           payload="acme")
    assert _admit_all(q, running) == ["acme"]
    running[band(BACKGROUND, GOLD)] -= 1
    assert _admit_all(q, running) == ["old-bronze-bg"]
    running[band(BACKGROUND, GOLD)] -= 1
    assert _admit_all(q, running) == ["new-gold-bg"]


def test_saturating_gold_interactive_load_gives_way_to_aged_background() -> None:
    """Gold interactive fills ``limit - platinum_reserve``; once a background request's turn
    has come (9 s of head start with a 1 s step) newer interactive requests wait until it
    is in; the platinum reserve stays free throughout."""
    cfg = FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2, interactive_reserve=2)
    q: FlowQueue[str] = FlowQueue(cfg)
    running = _idle()
    running[band(INTERACTIVE, GOLD)] = 6
    q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64, now=0.0,
           payload="bg")
    for t in (9.5, 9.6):
        q.push(tenant="acme", request_class=INTERACTIVE, priority=GOLD, cost=8, now=t,
               payload=f"acme@{t}")
    assert q.head_band() == band(BACKGROUND, SILVER)  # its turn by age, but no room:
    assert _admit_all(q, running) == []  # the newer gold requests need that room too
    running[band(INTERACTIVE, GOLD)] = 5
    assert _admit_all(q, running) == ["bg"]  # the freed slot goes to the aged request
    running[band(INTERACTIVE, GOLD)] = 4
    assert _admit_all(q, running) == ["acme@9.5"]
    q.push(tenant="p", request_class=INTERACTIVE, priority=PLATINUM, cost=8, now=9.7,
           payload="plat")
    assert _admit_all(q, running) == ["plat"]  # the platinum reserve stayed free


def test_fair_share_drr_between_tenants_of_a_band() -> None:
    """globex queues 48 requests, initech 6, both silver background: while initech waits
    it gets every other admission, not 6 / 54 of them."""
    q = _queue(max_in_flight_per_worker=0)
    for i in range(48):
        q.push(tenant="globex", request_class=BACKGROUND, priority=SILVER, cost=64,
               now=i * 0.001, payload="globex")
    for i in range(6):
        q.push(tenant="initech", request_class=BACKGROUND, priority=SILVER, cost=64,
               now=0.5 + i * 0.001, payload="initech")
    first12 = Counter(_drain_n(q, 12))
    assert first12 == {"globex": 6, "initech": 6}


def _drain_n(q: FlowQueue[str], n: int) -> list[str]:
    return [q.pop_next(_idle()).payload for _ in range(n)]  # type: ignore[union-attr]


def test_fair_share_by_tokens_and_weight() -> None:
    """Cost is max_tokens: a tenant of 8-token requests gets 8 admissions per 64-token
    request of the other; a gold tenant's weight (4) is twice a silver one's (2)."""
    q = _queue(max_in_flight_per_worker=0)
    for i in range(40):
        q.push(tenant="small", request_class=BACKGROUND, priority=SILVER, cost=8, now=0.0,
               payload="small")
        q.push(tenant="big", request_class=BACKGROUND, priority=SILVER, cost=64, now=0.0,
               payload="big")
    got = Counter(_drain_n(q, 36))
    assert got["small"] == 8 * got["big"]
    weights = FlowConfig().weights
    assert weights["gold"] == 2 * weights["silver"]


def test_removed_waiter_is_skipped_and_tenant_left_without_credit() -> None:
    q = _queue(max_in_flight_per_worker=0)
    w = q.push(tenant="a", request_class=BACKGROUND, priority=SILVER, cost=8, now=0.0,
               payload="a")
    q.push(tenant="b", request_class=BACKGROUND, priority=SILVER, cost=8, now=0.1, payload="b")
    assert q.remove(w) and not q.remove(w)
    assert _drain(q) == ["b"] and len(q) == 0


def test_config_refuses_no_room_for_background() -> None:
    with pytest.raises(ValueError, match="leaves no slot"):
        FlowConfig(max_in_flight_per_worker=4, platinum_reserve=2, interactive_reserve=2)


# --------------------------------------------------------------------------- controller


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def test_controller_admits_in_band_order_as_slots_free() -> None:
    clock = _Clock()
    flow = FlowController(FlowConfig(max_in_flight_per_worker=3, platinum_reserve=1,
                                     interactive_reserve=1), monotonic=clock)
    bg = [await flow.admit("w0", tenant="globex", request_class=BACKGROUND, priority=SILVER,
                           cost=64)]
    assert flow.in_flight("w0") == 1
    order: list[str] = []

    async def one(name: str, klass: int, prio: int) -> None:
        p = await flow.admit("w0", tenant=name, request_class=klass, priority=prio, cost=8)
        order.append(name)
        bg.append(p)

    tasks = [asyncio.create_task(one("globex-bg", BACKGROUND, SILVER))]
    await asyncio.sleep(0)
    assert flow.waiting("w0") == 1  # background cap is 1: it waits
    tasks.append(asyncio.create_task(one("acme", INTERACTIVE, GOLD)))
    await asyncio.sleep(0)
    assert order == ["acme"]  # interactive may use the slot background may not
    bg[0].release()
    await asyncio.sleep(0)
    assert order == ["acme"]  # one slot free, but background may only fill 1 of 3
    bg[1].release()
    await asyncio.gather(*tasks)
    assert order == ["acme", "globex-bg"]
    for p in bg:
        p.release()
    assert flow.in_flight("w0") == 0


async def test_controller_refuses_after_the_class_wait_limit() -> None:
    flow = FlowController(FlowConfig(max_in_flight_per_worker=3, platinum_reserve=1,
                                     interactive_reserve=1,
                                     max_wait_s={"interactive": 1, "canary": 1,
                                                 "background": 0.05}))
    held = await flow.admit("w0", tenant="globex", request_class=BACKGROUND, priority=SILVER,
                            cost=64)
    with pytest.raises(QueueWaitExceeded, match="background class waits at most 0.05 s") as e:
        await flow.admit("w0", tenant="globex", request_class=BACKGROUND, priority=SILVER,
                         cost=64)
    assert e.value.retry_after_s and e.value.retry_after_s >= 1
    assert flow.waiting("w0") == 0
    held.release()
    assert flow.in_flight("w0") == 0


async def test_controller_cancelled_waiter_leaves_no_slot_taken() -> None:
    flow = FlowController(FlowConfig(max_in_flight_per_worker=3, platinum_reserve=1,
                                     interactive_reserve=1))
    held = await flow.admit("w0", tenant="g", request_class=BACKGROUND, priority=SILVER,
                            cost=64)
    t = asyncio.create_task(flow.admit("w0", tenant="g", request_class=BACKGROUND,
                                       priority=SILVER, cost=64))
    await asyncio.sleep(0)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    held.release()
    held.release()  # idempotent
    assert flow.in_flight("w0") == 0 and flow.waiting("w0") == 0


async def test_controller_holds_others_beside_platinum_until_its_window_closes() -> None:
    """The controller opens the platinum window when its last platinum permit is released
    and admits the held gold requests by itself when it closes."""
    clock = _Clock()
    flow = FlowController(FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2,
                                     interactive_reserve=2, others_slots_with_platinum=2,
                                     interactive_hold_s=0.05), monotonic=clock)
    plat = await flow.admit("w0", tenant="p", request_class=INTERACTIVE, priority=PLATINUM,
                            cost=8)
    held = [await flow.admit("w0", tenant="acme", request_class=INTERACTIVE, priority=GOLD,
                             cost=8) for _ in range(2)]
    waiting = [asyncio.create_task(flow.admit("w0", tenant="acme", request_class=INTERACTIVE,
                                              priority=GOLD, cost=8)) for _ in range(2)]
    await asyncio.sleep(0)
    assert flow.waiting("w0") == 2  # at the cap beside the platinum request
    plat.release()  # at 100.0: the window opens
    await asyncio.sleep(0.01)
    assert flow.waiting("w0") == 2 and flow.in_flight("w0") == 2  # held within the window
    clock.t = 100.05
    permits = await asyncio.wait_for(asyncio.gather(*waiting), 5.0)  # admitted by the timer
    assert flow.in_flight("w0") == 4 and all(p.admitted_at == 100.05 for p in permits)
    for p in held + permits:
        p.release()
    assert flow.in_flight("w0") == 0


async def test_controller_holds_background_cap_until_the_window_closes() -> None:
    """The controller opens the window when its last interactive permit is released (the
    injected clock), keeps background at its cap through it, and admits the waiters by
    itself when it closes (no other release needed)."""
    clock = _Clock()
    flow = FlowController(FlowConfig(max_in_flight_per_worker=8, platinum_reserve=2,
                                     interactive_reserve=2, background_slots_with_interactive=2,
                                     interactive_hold_s=0.05), monotonic=clock)
    inter = await flow.admit("w0", tenant="acme", request_class=INTERACTIVE, priority=GOLD,
                             cost=8)
    held = [await flow.admit("w0", tenant="globex", request_class=BACKGROUND,
                             priority=SILVER, cost=64) for _ in range(2)]
    waiting = [asyncio.create_task(flow.admit("w0", tenant="globex", request_class=BACKGROUND,
                                              priority=SILVER, cost=64)) for _ in range(2)]
    await asyncio.sleep(0)
    assert flow.waiting("w0") == 2  # at the cap beside the interactive request
    inter.release()  # at 100.0: the window opens
    await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    assert flow.waiting("w0") == 2 and flow.in_flight("w0") == 2  # held within the window
    clock.t = 100.05  # the window has closed
    permits = await asyncio.wait_for(asyncio.gather(*waiting), 5.0)  # admitted by the timer
    assert flow.waiting("w0") == 0 and flow.in_flight("w0") == 4
    assert all(p.admitted_at == 100.05 for p in permits)
    for p in held + permits:
        p.release()
    assert flow.in_flight("w0") == 0
