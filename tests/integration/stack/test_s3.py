"""SeaweedFS S3 through the minio SDK: put/get/stat, and a wrong secret is refused."""

from __future__ import annotations

import io

import pytest
from minio import Minio
from minio.error import S3Error

from loraplane.stack.stack import Stack


def _client(stack: Stack, secret: str | None = None) -> Minio:
    return stack.settings.s3_client(secret_key=secret)


def test_put_get_stat(stack: Stack, unique: str) -> None:
    client = _client(stack)
    bucket = stack.settings.artifact_bucket
    data = b"adapter bytes " * 1000
    key = f"tests/{unique}/adapter_model.safetensors"
    client.put_object(bucket, key, io.BytesIO(data), len(data), metadata={"x-amz-meta-sha": "abc"})
    stat = client.stat_object(bucket, key)
    assert stat.size == len(data)
    resp = client.get_object(bucket, key)
    try:
        assert resp.read() == data
    finally:
        resp.close()
        resp.release_conn()
    names = [o.object_name for o in client.list_objects(bucket, prefix=f"tests/{unique}/")]
    assert names == [key]


def test_wrong_secret_is_refused(stack: Stack) -> None:
    client = _client(stack, secret="not-the-secret")
    with pytest.raises(S3Error) as err:
        client.list_objects(stack.settings.artifact_bucket).__next__()
    assert err.value.code == "SignatureDoesNotMatch"


def test_unknown_access_key_is_refused(stack: Stack) -> None:
    s = stack.settings
    client = s.s3_client("nobody", "x")
    with pytest.raises(S3Error) as err:
        client.bucket_exists(s.artifact_bucket)
    assert err.value.code in {"InvalidAccessKeyId", "AccessDenied"}
