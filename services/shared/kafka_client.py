"""How every Kafka client connects: the bootstrap servers and their security, in one place.

:class:`KafkaConnection` (from :meth:`~loraplane.shared.settings.CommonSettings.kafka`)
is what each aiokafka construction site takes instead of a bare bootstrap string; it
splats into the client with :meth:`KafkaConnection.client_args`::

    AIOKafkaProducer(**settings.kafka().client_args(), acks="all")

``LORAPLANE_KAFKA_SECURITY_PROTOCOL`` is one of

* ``PLAINTEXT`` (default: the local stack's Tansu, which serves no TLS);
* ``SSL``: TLS, the broker's certificate verified against ``LORAPLANE_KAFKA_CA_FILE``
  (empty: the system's roots) and its host name checked; with
  ``LORAPLANE_KAFKA_CERT_FILE`` / ``_KEY_FILE`` the client presents that certificate
  (mutual TLS: a broker with ``ssl.client.auth=required``, as in ``docker-compose.yml``);
* ``SASL_SSL``: the same TLS plus a SASL login (``LORAPLANE_KAFKA_SASL_MECHANISM``,
  ``_SASL_USERNAME``, ``_SASL_PASSWORD``).

:meth:`KafkaConnection.problems` lists every inconsistency, each naming its variable
(settings validation raises them at start). The TLS context is built anew for every
client (:meth:`client_args`), so a client recreated after a rotation of the files (every
consumer loop recreates its consumer after a failure) reads the new ones. The SASL
password never appears in a ``repr`` or a message.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Any, Literal

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

ENV = {
    "security_protocol": "LORAPLANE_KAFKA_SECURITY_PROTOCOL",
    "ca_file": "LORAPLANE_KAFKA_CA_FILE",
    "cert_file": "LORAPLANE_KAFKA_CERT_FILE",
    "key_file": "LORAPLANE_KAFKA_KEY_FILE",
    "sasl_mechanism": "LORAPLANE_KAFKA_SASL_MECHANISM",
    "sasl_username": "LORAPLANE_KAFKA_SASL_USERNAME",
    "sasl_password": "LORAPLANE_KAFKA_SASL_PASSWORD",
}
"""Field of :class:`KafkaConnection` -> the environment variable that sets it."""


class KafkaConfigError(ValueError):
    """The Kafka security settings are inconsistent or name files that cannot be used."""


@dataclass(frozen=True)
class KafkaConnection:
    """Where the brokers are and how to reach them (see the module)."""

    bootstrap: str
    """Bootstrap servers, ``host:port[,host:port...]``."""
    security_protocol: SecurityProtocol = "PLAINTEXT"
    ca_file: str = ""
    """PEM bundle the broker's certificate must chain to (empty: the system's roots)."""
    cert_file: str = ""
    """This client's certificate chain (PEM), for a broker that requires one."""
    key_file: str = ""
    """The private key of ``cert_file`` (PEM; never logged)."""
    sasl_mechanism: SaslMechanism = "SCRAM-SHA-512"
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)

    @property
    def tls(self) -> bool:
        """Whether the connection is encrypted."""
        return self.security_protocol != "PLAINTEXT"

    def problems(self) -> list[str]:
        """Every inconsistency of these settings (empty: usable), each naming its variable;
        with TLS, the files are also loaded once (a key that is not the certificate's)."""
        out: list[str] = []
        proto = ENV["security_protocol"]
        files = {name: getattr(self, name) for name in ("ca_file", "cert_file", "key_file")}
        if not self.tls:
            out += [f"{ENV[name]} is set but {proto} is PLAINTEXT: it would never be used "
                    f"(set {proto}=SSL)" for name, value in files.items() if value]
        if bool(self.cert_file) != bool(self.key_file):
            given, missing = (("cert_file", "key_file") if self.cert_file
                              else ("key_file", "cert_file"))
            out.append(f"{ENV[given]} is set without {ENV[missing]}: a client certificate "
                       "needs both")
        out += [f"{ENV[name]}={value} cannot be read" for name, value in files.items()
                if value and not os.access(value, os.R_OK)]
        sasl = {name: getattr(self, name) for name in ("sasl_username", "sasl_password")}
        if self.security_protocol == "SASL_SSL":
            out += [f"{proto}=SASL_SSL needs {ENV[name]}" for name, value in sasl.items()
                    if not value]
        else:
            out += [f"{ENV[name]} is set but {proto} is {self.security_protocol}, not "
                    "SASL_SSL" for name, value in sasl.items() if value]
        if self.tls and not out:
            try:
                self.ssl_context()
            except KafkaConfigError as exc:
                out.append(str(exc))
        return out

    def check(self) -> KafkaConnection:
        """``self`` when usable; :class:`KafkaConfigError` listing every problem otherwise."""
        problems = self.problems()
        if problems:
            raise KafkaConfigError("Kafka settings: " + "; ".join(problems))
        return self

    def ssl_context(self) -> ssl.SSLContext | None:
        """A new client TLS context (verifies the broker's certificate and host name), or
        ``None`` for PLAINTEXT."""
        if not self.tls:
            return None
        from aiokafka.helpers import create_ssl_context

        try:
            context: ssl.SSLContext = create_ssl_context(
                cafile=self.ca_file or None, certfile=self.cert_file or None,
                keyfile=self.key_file or None)
            return context
        except (OSError, ssl.SSLError, ValueError) as exc:
            names = ", ".join(f"{ENV[n]}={getattr(self, n)}"
                              for n in ("ca_file", "cert_file", "key_file") if getattr(self, n))
            raise KafkaConfigError(f"cannot load the Kafka TLS files ({names}): "
                                   f"{type(exc).__name__}: {exc}") from None

    def client_args(self) -> dict[str, Any]:
        """Keyword arguments of every aiokafka client (producer, consumer, admin):
        ``bootstrap_servers``, ``security_protocol`` and, with TLS, a fresh
        ``ssl_context`` (and the SASL login)."""
        args: dict[str, Any] = {"bootstrap_servers": self.bootstrap,
                                "security_protocol": self.security_protocol}
        if self.tls:
            args["ssl_context"] = self.ssl_context()
        if self.security_protocol == "SASL_SSL":
            args.update(sasl_mechanism=self.sasl_mechanism,
                        sasl_plain_username=self.sasl_username,
                        sasl_plain_password=self.sasl_password)
        return args
