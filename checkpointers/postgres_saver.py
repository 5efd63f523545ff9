"""``PostgresCheckpointer``: the LangGraph checkpointer over PostgreSQL.

A drop-in for ``langgraph-checkpoint-postgres``::

    # before
    from langgraph.checkpoint.postgres import PostgresSaver
    with PostgresSaver.from_conn_string(DB_URI) as checkpointer:
        checkpointer.setup()
        graph = builder.compile(checkpointer=checkpointer)

    # after
    from checkpointers import PostgresCheckpointer
    with PostgresCheckpointer.from_conn_string(DB_URI) as checkpointer:
        checkpointer.setup()  # optional: the schema is created on first use
        graph = builder.compile(checkpointer=checkpointer)

``async with PostgresCheckpointer.from_conn_string(DB_URI) as checkpointer``
replaces ``AsyncPostgresSaver`` (``await checkpointer.asetup()``); the same
saver serves sync and async graphs. As ``PostgresSaver(conn)`` and
``AsyncPostgresSaver(conn)``, ``PostgresCheckpointer(conn)`` takes an open
psycopg ``Connection`` / ``ConnectionPool`` (sync; async calls run in a worker
thread) or ``AsyncConnection`` / ``AsyncConnectionPool`` (async only), and
never closes it. Its tables live in their own PostgreSQL
schema (``?schema=`` in the URL, default ``checkpointers``), apart from
``PostgresSaver``'s, so both can share a database while you migrate.
"""

from __future__ import annotations

from typing import Any

from .backends.postgres import Connectable, PostgresBackend
from .savers import Checkpointer, _Opening, _split

__all__ = ["PostgresCheckpointer"]


class PostgresCheckpointer(Checkpointer):
    """A checkpointer over PostgreSQL (psycopg 3, sync and async, pooled).

    ``conninfo`` is a ``postgresql://`` URL or a libpq connection string, or
    an open psycopg connection or pool (:data:`~checkpointers.backends.postgres.Connectable`;
    the saver uses it as given and never closes it).
    Keywords ``user``, ``require_user``, ``serde``, ``max_item_bytes`` (and the
    saver's other options) go to the saver, the others to
    :class:`~checkpointers.backends.postgres.PostgresBackend` (``schema``,
    ``min_size``, ``max_size``, ``timeout``, ``retry_attempts``, ``pipeline``,
    and retention: ``ttl``, ``refresh_on_read``). Thread leases
    (:meth:`~checkpointers.savers.Checkpointer.lease`) work as on every backend:
    the fence is checked in the write's own transaction.
    """

    backend: PostgresBackend

    def __init__(self, conninfo: str | Connectable = "", **options: Any) -> None:
        saver, backend_options = _split(options)
        if isinstance(conninfo, str) and conninfo.startswith(("postgresql://", "postgres://")):
            backend = PostgresBackend.from_url(conninfo, **backend_options)
        else:
            backend = PostgresBackend(conninfo, **backend_options)
        super().__init__(backend, **saver)

    @classmethod
    def from_conn_string(cls, conninfo: str, **options: Any) -> _Opening:
        """A context manager (sync or async) yielding a saver, closed on exit (as ``PostgresSaver``'s)."""
        return _Opening(lambda: cls(conninfo, **options))

    def setup(self) -> None:
        """Create or migrate the tables now (idempotent; otherwise done on first use)."""
        self.backend.migrate()

    async def asetup(self) -> None:
        """Async :meth:`setup`."""
        await self.backend.amigrate()
