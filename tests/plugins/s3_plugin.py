"""S3 backend fixtures: moto in-process, moto over HTTP, or a real endpoint.

* ``s3_backend``: moto's in-process mock (``moto.mock_aws``).
* ``s3_http_backend``: moto's ``ThreadedMotoServer`` on a free loopback port
  (:class:`benchmarks.services.MotoServer`, the benchmarks' launcher too),
  reached by boto3 through ``endpoint_url`` (real HTTP, real sockets).

When ``S3_ENDPOINT_URL`` is set (with ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and optionally ``AWS_DEFAULT_REGION``), both
fixtures use that endpoint instead of moto. ``S3_BUCKET`` names the bucket
(default ``checkpointers-test``, created if missing); every test gets its
own random key prefix, so runs never see each other's objects.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

REGION = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
REAL_ENDPOINT = os.environ.get("S3_ENDPOINT_URL")


@pytest.fixture(scope="session")
def _aws_env() -> Iterator[None]:
    """Fake credentials for moto (real ones are kept when S3_ENDPOINT_URL is set)."""
    if REAL_ENDPOINT:
        yield
        return
    _make_moto_conditional_writes_atomic()
    fake = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }
    saved = {k: os.environ.get(k) for k in fake}
    os.environ.update(fake)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_MOTO_WRITE_LOCK = threading.RLock()  # re-entered: _key_response calls the handlers


def _make_moto_conditional_writes_atomic() -> None:
    """Serialize moto's object GET/HEAD/PUT/DELETE handlers, as S3 applies each atomically.

    moto checks ``If-Match``/``If-None-Match`` and then stores the object in two
    steps without a lock, so two racing conditional writes can both pass (real
    S3 lets exactly one win). And a GET copies the object's bytes out of a
    buffer that a concurrent DELETE or overwrite closes, so it can fail with
    ``ValueError: I/O operation on closed file`` (real S3 returns the old
    object or 404). And the key dispatcher (``_key_response``) looks the key
    up with a membership test, then an index, so a concurrent DELETE between
    the two raises ``KeyError`` (seen once in a full run, four concurrent
    conditional deletes). A multi-object delete (``DeleteObjects``, which a
    sweep and ``drop`` send) pops each key after looking it up, so two of them
    racing over one key raise ``KeyError`` too (seen in a retention race test),
    and a listing iterates the keys a concurrent delete changes. Both moto
    forms run in this process, so one lock around the dispatcher and the
    handlers gives them S3's semantics. Idempotent.
    """
    from moto.s3.responses import S3Response

    for name in (
        "_key_response", "get_object", "head_object", "put_object", "delete_object",
        "_bucket_response_delete_keys", "list_objects", "list_objects_v2",
    ):  # fmt: skip
        method = getattr(S3Response, name)
        if getattr(method, "_atomic", False):
            continue

        def locked(self: Any, *args: Any, __method: Any = method, **kwargs: Any) -> Any:
            with _MOTO_WRITE_LOCK:
                return __method(self, *args, **kwargs)

        locked._atomic = True  # type: ignore[attr-defined]
        setattr(S3Response, name, locked)


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


BUCKET = os.environ.get("S3_BUCKET", "checkpointers-test") if REAL_ENDPOINT else "checkpointers-test"


def _client_with_bucket(endpoint_url: str | None) -> Any:
    client = make_s3_client(endpoint_url)
    try:
        client.create_bucket(Bucket=BUCKET)
    except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
        pass
    return client


def _backend(client: Any) -> Iterator[Any]:
    """A backend on a fresh random key prefix: empty, and invisible to other tests."""
    from checkpointers.backends.s3 import S3Backend

    backend = S3Backend(BUCKET, f"t-{uuid.uuid4().hex}", client=client, max_workers=8)
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
    # Imported here: the LangGraph suite loads this file by path, where only
    # ``_make_moto_conditional_writes_atomic`` is used and ``benchmarks`` need not be importable.
    from benchmarks.services import MotoServer

    server = MotoServer().start()
    try:
        yield server.endpoint_url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_inprocess_client(_aws_env: None) -> Iterator[Any]:
    """A boto3 client on moto's in-process mock, shared by the session (bucket created)."""
    if REAL_ENDPOINT:
        yield _client_with_bucket(REAL_ENDPOINT)
        return
    from moto import mock_aws

    with mock_aws():
        yield _client_with_bucket(None)


@pytest.fixture(scope="session")
def s3_http_client(_aws_env: None, moto_server_url: str) -> Any:
    """A boto3 client on moto's HTTP server, shared by the session (bucket created)."""
    return _client_with_bucket(moto_server_url)


@pytest.fixture
def s3_backend(s3_inprocess_client: Any) -> Iterator[Any]:
    """An S3Backend on moto in-process (or on ``S3_ENDPOINT_URL``), fresh key prefix."""
    yield from _backend(s3_inprocess_client)


@pytest.fixture
def s3_http_backend(s3_http_client: Any) -> Iterator[Any]:
    """An S3Backend talking HTTP to moto's server on loopback (or ``S3_ENDPOINT_URL``)."""
    yield from _backend(s3_http_client)
