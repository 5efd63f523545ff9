"""Backends: one small interface (:class:`Backend`), several storages.

``open_backend(url)`` picks one from a URL:

==============================  =============================================
``memory://``                   in-process, for tests and quick starts
``sqlite:///rel/file.db``       embedded default (WAL, several processes safe);
                                ``sqlite:////abs/file.db`` for an absolute path
``redis://host:6379/0``         Redis or Valkey 7+, no modules
``s3://bucket/prefix``          S3 or any S3-compatible endpoint
                                (``?endpoint_url=http://127.0.0.1:9000``)
``postgresql://host:5432/db``   PostgreSQL (``postgres://`` too; ``?schema=``
                                names the schema holding the tables)
==============================  =============================================

Every URL also takes ``?ttl=SECONDS`` and ``?refresh_on_read=true`` (see
:class:`~checkpointers.backends.base.Retention`): retention belongs to the
backend, and a Store or checkpointer gets it through the backend it opens.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .base import (
    Backend,
    Conflict,
    Delete,
    ExpiredPartition,
    ListQuery,
    Mode,
    Put,
    Record,
    Retention,
    WriteResult,
)
from .memory import MemoryBackend

__all__ = [
    "Backend",
    "Conflict",
    "Delete",
    "ExpiredPartition",
    "ListQuery",
    "MemoryBackend",
    "Mode",
    "Put",
    "Record",
    "Retention",
    "WriteResult",
    "open_backend",
]


def open_backend(url: str, **options: Any) -> Backend:
    """Open the backend a URL names; ``options`` go to its constructor.

    Raises ``ValueError`` for an unknown scheme, naming the ones supported.
    """
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryBackend(**{**retention_options(query_options(url)), **options})
    if scheme == "sqlite":
        from .sqlite import SqliteBackend

        return SqliteBackend.from_url(url, **options)
    if scheme in ("redis", "rediss", "unix", "valkey", "valkeys"):
        from .redis import RedisBackend

        return RedisBackend.from_url(url, **options)
    if scheme == "s3":
        from .s3 import S3Backend

        return S3Backend.from_url(url, **options)
    if scheme in ("postgresql", "postgres"):
        from .postgres import PostgresBackend

        return PostgresBackend.from_url(url, **options)
    raise ValueError(
        f"unknown store URL {url!r}: expected memory://, sqlite:///path, redis://host:port/db, "
        f"s3://bucket/prefix or postgresql://host:port/db"
    )


def query_options(url: str) -> dict[str, str]:
    """The ``?key=value`` options of a store URL, as a dict."""
    return dict(parse_qsl(urlsplit(url).query))


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def url_flag(name: str, value: str) -> bool:
    """A boolean URL option (``true/false``, ``1/0``, ``yes/no``, ``on/off``).

    Anything else is refused rather than guessed, so ``?cluster=ture`` fails
    loudly instead of silently meaning ``false``.
    """
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"URL option {name}={value!r}: expected true or false")


def retention_options(options: dict[str, Any]) -> dict[str, Any]:
    """``ttl`` (seconds) and ``refresh_on_read`` of a URL's options, converted; the rest dropped.

    ``?ttl=`` must be a number (``?ttl=3600``, ``?ttl=0.5``); an empty or
    non-numeric value is refused naming ``ttl``.
    """
    from ..errors import InvalidArgumentError

    out: dict[str, Any] = {}
    if "ttl" in options:
        raw = options["ttl"]
        try:
            out["ttl"] = float(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise InvalidArgumentError("ttl", f"URL option ttl={raw!r}: expected a number of seconds") from None
    if "refresh_on_read" in options:
        raw = options["refresh_on_read"]
        out["refresh_on_read"] = url_flag("refresh_on_read", raw) if isinstance(raw, str) else raw
    return out
