"""Several gateway processes on one host: the split of the per-worker flow caps.

``LORAPLANE_GATEWAY_PROCESSES=N`` processes (``LORAPLANE_GATEWAY_PROCESS_INDEX`` 0 … N-1)
serve the same public gRPC and HTTP ports (``SO_REUSEPORT``: the kernel spreads the
*connections* between the processes; a connection stays with the process that accepted
it), each with its own ``/metrics`` port and instance id (``gateway-<index>``). They share
no state: each has its own views (the same topics), its own flow controller and quotas.

So that N processes together never admit more to a worker than one process would, each
process takes its share of every cap of :class:`~.flow.FlowConfig` (the configured numbers
stay those of the whole host, as with one process):

* the three room caps — ``max_in_flight_per_worker`` (everything), ``... - platinum_reserve``
  (all but the platinum reserve) and ``... - platinum_reserve - interactive_reserve``
  (canary and background) — and the caps beside a guarded group
  (``background_slots_with_interactive``, ``others_slots_with_platinum``) are each divided by N,
  process ``i`` taking ``cap // N`` plus one of the ``cap % N`` left over when ``i < cap %
  N``: the shares add up to the configured cap exactly, and a process's caps keep their
  order (so its reserves are never negative);
* the reserves of a process are the differences of its caps.

A share of 0 is refused at start (``ValueError`` naming the cap): a process without
background room, or whose cap beside a guarded group became 0 ("no cap"), would break the
guarantee. With the defaults (8 in flight, reserves 2 + 2, 2 background slots beside
interactive, 2 slots for the others beside platinum) two processes get 4 in flight,
reserves 1 + 1, 1 background slot and 1 other slot beside platinum each. The price of a static split: a worker's slots are used fully only when the
processes' load is even (a process with all the traffic of the moment gets 1/N of a
worker's slots; the others' stay free). ``max_in_flight_per_worker = 0`` (no limit) stays
0. Tenant quotas (:mod:`.quotas`) are not split: they count per process.
"""

from __future__ import annotations

from loraplane.gateway.flow import FlowConfig

BESIDE_CAPS = ("background_slots_with_interactive", "others_slots_with_platinum")
"""The caps of :class:`FlowConfig` on the requests beside a guarded group (split like the
rooms)."""


def share(total: int, processes: int, index: int) -> int:
    """Process ``index``'s share of ``total`` split between ``processes`` (the shares of
    0 … processes-1 add up to ``total``; a larger ``total`` never gives a smaller share)."""
    if processes < 1 or not 0 <= index < processes:
        raise ValueError(f"process index {index} out of 0..{processes - 1}")
    return total // processes + (1 if index < total % processes else 0)


def split_flow(config: FlowConfig, processes: int, index: int) -> FlowConfig:
    """The flow caps of process ``index`` of ``processes`` (see the module doc)."""
    if processes == 1:
        return config
    limit = config.max_in_flight_per_worker
    beside = {name: getattr(config, name) for name in BESIDE_CAPS}
    caps = {
        "max_in_flight_per_worker": limit,
        "max_in_flight_per_worker - platinum_reserve": limit - config.platinum_reserve,
        "max_in_flight_per_worker - platinum_reserve - interactive_reserve":
            limit - config.platinum_reserve - config.interactive_reserve,
        **beside,
    }
    if not limit:  # no admission limit: nothing to split but the caps beside a group
        caps = dict(beside)
    mine = {name: share(total, processes, index) for name, total in caps.items()}
    zero = [f"{name} ({caps[name]})" for name, got in mine.items()
            if caps[name] and not got]
    if zero:
        raise ValueError(
            f"flow caps cannot be split between {processes} gateway processes: "
            f"{', '.join(zero)} leaves process {index} none; raise them to at least "
            f"{processes} or run fewer processes")
    if not limit:
        return config.model_copy(update={name: mine[name] for name in BESIDE_CAPS})
    all_ = mine["max_in_flight_per_worker"]
    no_platinum = mine["max_in_flight_per_worker - platinum_reserve"]
    background = mine["max_in_flight_per_worker - platinum_reserve - interactive_reserve"]
    # validated like a configured one (FlowConfig's checks run on model_validate)
    return FlowConfig.model_validate({
        **config.model_dump(),
        "max_in_flight_per_worker": all_,
        "platinum_reserve": all_ - no_platinum,
        "interactive_reserve": no_platinum - background,
        **{name: mine[name] for name in BESIDE_CAPS},
    })
