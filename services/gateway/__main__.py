"""``python -m loraplane.gateway``: run the gateway until SIGINT / SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

from loraplane.gateway.app import GatewayApp
from loraplane.gateway.settings import GatewaySettings

log = logging.getLogger("loraplane.gateway")


async def serve(settings: GatewaySettings) -> None:
    """Start the gateway, wait for a stop signal, stop gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    app = GatewayApp(settings)
    await app.start()
    log.info("gateway serving: grpc %s:%d, http %s:%d, event loop %s", settings.bind_host,
             app.grpc_port, settings.bind_host, app.http_port if app.http else 0,
             type(loop).__module__.split(".")[0])
    await stop.wait()
    log.info("gateway stopping")
    await app.stop()


def main() -> None:
    """Entry point."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = GatewaySettings()
    if settings.uvloop:
        import uvloop

        uvloop.run(serve(settings))
    else:
        asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
