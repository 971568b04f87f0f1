"""Count the TLS handshakes gRPC core refuses, by reading the process's own stderr.

grpcio gives a server no hook on a refused TLS handshake (a caller without a client
certificate, with one of another CA or an expired one, or speaking plaintext to a TLS
port): the connection is closed inside gRPC core, before any Python code runs. What core
does do is log one line per failed handshake, from ``ssl_transport_security.cc`` at absl
``INFO`` (grpcio 1.85.3)::

    I1205 01:07:43.472262   21651 ssl_transport_security.cc:2563] Handshake failed with
    error SSL_ERROR_SSL: error:100000c0:SSL routines:OPENSSL_internal:
    PEER_DID_NOT_RETURN_A_CERTIFICATE: Invalid certificate verification context

(one line). :class:`StderrTee` puts a pipe in place of the process's file descriptor 2 and
hands the pipe's read end to a small child process (this file, run with the standard
library alone) that writes every byte on to the original stderr and sends the parent one
event per such line; the parent's reader thread calls ``on_refusal(reason, count)``.
:func:`classify` names the reason.

Why a child process rather than a thread: the child holds the pipe until the last writer
closes it, so what the process writes just before it dies (a fatal signal's
``faulthandler`` trace, an ``abort()`` message of native code, the last log lines) still
reaches the original stderr, and children that inherited descriptor 2 (the worker's engine
processes) keep a working stderr after the parent is gone. A thread would die with the
process and take the pipe's unread bytes with it. The child ignores SIGINT / SIGTERM /
SIGHUP (a Ctrl-C to the process group must not cut the parent's shutdown logs) and exits at
end of input. A full pipe blocks the writers exactly as a slow stderr would have; nothing
is dropped. Events the parent does not read in time are summed in the child and sent later
(the child never blocks on them).

Lifetime: :meth:`StderrTee.start` registers :meth:`StderrTee.close` with :mod:`atexit`, so
a process that exits normally puts its own stderr back, lets the child forward the rest and
reaps it (briefly bounded: a child process of its own still holding descriptor 2 keeps the
tee serving it): no orphaned tee after a clean stop, and the process's last lines are on
the original stderr when it has exited. A process killed outright leaves the child to
drain and exit by itself (reaped by init, as any orphan). Should the child die first, the
parent's reader thread sees its events pipe close and puts the original stderr back on
descriptor 2 at once (the process keeps its logs; ``on_lost`` is called: the counting
stopped).

Limits (``README.md``, "Security"): the line carries no peer address and no side, so a
process that also *dials* TLS gRPC logs the same text for its own outgoing handshakes
that fail (a server of another CA, an expired one, a plaintext one); only
``PEER_DID_NOT_RETURN_A_CERTIFICATE`` is server-side for certain. The line is logged only
when gRPC's log level lets ``INFO`` through (``GRPC_VERBOSITY`` unset, ``INFO`` or
``DEBUG``): :func:`counting_possible`. The wording is gRPC core's, not an interface: the
unit test pins it on the installed grpcio.

This module imports nothing outside the standard library (the child runs it with ``-I -S``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import re
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping

HANDSHAKE_FAILED = re.compile(
    r"ssl_transport_security\.cc:\d+\] Handshake failed with (?:fatal )?error "
    r"(?P<ssl_error>[A-Z_]+): (?P<detail>.*)")
"""gRPC core's line for a failed TLS handshake (``fatal`` was in the wording of older
releases)."""

REASONS = ("no_certificate", "unknown_ca", "expired", "not_tls", "other")
"""Every reason :func:`classify` returns."""
SERVER_ONLY_REASONS = frozenset({"no_certificate"})
"""Reasons only a server logs (a client always gets the server's certificate)."""

_UNKNOWN_CA = ("unable to get local issuer certificate", "self-signed certificate",
               "self signed certificate", "unable to verify the first certificate",
               "unable to get issuer certificate")
_NOT_TLS = ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST",
            "EXCESSIVE_MESSAGE_SIZE", "UNEXPECTED_RECORD", "BAD_PACKET_LENGTH")

