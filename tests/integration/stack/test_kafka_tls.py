"""Kafka clients over TLS and mutual TLS (issue 23), against a real TLS endpoint.

Every Kafka client of the services is built from one place
(:meth:`loraplane.shared.kafka_client.KafkaConnection.client_args`). The stack's Tansu 0.6.0
serves no TLS, so this module starts a Tansu of its own (memory storage, ports 650 above
the session's base) whose advertised listener is a TLS front
(``tests/support/kafka_tls_front.py``): after bootstrap every connection the clients open
(partition leaders, the group coordinator) goes to the front too, so a round trip here
went over TLS end to end. Through it: the admin client, a producer and a group consumer
built by the services' own constructors, with TLS and with mutual TLS; a plaintext
client, a client trusting another CA, and (mutual TLS) a client without a certificate or
with one of another CA are refused in the handshake, and nothing of theirs reaches the
broker.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from cryptography.hazmat.primitives import serialization

from loraplane.shared.consumer import group_consumer
from loraplane.shared.kafka_admin import ensure_topics
from loraplane.shared.kafka_client import KafkaConnection
from loraplane.shared.topics import ADAPTER_RELEASES
from loraplane.stack.certs import CertFiles, ensure_dev_pki, issue, make_ca, write_identity
from loraplane.stack.components import Tansu
from loraplane.stack.settings import StackSettings
from tests.support.kafka_tls_front import KafkaTlsFront

OWN_PORT_SHIFT = 650
"""This module's Tansu's port base above the session stack's (inside its block)."""
FRONT_PORT_OFFSET = 40
"""The TLS front's port above that base (past every component offset)."""


class _FrontedTansu(Tansu):
    """Tansu in memory, advertising the TLS front instead of its own plaintext port."""

    def __init__(self, settings: StackSettings, advertised_port: int) -> None:
        super().__init__(settings)
        self.advertised = f"tcp://127.0.0.1:{advertised_port}"

    def command(self) -> list[str]:
        own = f"tcp://127.0.0.1:{self.s.kafka_port}"
        return [str(self.binary()), "broker", "--listener-url", own,
                "--advertised-listener-url", self.advertised,
                "--storage-engine", "memory://tansu/"]


@dataclass(frozen=True)
class Fronted:
    front: KafkaTlsFront
    bootstrap: str
    server: CertFiles
    """The front's certificate (``tansu``) and the dev CA."""
    client: CertFiles
    """A client certificate of the same CA (``gateway``)."""
    foreign: CertFiles
    """A client certificate of another CA (its ``ca`` is that other CA)."""


@pytest.fixture(scope="module")
def fronted(stack_settings: StackSettings, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[Fronted]:
    assert stack_settings.port_base is not None
    root = tmp_path_factory.mktemp("kafka-tls")
    own = StackSettings(profile="test", tls=False, data_dir=root,
                        port_base=stack_settings.port_base + OWN_PORT_SHIFT)
    assert own.port_base is not None
    pki = ensure_dev_pki(own.pki_dir, ("tansu", "gateway"))
    other_ca, other_key = make_ca("another CA")
    other_ca_path = root / "other-ca.pem"
    other_ca_path.write_bytes(other_ca.public_bytes(serialization.Encoding.PEM))
    cert, key = issue("gateway", other_ca, other_key)
    foreign = write_identity(root / "other", "gateway", cert, key, other_ca_path)

    front_port = own.port_base + FRONT_PORT_OFFSET
    front = KafkaTlsFront(front_port, own.kafka_port, cert=pki["tansu"].cert,
                          key=pki["tansu"].key, ca=pki["tansu"].ca)
    tansu = _FrontedTansu(own, front_port)
    front.start()
    try:
        tansu.start()
        yield Fronted(front, f"127.0.0.1:{front_port}", pki["tansu"], pki["gateway"], foreign)
    finally:
        tansu.kill()
        front.stop()


async def _round_trip(kafka: KafkaConnection) -> list[bytes]:
    """Create a topic (admin), send two records (producer) and read them back in a group
    (the shared group consumer): three kinds of client, all from ``kafka``."""
    prefix = f"tls-{uuid.uuid4().hex[:8]}."
    await ensure_topics(kafka, [ADAPTER_RELEASES], prefix=prefix)
    topic = prefix + ADAPTER_RELEASES
    producer = AIOKafkaProducer(**kafka.client_args(), acks="all")
    await producer.start()
    try:
        for value in (b"a", b"b"):
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()
    consumer = group_consumer(topic, kafka=kafka, group_id=topic, client_id="tls-test")
    await consumer.start()
    try:
        got: list[bytes] = []
        async with asyncio.timeout(60):
            while len(got) < 2:
                batch = await consumer.getmany(timeout_ms=1000)
                got += [m.value for msgs in batch.values() for m in msgs if m.value is not None]
        return sorted(got)
    finally:
        await consumer.stop()


async def _refused(kafka: KafkaConnection, front: KafkaTlsFront) -> None:
    """A producer on ``kafka`` cannot start, and nothing it sent reached the broker."""
    forwarded, failed = front.forwarded, front.handshakes_failed
    producer = AIOKafkaProducer(**kafka.client_args(), request_timeout_ms=5000)
    try:
        with pytest.raises(KafkaConnectionError):
            await producer.start()
    finally:
        await producer.stop()
    assert front.wait_refused(failed + 1) > failed, "the front saw no failed handshake"
    assert front.forwarded == forwarded, "a refused client got a connection to the broker"


def _tls(f: Fronted, *, ca: Path, client: CertFiles | None = None) -> KafkaConnection:
    return KafkaConnection(
        f.bootstrap, "SSL", ca_file=str(ca),
        cert_file=str(client.cert) if client else "",
        key_file=str(client.key) if client else "").check()


async def test_tls_round_trip_and_refusals(fronted: Fronted) -> None:
    f = fronted
    f.front.require_client_cert = False
    before = f.front.forwarded
    assert await _round_trip(_tls(f, ca=f.server.ca)) == [b"a", b"b"]
    # bootstrap, then the leader / coordinator connections to the advertised front
    assert f.front.forwarded - before >= 2

    await _refused(KafkaConnection(f.bootstrap), f.front)  # plaintext to the TLS port
    await _refused(_tls(f, ca=f.foreign.ca), f.front)  # trusts another CA only


async def test_mutual_tls_round_trip_and_refusals(fronted: Fronted) -> None:
    f = fronted
    f.front.require_client_cert = True
    try:
        assert await _round_trip(_tls(f, ca=f.server.ca, client=f.client)) == [b"a", b"b"]
        await _refused(_tls(f, ca=f.server.ca), f.front)  # no client certificate
        await _refused(_tls(f, ca=f.server.ca, client=f.foreign), f.front)  # another CA's
    finally:
        f.front.require_client_cert = False
