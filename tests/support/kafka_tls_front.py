"""A TLS listener in front of a plaintext Kafka broker, for tests of the clients' TLS wiring.

The local stack's broker (Tansu 0.6.0) serves no TLS, so a test that must show a client
speaking TLS to Kafka puts this in front of a Tansu of its own whose advertised listener
is the front's address: every connection a client opens (bootstrap, then the partition
leaders and the group coordinator the broker names) ends in TLS here, and only a
connection whose handshake succeeded is forwarded, byte for byte, to the broker.

``require_client_cert`` decides, per accepted connection, whether the front also demands
a client certificate of its CA (mutual TLS); ``forwarded`` counts the connections that got
through. Runs its own event loop in a thread, so sync fixtures can start and stop it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from pathlib import Path


def free_port() -> int:
    """A port nothing listens on now (the front binds it just after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=client_ca)
    return ctx


class KafkaTlsFront:
    """TLS on ``127.0.0.1:port``, forwarding to the plaintext broker at ``upstream_port``."""

    def __init__(self, port: int, upstream_port: int, *, cert: Path, key: Path,
                 ca: Path) -> None:
        self.port = port
        self.upstream_port = upstream_port
        self._server_auth = _server_context(cert, key, None)
        self._mutual = _server_context(cert, key, ca)
        self.require_client_cert = False
        """Demand a client certificate of ``ca`` on the next connections (mutual TLS)."""
        self.forwarded = 0
        """Connections whose TLS handshake succeeded (and were forwarded to the broker)."""
        self.handshakes_failed = 0
        """Connections refused in the TLS handshake."""
        self._counted = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="kafka-tls-front")
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def wait_refused(self, count: int, timeout_s: float = 10.0) -> int:
        """Wait until at least ``count`` handshakes failed (the client may see the refusal
        before this side has counted it); returns the number."""
        with self._counted:
            self._counted.wait_for(lambda: self.handshakes_failed >= count, timeout_s)
            return self.handshakes_failed

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            ctx = self._mutual if self.require_client_cert else self._server_auth
            try:
                await writer.start_tls(ctx, ssl_handshake_timeout=10)
            except (ssl.SSLError, OSError, TimeoutError):
                with self._counted:
                    self.handshakes_failed += 1
                    self._counted.notify_all()
                writer.close()
                return
            self.forwarded += 1
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1",
                                                                 self.upstream_port)
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer),
                                 return_exceptions=True)
        finally:
            self._tasks.discard(task)
            writer.close()

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        finally:
            dst.close()
