"""A worker that found no HOT slot within the budget: degrade by policy, else its 429."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from loraplane.gateway.auth import Principal
from loraplane.gateway.budget import BudgetConfig, ClassBudget, ColdPolicy
from loraplane.shared.errors import LoraplaneError
from loraplane.v1 import common_pb2, inference_pb2, worker_pb2
from tests.support.echo_worker import EchoWorker

from .harness import Harness, harness

ACME = Principal("acme", "ka")
BACKGROUND = common_pb2.REQUEST_CLASS_BACKGROUND


@pytest.fixture(autouse=True)
def _base_requests_never_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The echo worker's ``fail_with`` hits adapter requests only: a worker without a HOT
    slot for a version still serves the base model (its zero adapter is always HOT)."""
    generate = EchoWorker.Generate

    async def only_adapters(
        self: EchoWorker, request: worker_pb2.WorkerGenerateRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        saved = self.fail_with
        if request.use_base:
            self.fail_with = None
        try:
            async for msg in generate(self, request, context):
                yield msg
        finally:
            self.fail_with = saved

    monkeypatch.setattr(EchoWorker, "Generate", only_adapters)


def req(**kw: object) -> inference_pb2.GenerateRequest:
    return inference_pb2.GenerateRequest(adapter="support", prompt="hello there", max_tokens=3,
                                         **kw)  # type: ignore[arg-type]


async def collect(h: Harness, r: inference_pb2.GenerateRequest
                  ) -> list[inference_pb2.GenerateResponse]:
    return [m async for m in h.gateway.generate(ACME, r)]


def no_slot(h: Harness, reason: str = "no_slot") -> None:
    w = h.workers["w0"]
    w.hot.add(11)
    h.report("w0")
    w.fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED
    w.fail_reason = reason


@pytest.mark.parametrize("reason", ["no_slot", "queue_full"])
async def test_interactive_degrades_to_the_base_model(reason: str) -> None:
    async with harness(n_workers=1) as h:
        no_slot(h, reason)
        msgs = await collect(h, req())
        r = msgs[0].resolved
        assert r.degraded_to_base and r.adapter.version == "v1" and msgs[-1].finished
        sent = h.workers["w0"].requests
        assert [x.use_base for x in sent] == [False, True]
        assert sent[0].cold_budget_ms > 0  # the budget travelled with the HOT route
        assert h.metric("loraplane_gateway_degraded_total",
                        {"tenant": "acme", "adapter": "support", "version": "v1",
                         "class": "interactive"}) == 1


async def test_background_gets_the_refusal_with_its_retry_hint() -> None:
    async with harness(n_workers=1) as h:
        no_slot(h)
        with pytest.raises(LoraplaneError) as info:
            await collect(h, req(request_class=BACKGROUND))
        assert info.value.grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "fails on purpose" in info.value.message and "w0" in info.value.message
        assert [x.use_base for x in h.workers["w0"].requests] == [False]


async def test_fail_fast_interactive_is_refused_too() -> None:
    budgets = BudgetConfig(interactive=ClassBudget(budget_ms=300, on_cold=ColdPolicy.FAIL_FAST))
    async with harness(n_workers=1, budgets=budgets) as h:
        no_slot(h)
        with pytest.raises(LoraplaneError) as info:
            await collect(h, req())
        assert info.value.grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_other_resource_exhaustion_is_not_degraded() -> None:
    async with harness(n_workers=1) as h:
        no_slot(h, "no_capacity")  # host bytes full: not a slot wait
        with pytest.raises(LoraplaneError):
            await collect(h, req())
        assert [x.use_base for x in h.workers["w0"].requests] == [False]