QUIET_VERBOSITIES = frozenset({"WARNING", "ERROR", "NONE"})
"""``GRPC_VERBOSITY`` values that drop the line (it is logged at ``INFO``)."""


def classify(line: str) -> str | None:
    """The refusal reason of one stderr line, ``None`` when it is not gRPC core's
    handshake failure: ``no_certificate`` (the peer sent none: ``PEER_DID_NOT_RETURN_A_
    CERTIFICATE``), ``expired`` / ``unknown_ca`` (``CERTIFICATE_VERIFY_FAILED``: certificate
    has expired / not signed by a trusted CA), ``not_tls`` (plaintext or HTTP/1 bytes on a
    TLS port: ``WRONG_VERSION_NUMBER``, ``HTTP_REQUEST``...), ``other``."""
    match = HANDSHAKE_FAILED.search(line)
    if match is None:
        return None
    detail = match.group("detail")
    if "PEER_DID_NOT_RETURN_A_CERTIFICATE" in detail:
        return "no_certificate"
    if "CERTIFICATE_VERIFY_FAILED" in detail:
        if "certificate has expired" in detail:
            return "expired"
        if any(text in detail for text in _UNKNOWN_CA):
            return "unknown_ca"
        return "other"
    if any(f":{code}:" in detail for code in _NOT_TLS):
        return "not_tls"
    return "other"


