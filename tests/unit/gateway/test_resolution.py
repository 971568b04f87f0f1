"""Version resolution: sticky SHA-256 canary split, canary only once warm."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loraplane.gateway.resolution import (
    ReleaseView,
    in_canary,
    resolve,
    split_bucket,
)
from loraplane.v1 import common_pb2

INTERACTIVE = common_pb2.REQUEST_CLASS_INTERACTIVE
CANARY = common_pb2.REQUEST_CLASS_CANARY
REL = ReleaseView("acme", "support", "v1", "v2", 10)


def test_bucket_is_pinned_sha256_of_adapter_and_key() -> None:
    # pinned values: the split must not move between releases, processes or gateways
    assert split_bucket("acme/support", "user-42") == 2302
    assert split_bucket("acme/code", "user-42") == 8267  # salted by the adapter id


def test_bucket_does_not_depend_on_the_process_hash_seed() -> None:
    code = (
        "from loraplane.gateway.resolution import split_bucket;"
        "print(split_bucket('acme/support', 'user-42'))"
    )
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True)
        outs.add(int(out.stdout))
    assert outs == {split_bucket("acme/support", "user-42")}


@pytest.mark.parametrize("percent", [1, 10, 25, 50])
def test_split_share_matches_percent(percent: int) -> None:
    n = 20_000
    hits = sum(in_canary("acme/support", f"req-{i}", percent) for i in range(n))
    assert abs(hits / n - percent / 100) < 0.01


def test_zero_and_hundred_percent() -> None:
    assert not any(in_canary("a/b", f"k{i}", 0) for i in range(1000))
    assert all(in_canary("a/b", f"k{i}", 100) for i in range(1000))


def test_same_key_always_lands_on_the_same_side() -> None:
    sides = {resolve(REL, "session-7", INTERACTIVE, canary_warm=True) for _ in range(50)}
    assert len(sides) == 1


def test_canary_keys_get_the_canary_when_warm() -> None:
    keys = [f"user-{i}" for i in range(2000)]
    canary_keys = [k for k in keys if in_canary(REL.adapter_id, k, 10)]
    assert canary_keys
    for k in canary_keys[:50]:
        r = resolve(REL, k, INTERACTIVE, canary_warm=True)
        assert r is not None and (r.version, r.canary) == ("v2", True)


def test_cold_canary_is_held_back_for_real_traffic() -> None:
    k = next(f"user-{i}" for i in range(2000) if in_canary(REL.adapter_id, f"user-{i}", 10))
    r = resolve(REL, k, INTERACTIVE, canary_warm=False)
    assert r is not None
    assert (r.version, r.canary, r.canary_held_back) == ("v1", False, True)


def test_canary_class_always_reaches_the_canary_even_cold() -> None:
    r = resolve(REL, "anything", CANARY, canary_warm=False)
    assert r is not None and (r.version, r.canary) == ("v2", True)


def test_canary_class_without_canary_gets_stable() -> None:
    r = resolve(ReleaseView("acme", "support", "v1"), "k", CANARY, canary_warm=False)
    assert r is not None and (r.version, r.canary) == ("v1", False)


def test_no_stable_version_resolves_to_none() -> None:
    assert resolve(ReleaseView("acme", "support", ""), "k", INTERACTIVE, canary_warm=True) is None


def test_canary_equal_to_stable_is_not_a_canary() -> None:
    r = resolve(ReleaseView("acme", "s", "v1", "v1", 100), "k", INTERACTIVE, canary_warm=True)
    assert r is not None and (r.version, r.canary) == ("v1", False)
