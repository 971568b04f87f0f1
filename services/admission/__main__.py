"""``python -m loraplane.admission``: run the admission service until SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from pydantic import ValidationError

from loraplane.admission.app import AdmissionApp
from loraplane.admission.settings import AdmissionSettings


async def serve(settings: AdmissionSettings) -> None:
    """Start admission, wait for a termination signal, stop."""
    app = AdmissionApp(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.start()
    print(f"admission ready: consuming {settings.admission_releases_topic}", flush=True)
    await stop.wait()
    logging.getLogger("loraplane.admission").info("signal received, shutting down")
    await app.stop()


def main() -> int:
    """Entry point; exit 2 on a configuration error."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    try:
        settings = AdmissionSettings()
    except ValidationError as exc:
        print(f"admission: configuration error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