def counting_possible(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether gRPC core logs the line in a process with this environment: not when
    ``GRPC_VERBOSITY`` is ``WARNING``, ``ERROR`` or ``NONE`` (gRPC's advice for
    production: then the refusals cannot be counted this way)."""
    return environ.get("GRPC_VERBOSITY", "").strip().upper() not in QUIET_VERBOSITIES


class StderrTee:
    """Descriptor 2 of this process through the counting child (see the module text).

    :meth:`start` installs it (once per process); :meth:`close` puts the original stderr
    back and waits for the child to forward what it holds (tests; a service never needs
    to: at exit the child drains the pipe and ends by itself)."""

    _active: StderrTee | None = None
    _active_lock = threading.Lock()

    def __init__(self, on_refusal: Callable[[str, int], None],
                 on_lost: Callable[[], None] | None = None) -> None:
        self.on_refusal = on_refusal
        self.on_lost = on_lost
        """Called (from the reader thread) when the child died while installed: the
        original stderr is back on descriptor 2, nothing is counted any more."""
        self.lost = False
        self._pid = -1
        self._saved_fd = -1
        self._child: subprocess.Popen[bytes] | None = None
        self._events_fd = -1
        self._reader: threading.Thread | None = None

    @classmethod
    def active(cls) -> StderrTee | None:
        """The tee installed in this process, if any."""
        return cls._active

    def start(self) -> None:
        """Spawn the child and put the pipe in place of descriptor 2. Raises
        ``RuntimeError`` when a tee is already installed, ``OSError`` when the child
        cannot start (stderr is then left as it was)."""
        with StderrTee._active_lock:
            if StderrTee._active is not None:
                raise RuntimeError("a stderr tee is already installed in this process")
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            saved = os.dup(2)
            data_r, data_w = os.pipe()
            events_r, events_w = os.pipe()
            try:
                self._child = subprocess.Popen(
                    [sys.executable, "-I", "-S", os.path.abspath(__file__), str(events_w)],
                    stdin=data_r, stdout=saved, stderr=saved, pass_fds=(events_w,),
                    close_fds=True)
            except BaseException:
                for fd in (saved, data_r, data_w, events_r, events_w):
                    os.close(fd)
                raise
            os.close(data_r)
            os.close(events_w)
            os.dup2(data_w, 2)  # descriptor 2 stays inheritable: children share the tee
            os.close(data_w)
            self._saved_fd, self._events_fd = saved, events_r
            self._pid = os.getpid()
            self._reader = threading.Thread(target=self._read_events,
                                            name="stderr-tee-events", daemon=True)
            self._reader.start()
            StderrTee._active = self
        atexit.register(self.close, _EXIT_TIMEOUT_S)

    def _read_events(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._events_fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                reason, _, count = line.decode("ascii", "replace").partition(" ")
                if reason in REASONS and count.isdigit():
                    self.on_refusal(reason, int(count))
        # End of the events: the child has exited (it holds their write end until then).
        if self._child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._child.wait(5)  # reaped here, whoever ended it: never a zombie
        with contextlib.suppress(OSError):
            os.close(self._events_fd)
        lost = False
        with StderrTee._active_lock:
            if StderrTee._active is self:  # it died under us: our stderr back at once
                with contextlib.suppress(OSError):
                    os.dup2(self._saved_fd, 2)
                    os.close(self._saved_fd)
                StderrTee._active = None
                self.lost = lost = True
        if lost and self.on_lost is not None:
            self.on_lost()

    def close(self, timeout_s: float = 5.0) -> None:
        """Put the original stderr back on descriptor 2, let the child forward what it
        still holds and exit, and deliver its last events (and reap it). A child process
        of this process still holding descriptor 2 keeps the tee serving it: then this
        returns after ``timeout_s`` and the reader reaps the child once it ends."""
        if os.getpid() != self._pid:
            return  # a forked copy of the process: the tee is its parent's
        with StderrTee._active_lock:
            if StderrTee._active is not self:
                return
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(self._saved_fd, 2)  # the pipe's last writer here goes away
            os.close(self._saved_fd)
            StderrTee._active = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if self._reader is not None:
            self._reader.join(timeout_s)  # ends once the child has exited and is reaped


# ---- the child --------------------------------------------------------------------------

MAX_LINE = 65536
"""Bytes of one unterminated line kept for matching (the rest is forwarded unmatched)."""

_EXIT_TIMEOUT_S = 3.0
"""How long a process's exit waits for its tee to forward the last bytes and end."""


def _write_all(fd: int, data: bytes) -> bool:
    """Write ``data`` to ``fd``; ``False`` once ``fd`` is gone (the bytes are dropped:
    nobody reads the original stderr any more)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except BlockingIOError:  # a non-blocking stderr shared with others: wait, not drop
            with contextlib.suppress(OSError, ValueError):
                select.select([], [fd], [], 1.0)
            continue
        except OSError:
            return False
    return True


def _send_events(fd: int, pending: dict[str, int]) -> None:
    """Send the counts of ``pending`` without blocking; what does not fit stays."""
    for reason in list(pending):
        message = f"{reason} {pending[reason]}\n".encode()
        try:
            os.write(fd, message)  # under PIPE_BUF: all or nothing
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                pending.clear()  # the parent is gone: nobody counts any more
                return
            raise
        del pending[reason]


def _child(events_fd: int) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.set_blocking(events_fd, False)
    forwarding = True
    line = b""
    pending: dict[str, int] = {}
    while True:
        try:
            chunk = os.read(0, 65536)
        except InterruptedError:
            continue
        if not chunk:
            break
        if forwarding:
            forwarding = _write_all(1, chunk)
        line += chunk
        *complete, line = line.split(b"\n")
        if len(line) > MAX_LINE:
            line = line[-MAX_LINE:]
        for text in complete:
            if b"Handshake failed" not in text:
                continue
            reason = classify(text.decode("utf-8", "replace"))
            if reason is not None:
                pending[reason] = pending.get(reason, 0) + 1
        if pending:
            _send_events(events_fd, pending)
    if line:
        reason = classify(line.decode("utf-8", "replace"))
        if reason is not None:
            pending[reason] = pending.get(reason, 0) + 1
    if pending:
        os.set_blocking(events_fd, True)  # the parent's reader drains until our EOF
        with contextlib.suppress(OSError):
            _send_events(events_fd, pending)


if __name__ == "__main__":
    _child(int(sys.argv[1]))
