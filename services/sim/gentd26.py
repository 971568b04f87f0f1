"""Alibaba GenTD26 (``shared/traces/alibaba-gentd26/``) → a simulator trace (``FORMAT.md``).

The GenTD26 request trace is real adapter-serving traffic (23 days of Stable
Diffusion requests with second-resolution times) but it names no LoRA, tier,
rank or class. :func:`import_gentd26` maps it deterministically; every choice
that is not in the data is made by a *keyed hash* (BLAKE2b of ``key|kind|id``),
so the same file, key and time scale give the same bytes, and changing the key
draws a different, equally valid assignment.

From the data (facts):

* **cached unit** = one group's pipeline on one base checkpoint
  (``groupId`` × ``checkpoint_model_version_id``, 8,300 units; the 25 rows
  without a checkpoint use ``M-none``): adapter id ``G0264/M0002@1``. The
  SOURCE.md reading: a group keeps reusing the LoRA(s) of its pipeline;
* **arrival times**: ``gmt_create`` (seconds since the first request), divided
  by ``time_scale`` (×24 replays the 23 days in under a day, same order);
* **prompt tokens** = ``prompt_length + negative_prompt_length`` (0 if empty).

Assumptions (not in the data):

* **tenant** = ``groupId`` (an anonymised user group is a customer);
* **priority per tenant** by keyed hash: platinum / gold / silver / bronze with
  :data:`TIER_SHARES` of the tenants;
* **rank and size per unit** by keyed hash: rank 8/16/32/64 with weights
  0.3/0.4/0.2/0.1, q,v or all linear layers (60 % all linear), sized as a bf16
  adapter of an 8B Llama (:func:`~loraplane.sim.generator.adapter_size_bytes`,
  7–340 MB) so the cost model is the one the synthetic traces use;
* **request class per group** by keyed hash: a group's pipeline is either an
  interactive app (:data:`INTERACTIVE_SHARE` of the groups) or a batch job
  (background);
* **canaries**: :data:`CANARY_SHARE` of the units (keyed hash) are a new release:
  their requests in the first :data:`CANARY_WINDOW_S` seconds (original time)
  after the unit's first request carry ``canary=1`` and class ``canary``;
* **output tokens** = ``num_inference_steps`` (30 if empty): one "token" per
  denoising step, so a request keeps its unit in flight for steps × ``tpot_ms``;
* **one base model**: all checkpoints share the engine's LoRA slots (the figures
  in FACTS.md and issue 13 were measured that way); GenTD26 rows carry no
  ``base_model`` column.

Every derived field except ``ts`` is computed on the original clock, so the
trace at ``time_scale=24`` differs from the one at 1 only in its times.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from loraplane.policy.model import Priority, RequestClass
from loraplane.sim.generator import adapter_size_bytes
from loraplane.sim.trace import TraceRow

DEFAULT_GENTD26_DIR = Path("../shared/traces/alibaba-gentd26")
"""Where the GenTD26 files are, relative to the repository root (CI layout)."""
REQUEST_FILE = "lora_request_trace.csv.gz"
DEFAULT_KEY = "loraplane-gentd26-v1"
TIER_SHARES = (
    (Priority.PLATINUM, 0.003),
    (Priority.GOLD, 0.097),
    (Priority.SILVER, 0.30),
    (Priority.BRONZE, 0.55),
)
"""Share of tenants per priority (assumption). Platinum is rare (13 of 4,247 groups) so that
its protected units (2.9 GiB over the 23 days) fit the protected share of a worker's host
memory (``never_evict.warm_share``, 40 % of 8 GiB); at 3 % (19.5 GiB) they could not."""
RANK_WEIGHTS = ((8, 0.3), (16, 0.4), (32, 0.2), (64, 0.1))
ALL_LINEAR_SHARE = 0.6
INTERACTIVE_SHARE = 0.75
"""Share of groups whose pipeline is interactive (the rest is background)."""
CANARY_SHARE = 0.01
CANARY_WINDOW_S = 1800.0
"""A canary unit's requests in its first 30 minutes (original clock) are canary traffic."""
DEFAULT_STEPS = 30
NO_CHECKPOINT = "M-none"
REQUIRED = ("gmt_create", "groupId", "checkpoint_model_version_id", "prompt_length",
            "negative_prompt_length", "num_inference_steps")


