"""``python -m loraplane.registry``: run the registry until SIGTERM / SIGINT.

``--help`` lists the settings (generated from :class:`RegistrySettings`) and where the
migrations resolve; no other argument is taken (:mod:`loraplane.shared.service_cli`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from loraplane.registry.app import RegistryApp
from loraplane.registry.settings import RegistrySettings
from loraplane.shared.resources import migrations_dir
from loraplane.shared.service_cli import ShippedFile, parse_service_args
from loraplane.shared.tls import count_handshake_refusals

SUMMARY = """The adapter registry: tenants, adapters, versions, releases and API keys in
PostgreSQL behind the RegistryAdmin gRPC API; publishes lifecycle events through its
outbox and records admission verdicts from adapter.admissions."""


async def serve(settings: RegistrySettings) -> None:
    """Start the registry, wait for a termination signal, stop gracefully."""
    app = RegistryApp(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.start()
    print(f"registry ready on {app.address}", flush=True)
    await stop.wait()
    logging.getLogger("loraplane.registry").info("signal received, shutting down")
    await app.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exit 2 on a configuration error or an argument (``--help`` aside)."""
    parse_service_args(
        argv, prog="python -m loraplane.registry", summary=SUMMARY, settings=RegistrySettings,
        files=[ShippedFile("migrations", migrations_dir(),
                           "its schema, applied by `loraplane db migrate` with dbmate")],
        notes="LORAPLANE_REGISTRY_OPERATOR_TOKEN (16 characters or more) is required.",
    )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # aiokafka logs every failed request of an outage (several lines a second); the relay
    # and the consumer report a broker loss and its recovery once each.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        settings = RegistrySettings()
        if not settings.registry_operator_token.get_secret_value():
            raise ValueError("LORAPLANE_REGISTRY_OPERATOR_TOKEN must be set")
    except (ValidationError, ValueError) as exc:
        print(f"registry: configuration error: {exc}", file=sys.stderr)
        return 2
    if settings.tls_cert_file:
        count_handshake_refusals("registry", dials_tls=False)
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
