"""S3 backend fixtures: moto in-process, moto over HTTP, or a real endpoint.

* ``s3_backend``: moto's in-process mock (``moto.mock_aws``).
* ``s3_http_backend``: moto's ``ThreadedMotoServer`` on a free loopback port,
  reached by boto3 through ``endpoint_url`` (real HTTP, real sockets).

When ``S3_ENDPOINT_URL`` is set (with ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and optionally ``AWS_DEFAULT_REGION``), both
fixtures use that endpoint instead of moto. ``S3_BUCKET`` names the bucket
(default ``checkpointers-test``, created if missing); every test gets its
own random key prefix, so runs never see each other's objects.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

REGION = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
REAL_ENDPOINT = os.environ.get("S3_ENDPOINT_URL")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fake_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(var, value)


def make_s3_client(endpoint_url: str | None = None) -> Any:
    """A boto3 S3 client with fast bounded retries (used by tests for raw listing too)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=REGION,
        config=Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=32),
    )


def _backend(endpoint_url: str | None) -> Iterator[Any]:
    from checkpointers.backends.s3 import S3Backend

    bucket = os.environ.get("S3_BUCKET", "checkpointers-test") if REAL_ENDPOINT else "checkpointers-test"
    client = make_s3_client(endpoint_url)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    except client.exceptions.BucketAlreadyExists:
        pass
    backend = S3Backend(bucket, f"t-{uuid.uuid4().hex}", client=client, max_workers=8)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture(scope="session")
def moto_server_url() -> Iterator[str]:
    """URL of one moto HTTP server for the session (or ``S3_ENDPOINT_URL``)."""
    if REAL_ENDPOINT:
        yield REAL_ENDPOINT
        return
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An S3Backend on moto in-process (or on ``S3_ENDPOINT_URL``)."""
    if REAL_ENDPOINT:
        yield from _backend(REAL_ENDPOINT)
        return
    from moto import mock_aws

    _fake_credentials(monkeypatch)
    with mock_aws():
        yield from _backend(None)


@pytest.fixture
def s3_http_backend(monkeypatch: pytest.MonkeyPatch, moto_server_url: str) -> Iterator[Any]:
    """An S3Backend talking HTTP to moto's server on loopback (or ``S3_ENDPOINT_URL``)."""
    if not REAL_ENDPOINT:
        _fake_credentials(monkeypatch)
    yield from _backend(moto_server_url)
