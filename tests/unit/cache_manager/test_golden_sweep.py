"""Golden-set shadow runs of the service: a canary HOT anywhere is exercised once per worker
(also when it was HOT before its pointer was set), a diverging answer demotes it there, and
a canary whose golden set has not answered is pending (fake shadow runner, no I/O)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from loraplane.cache_manager.canary_window import CanaryWindow
from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.leader import CacheManagerService
from loraplane.cache_manager.model import VersionRecord
from loraplane.cache_manager.rules import GoldenPrompt, rules_from_mapping
from loraplane.cache_manager.settings import CacheManagerSettings
from loraplane.cache_manager.shadow import ShadowResult, judge_answer
from loraplane.policy.config import PolicyConfig
from loraplane.policy.factory import make_policy
from loraplane.v1 import common_pb2
from tests.support import eventgen as ev

T0 = 1_800_000_000.0
A = ev.ref("review", "v2")


class FakeShadow:
    """Answers every prompt with ``answer`` (what the canary's weights would say)."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, list[GoldenPrompt]]] = []

    async def run(self, address: str, record: VersionRecord, prompts: list[GoldenPrompt], *,
                  max_tokens: int, timeout_s: float) -> ShadowResult:
        self.calls.append((address, record.ref.version_id, list(prompts)))
        errors = [e for e in (judge_answer(p, self.answer) for p in prompts) if e]
        return ShadowResult(len(prompts) - len(errors), len(errors), tuple(errors))


def service(answer: str) -> tuple[CacheManagerService, CacheCore, FakeShadow]:
    rules = rules_from_mapping({
        "demand": {"enabled": False},
        "canary": {"golden_sets": {"acme/review": [{"prompt": "Hi", "expect": " there"}]}},
    })
    shadow = FakeShadow(answer)
    svc = CacheManagerService(CacheManagerSettings(), rules, PolicyConfig(),
                              registry=CollectorRegistry(), clock=lambda: T0, shadow=shadow)
    core = CacheCore(policy=make_policy(rules.policy, PolicyConfig()),
                     policy_config=PolicyConfig(), rules=rules, worker_timeout_s=30.0)
    core.apply(ev.admitted(A, 1, T0), T0)
    # HOT on w1 before it became the canary (a request path or the policy loaded it)
    core.apply(ev.snapshot(ev.WorkerSpec("w1", held=[ev.Held(A, common_pb2.TIER_HOT, engine_id=1)]), 1, T0),
               T0)
    core.apply(ev.snapshot(ev.WorkerSpec("w2"), 1, T0), T0)
    svc.core = core
    return svc, core, shadow


async def settle(svc: CacheManagerService) -> None:
    while svc._shadow_tasks:
        await asyncio.sleep(0)


async def test_a_canary_hot_before_its_pointer_is_exercised_once_and_demoted_on_divergence(
) -> None:
    svc, core, shadow = service(answer=" world")
    svc._shadow_sweep(core)
    assert shadow.calls == []  # not a canary yet
    # staged at 0 %: at a share > 0 the canary is protected and this, its last HOT replica,
    # is kept by the guards until the analysis aborts it (next tick), then demoted
    core.apply(ev.canary(A, 0, T0 + 1), T0 + 1)
    svc._shadow_sweep(core)
    svc._shadow_sweep(core)  # the same worker is not exercised twice
    await settle(svc)
    assert [(addr, vid) for addr, vid, _ in shadow.calls] == [("127.0.0.1:11", A.version_id)]
    assert shadow.calls[0][2] == [GoldenPrompt(prompt="Hi", expect=" there")]
    res = core.round(T0 + 2)
    demotes = [(i.pending.spec.kind.value, i.pending.spec.worker_id, i.decision.reason)
               for i in res.issued if i.pending.spec.version_id == A.version_id]
    assert ("demote", "w1", "golden_set_failed") in demotes, demotes


async def test_a_matching_canary_passes_and_the_pending_flag_follows_the_runs() -> None:
    svc, core, shadow = service(answer=" there")
    window = CanaryWindow()

    class Runner:  # what _exercise records the results into
        def __init__(self) -> None:
            self.window = window

    svc.canary = Runner()  # type: ignore[assignment]
    core.apply(ev.canary(A, 10, T0 + 1), T0 + 1)
    assert not window.golden_seen(A.version_id)
    svc._shadow_sweep(core)
    assert A.version_id in svc._golden_running  # in flight: pending
    await settle(svc)
    assert svc._golden_running == {} and len(shadow.calls) == 1
    f = window.figures(A.version_id, T0, T0 + 10)
    assert (f.golden_ok, f.golden_failed) == (1, 0) and window.golden_seen(A.version_id)
    assert not [i for i in core.round(T0 + 2).issued
                if i.decision.reason == "golden_set_failed"]
