"""TLS to the stack's PostgreSQL and S3 (issue 23): a plaintext client is refused, a client
trusting another CA is refused, the stack's clients work over TLS, and Tansu keeps its log
in an HTTPS-only S3 gateway.

PostgreSQL is the session's stack (``tls`` on: ``hostssl`` only). The S3 case starts a
SeaweedFS and a Tansu of its own (``s3_tls`` on, ports 600 above the session's base), so
that it checks HTTPS whatever the session's S3 speaks (``StackSettings.s3_tls``: on with
``tls`` by default; ``LORAPLANE_STACK_S3_TLS=false`` makes the session's plaintext).
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import asyncpg
import pytest
import urllib3
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from cryptography.hazmat.primitives import serialization
from minio import Minio

from loraplane.stack.certs import make_ca
from loraplane.stack.components import SeaweedFS, Tansu
from loraplane.stack.settings import StackSettings
from loraplane.stack.stack import Stack

OWN_STACK_PORT_SHIFT = 600
"""The private SeaweedFS / Tansu's port base above the session stack's (inside its block)."""


def _plain_dsn(s: StackSettings) -> str:
    return (f"postgresql://{s.postgres_user}:{s.postgres_password}"
            f"@127.0.0.1:{s.postgres_port}/{s.postgres_db}")


async def test_postgres_serves_tls_only(stack: Stack, tmp_path: Path) -> None:
    s = stack.settings
    assert s.tls and "sslmode=verify-full" in s.postgres_dsn
    conn = await asyncpg.connect(s.postgres_dsn)  # what every service and test uses
    try:
        row = await conn.fetchrow(
            "select ssl, version from pg_stat_ssl where pid = pg_backend_pid()")
        assert row is not None and row["ssl"] is True and row["version"].startswith("TLS")
    finally:
        await conn.close()

    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError,
                       match="no pg_hba.conf entry .* no encryption"):
        await asyncpg.connect(_plain_dsn(s), ssl=False)

    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(make_ca("another CA")[0].public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncpg.connect(_plain_dsn(s) + f"?sslmode=verify-full&sslrootcert={other_ca}")


@pytest.fixture
def tls_s3(stack_settings: StackSettings, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[StackSettings]:
    """A SeaweedFS (HTTPS only) and a Tansu storing its log there, on their own ports."""
    assert stack_settings.port_base is not None
    own = StackSettings(profile="test", tls=True, s3_tls=True,
                        port_base=stack_settings.port_base + OWN_STACK_PORT_SHIFT,
                        data_dir=tmp_path_factory.mktemp("tls-s3"))
    seaweed, tansu = SeaweedFS(own), Tansu(own)
    try:
        seaweed.start()
        tansu.start()
        yield own
    finally:  # throwaway data: no clean shutdown needed (the two took 12.7 s to stop)
        tansu.kill()
        seaweed.kill()


def test_s3_serves_https_only_and_tansu_stores_over_it(tls_s3: StackSettings) -> None:
    s = tls_s3
    client = s.s3_client()
    key = f"tls-{uuid.uuid4().hex[:8]}"
    client.put_object(s.artifact_bucket, key, BytesIO(b"over tls"), 8)
    resp = client.get_object(s.artifact_bucket, key)
    try:
        assert resp.read() == b"over tls"
    finally:
        resp.close()
        resp.release_conn()

    plain = Minio(s.s3_endpoint, access_key=s.s3_access_key, secret_key=s.s3_secret_key,
                  secure=False, region="us-east-1",
                  http_client=urllib3.PoolManager(retries=False))
    with pytest.raises(Exception, match="HTTP request to an HTTPS server"):
        plain.list_buckets()

    system_roots = Minio(s.s3_endpoint, access_key=s.s3_access_key,
                         secret_key=s.s3_secret_key, secure=True, region="us-east-1",
                         http_client=urllib3.PoolManager(retries=False))
    with pytest.raises(urllib3.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        system_roots.list_buckets()

    topic = f"tls-{uuid.uuid4().hex[:8]}"
    values = asyncio.run(_roundtrip(s.kafka_bootstrap, topic))
    assert sorted(values) == [b"a", b"b"]  # keyless: spread over the topic's partitions
    stored = [o.object_name for o in client.list_objects(s.kafka_bucket, recursive=True)]
    assert any(topic in (name or "") for name in stored), stored


async def _roundtrip(bootstrap: str, topic: str) -> list[bytes]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for v in (b"a", b"b"):
            await producer.send_and_wait(topic, v)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=topic,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        got: list[bytes] = []
        while len(got) < 2:
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 30)
            got += [m.value for msgs in batch.values() for m in msgs if m.value is not None]
        return got
    finally:
        await consumer.stop()