class Gentd26Error(ValueError):
    """The GenTD26 file cannot be imported; names the row and column."""

    retriable = False


def keyed_unit(key: str, kind: str, ident: str) -> float:
    """A deterministic number in [0, 1) for (key, kind, ident): BLAKE2b, stable across processes."""
    digest = hashlib.blake2b(f"{key}|{kind}|{ident}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _pick(u: float, weighted: tuple[tuple[object, float], ...]) -> object:
    acc = 0.0
    for value, weight in weighted:
        acc += weight
        if u < acc:
            return value
    return weighted[-1][0]


def _number(row: dict[str, str], column: str, line: int, default: float) -> float:
    text = (row.get(column) or "").strip()
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise Gentd26Error(f"row {line}, column {column}: not a number: {text!r}") from None


def import_gentd26(
    path: str | Path, *, time_scale: float = 1.0, key: str = DEFAULT_KEY
) -> Iterator[TraceRow]:
    """Rows of the simulator trace for the GenTD26 request file at ``path`` (see module doc)."""
    if not time_scale > 0:
        raise ValueError(f"time scale must be > 0, got {time_scale}")
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rb") as raw:  # type: ignore[operator]
        reader = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise Gentd26Error(f"{p}: missing columns: {', '.join(missing)}")
        t0: float | None = None
        last = float("-inf")
        first_seen: dict[str, float] = {}
        for line, row in enumerate(reader, start=2):
            stamp = row["gmt_create"]
            try:
                parsed = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
                t = parsed.replace(tzinfo=UTC).timestamp()
            except ValueError:
                raise Gentd26Error(
                    f"{p}: row {line}, column gmt_create: not 'YYYY-MM-DD HH:MM:SS': {stamp!r}"
                ) from None
            if t < last:
                raise Gentd26Error(f"{p}: row {line}, column gmt_create: {stamp} goes back in time")
            last = t
            t0 = t if t0 is None else t0
            rel = t - t0
            group = row["groupId"]
            if not group:
                raise Gentd26Error(f"{p}: row {line}, column groupId: empty")
            ckpt = row["checkpoint_model_version_id"] or NO_CHECKPOINT
            unit = f"{group}/{ckpt}"
            born = first_seen.setdefault(unit, rel)
            prio = _pick(keyed_unit(key, "tier", group), TIER_SHARES)
            rank = _pick(keyed_unit(key, "rank", unit), RANK_WEIGHTS)
            all_linear = keyed_unit(key, "layers", unit) < ALL_LINEAR_SHARE
            assert isinstance(prio, Priority) and isinstance(rank, int)
            canary = (keyed_unit(key, "canary", unit) < CANARY_SHARE
                      and rel - born < CANARY_WINDOW_S)
            if canary:
                cls = RequestClass.CANARY
            elif keyed_unit(key, "class", group) < INTERACTIVE_SHARE:
                cls = RequestClass.INTERACTIVE
            else:
                cls = RequestClass.BACKGROUND
            prompt = _number(row, "prompt_length", line, 0.0) + _number(
                row, "negative_prompt_length", line, 0.0
            )
            steps = _number(row, "num_inference_steps", line, DEFAULT_STEPS)
            yield TraceRow(
                ts=rel / time_scale,
                tenant_id=group,
                adapter_id=f"{unit}@1",
                priority=prio,
                request_class=cls,
                rank=rank,
                size_bytes=adapter_size_bytes(rank, all_linear),
                canary=canary,
                prompt_tokens=max(0, int(prompt)),
                output_tokens=max(0, int(steps)),
            )

