"""``python -m loraplane.gateway``: run the gateway until SIGINT / SIGTERM.

``--help`` lists the settings (generated from :class:`GatewaySettings`); no other
argument is taken (:mod:`loraplane.shared.service_cli`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Sequence

from loraplane.gateway.app import GatewayApp
from loraplane.gateway.settings import GatewaySettings
from loraplane.shared.service_cli import parse_service_args
from loraplane.shared.tls import count_handshake_refusals

log = logging.getLogger("loraplane.gateway")

SUMMARY = """The gateway: the public gRPC API (loraplane.v1.Inference) and the
OpenAI-compatible HTTP API. Authenticates API keys, resolves the adapter version, applies
quotas and cold-start budgets, and routes each request to a worker holding it."""


def tune_collector(settings: GatewaySettings) -> None:
    """After start: freeze what start built (views, imports, servers live as long as the
    process: a full collection need not walk them) and set the generation-0 threshold
    (``gc_gen0_threshold``; 0: Python's default)."""
    gc.collect()
    gc.freeze()
    if settings.gc_gen0_threshold:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(settings.gc_gen0_threshold, gen1, gen2)


async def serve(settings: GatewaySettings) -> None:
    """Start the gateway, wait for a stop signal, stop gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    app = GatewayApp(settings)
    await app.start()
    tune_collector(settings)
    log.info("gateway serving: grpc %s:%d, http %s:%d, event loop %s", settings.bind_host,
             app.grpc_port, settings.bind_host, app.http_port if app.http else 0,
             type(loop).__module__.split(".")[0])
    await stop.wait()
    log.info("gateway stopping")
    await app.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point; exit 2 on an argument (``--help`` aside)."""
    parse_service_args(
        argv, prog="python -m loraplane.gateway", summary=SUMMARY, settings=GatewaySettings,
        notes="The gateway ships no config file and uses no database: budgets are the "
              "built-in defaults unless LORAPLANE_GATEWAY_BUDGETS_FILE names a YAML file.",
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = GatewaySettings()
    if settings.edge_tls_cert_file:  # its public gRPC listener (the HTTPS one is Python's
        # ssl: not counted); it dials workers, registry and cache manager over mTLS
        count_handshake_refusals("gateway", dials_tls=bool(settings.tls_cert_file))
    if settings.uvloop:
        import uvloop

        uvloop.run(serve(settings))
    else:
        asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
