"""``python -m loraplane.admission``: run the admission service until SIGTERM / SIGINT.

``--help`` lists the settings (generated from :class:`AdmissionSettings`) and where the
catalogue and migrations resolve; no other argument is taken
(:mod:`loraplane.shared.service_cli`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from loraplane.admission.app import AdmissionApp
from loraplane.admission.settings import AdmissionSettings
from loraplane.shared.resources import migrations_dir
from loraplane.shared.service_cli import ShippedFile, parse_service_args

SUMMARY = """Admission: checks every released adapter version (files, safetensors, LoRA
config against the base-model catalogue, signature) and publishes its verdict on
adapter.admissions."""


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exit 2 on a configuration error or an argument (``--help`` aside)."""
    catalogue = AdmissionSettings.model_fields["admission_catalogue_path"].default
    parse_service_args(
        argv, prog="python -m loraplane.admission", summary=SUMMARY, settings=AdmissionSettings,
        files=[ShippedFile("catalogue", catalogue,
                           "when LORAPLANE_ADMISSION_CATALOGUE_PATH is unset"),
               ShippedFile("migrations", migrations_dir(),
                           "its schema, applied by `loraplane db migrate` with dbmate")],
    )
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
