"""``python -m loraplane.worker``: one inference worker (vLLM engine + host tier).

Start-up: settings (``LORAPLANE_*``; without the served model's, exit 2 naming them),
the engine (~20-30 s on the CPU), the worker app; ``/metrics`` answers once the worker
is ready. SIGINT / SIGTERM stop it gracefully. vLLM spawns its engine process, hence
the ``__main__`` guard.

The spawned engine-core process runs this module's top level again (as
``__mp_main__``), so the worker's own modules are imported inside :func:`main`: the
engine core imports vLLM and nothing of the worker it does not use (seconds saved on
every start of a loaded host). The same holds for :func:`run`, the command line
(``--help`` lists the settings, generated from :class:`WorkerSettings`, and where the
policy file resolves; no other argument is taken: :mod:`loraplane.shared.service_cli`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

log = logging.getLogger("loraplane.worker")


async def main() -> int:
    """Run the worker until SIGINT / SIGTERM (exit 0) or until its engine dies (exit 1);
    exit 2 on a configuration error (the served model's settings unset)."""
    from pydantic import ValidationError

    from loraplane.shared.metrics import start_metrics_server
    from loraplane.worker.settings import WorkerSettings
    from loraplane.worker.vllm_engine import VllmEngine

    try:
        settings = WorkerSettings()
    except ValidationError as exc:
        print(f"worker: configuration error: {exc}", file=sys.stderr)
        return 2
    missing = settings.missing_model_settings()
    if missing:
        print(f"worker: configuration error: {', '.join(missing)} unset: the worker serves "
              "no model by default (set the served base model's name, its directory and the "
              "public keys adapters are signed with)", file=sys.stderr)
        return 2
    assert settings.base_model_dir is not None  # checked with the others just above
    if settings.tls_cert_file:  # its mTLS server: count the handshakes it refuses (from
        # here on, so the engine's processes share the tee and keep their stderr)
        from loraplane.shared.tls import count_handshake_refusals

        count_handshake_refusals("worker", dials_tls=False)
    log.info("starting engine for %s from %s", settings.base_model, settings.base_model_dir)
    engine = await VllmEngine.start(settings.base_model_dir, settings.engine_options())
    log.info("engine started in %.1fs", engine.start_seconds)
    from loraplane.worker.app import WorkerApp

    app = WorkerApp(settings, engine)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await app.start()
        start_metrics_server(settings.worker_metrics_port)
        log.info("worker %s serving on %s", settings.worker_id, app.grpc_address)
        stopped = asyncio.create_task(stop.wait())
        failed = asyncio.create_task(app.engine_failed.wait())
        await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stopped, failed):
            task.cancel()
    finally:
        await app.stop()
        await engine.close()
    return 1 if app.engine_failed.is_set() else 0


SUMMARY = """One inference worker: a vLLM engine serving a base model and its LoRA
adapters (HOT in the engine, WARM on local disk, COLD in the artifact bucket), executing
the cache manager's commands from Kafka and reporting its state and heat."""


def run(argv: Sequence[str] | None = None) -> int:
    """The command line: ``--help`` (exit 0), any other argument (exit 2), none: the
    worker (:func:`main`)."""
    from loraplane.policy.config import DEFAULT_CONFIG_PATH
    from loraplane.shared.service_cli import ShippedFile, parse_service_args
    from loraplane.worker.settings import WorkerSettings

    parse_service_args(
        argv, prog="python -m loraplane.worker", summary=SUMMARY, settings=WorkerSettings,
        files=[ShippedFile("policy", DEFAULT_CONFIG_PATH,
                           "when LORAPLANE_WORKER_POLICY_FILE is unset")],
        notes="LORAPLANE_BASE_MODEL, LORAPLANE_BASE_MODEL_DIR and LORAPLANE_TRUSTED_KEYS "
              "are required (no default model; `make run` passes the demo build's).",
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return asyncio.run(main())


if __name__ == "__main__":
    sys.exit(run())
