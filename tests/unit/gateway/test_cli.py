"""``loraplane generate`` against an in-process gateway: text on stdout, resolution and
errors (with retry hints) on stderr, exit codes."""

from __future__ import annotations

import asyncio

from typer.testing import CliRunner

from loraplane.cli.main import app
from loraplane.gateway.budget import BudgetConfig

from .harness import ACME_KEY, harness


async def invoke(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    runner = CliRunner()
    result = await asyncio.to_thread(runner.invoke, app, args, env=env)
    return result.exit_code, result.stdout, result.stderr


async def test_generate_streams_text_and_reports_the_resolution() -> None:
    async with harness(grpc_server=True) as h:
        h.workers["w0"].hot.add(11)
        h.report("w0")
        assert h.server is not None
        env = {"LORAPLANE_GATEWAY_GRPC": f"127.0.0.1:{h.server.port}",
               "LORAPLANE_API_KEY": "", "LORAPLANE_DEMO_API_KEY": ACME_KEY}
        code, out, err = await invoke(
            ["generate", "--adapter", "support", "--prompt", "hi", "--max-tokens", "3"], env)
        assert code == 0, err
        assert out == "tok0 tok1 tok2 \n"
        assert "acme/support@v1" in err and "tier=hot" in err and "worker=w0" in err
        assert "3 output tokens" in err


async def test_generate_errors_exit_non_zero_with_status_and_hint() -> None:
    budgets = BudgetConfig.model_validate(
        {"interactive": {"budget_ms": 300, "on_cold": "fail_fast"}})
    async with harness(grpc_server=True, budgets=budgets) as h:
        assert h.server is not None
        env = {"LORAPLANE_GATEWAY_GRPC": f"127.0.0.1:{h.server.port}",
               "LORAPLANE_API_KEY": ACME_KEY}
        code, _, err = await invoke(["generate", "-a", "support", "-p", "hi"], env)
        assert code == 1 and "UNAVAILABLE" in err and "retry after" in err
        code, _, err = await invoke(["generate", "-a", "legal", "-p", "hi"], env)
        assert code == 1 and "PERMISSION_DENIED" in err
        code, _, err = await invoke(["generate", "-a", "support", "-p", "hi"],
                                    {**env, "LORAPLANE_API_KEY": "wrong"})
        assert code == 1 and "UNAUTHENTICATED" in err
        code, _, err = await invoke(["generate", "-a", "support", "-p", "hi"],
                                    {"LORAPLANE_GATEWAY_GRPC": "127.0.0.1:1",
                                     "LORAPLANE_API_KEY": "", "LORAPLANE_DEMO_API_KEY": ""})
        assert code == 2 and "API key" in err


async def test_generate_shows_n_choices_and_logprobs() -> None:
    async with harness(grpc_server=True) as h:
        h.workers["w0"].hot.add(11)
        h.report("w0")
        assert h.server is not None
        env = {"LORAPLANE_GATEWAY_GRPC": f"127.0.0.1:{h.server.port}",
               "LORAPLANE_API_KEY": ACME_KEY}
        code, out, err = await invoke(
            ["generate", "-a", "support", "-p", "hi", "--max-tokens", "2", "--n", "2",
             "--temperature", "0.8", "--logprobs", "1", "--stop", "END",
             "--logit-bias", "5=1.5", "--presence-penalty", "0.5"], env)
        assert code == 0, err
        assert out == "[0] tok0 tok1 \n[1] tok0 tok1 \n"
        assert err.count("[logprob choice=0 ") == 2 and err.count("[logprob choice=1 ") == 2
        assert "[choice 0: length]" in err and "4 output tokens" in err
        sent = h.workers["w0"].requests[-1].params
        assert (sent.n, sent.logprobs, list(sent.stop)) == (2, 1, ["END"])
        assert dict(sent.logit_bias) == {5: 1.5} and sent.presence_penalty == 0.5
        code, out, _ = await invoke(["generate", "-a", "support", "-p", "hi", "--echo",
                                     "--max-tokens", "1"], env)
        assert code == 0 and out == "hitok0 \n"
        code, _, err = await invoke(["generate", "-a", "support", "-p", "hi", "--echo",
                                     "--logprobs", "0"], env)
        assert code == 1 and "INVALID_ARGUMENT: echo with logprobs" in err
        code, _, err = await invoke(["generate", "-a", "support", "-p", "hi",
                                     "--logit-bias", "x"], env)
        assert code == 2 and "TOKEN_ID=BIAS" in err
