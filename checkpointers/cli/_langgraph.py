"""Reading LangGraph's own savers as a migration source (or writing them as a sink).

=====================================================  ===========================================
``langgraph+sqlite:///path.db``                        a ``SqliteSaver`` file (``////`` absolute)
``langgraph+postgres://user@host:5432/db``             a ``PostgresSaver`` database (``?options=
                                                       -csearch_path%3Dschema`` for a schema)
``langgraph+plainredis://host:6379/0?prefix=lg``       ``langgraph-checkpoint-plainredis`` keys
=====================================================  ===========================================

Checkpoints are read with the saver's own ``get_tuple`` (its layout, its
channel blobs), decoded with our allowlisting serializer; threads and
checkpoint ids are paged with keyset queries (SQL) or index ranges (Redis), a
page at a time, so memory stays flat. Writes are read from the saver's table
or hash directly, because ``get_tuple`` drops their task path and index:
``SqliteSaver`` and ``PostgresSaver`` store both; the plain-Redis saver stores
the index but no task path (moved as ``""``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.base import SerializerProtocol

from ._transfer import Entry, Write

__all__ = ["SCHEMES", "LangGraphSource", "open_langgraph"]

SCHEMES = ("langgraph+sqlite", "langgraph+postgres", "langgraph+postgresql", "langgraph+plainredis")
PAGE = 256


class LangGraphSource:
    """Threads of a LangGraph saver; subclasses say how to page ids and read writes."""

    def __init__(self, saver: BaseCheckpointSaver[Any], closer: Any) -> None:
        self.saver, self._closer = saver, closer

    def threads(self) -> Iterator[str]:
        raise NotImplementedError

    def checkpoint_keys(self, thread_id: str) -> Iterator[tuple[str, str]]:
        """(namespace, checkpoint id) of every checkpoint of a thread, oldest first per namespace."""
        raise NotImplementedError

    def writes(self, thread_id: str, ns: str, cid: str) -> list[Write]:
        raise NotImplementedError

    def entries(self, thread_id: str) -> Iterator[Entry]:
        for ns, cid in self.checkpoint_keys(thread_id):
            conf = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
            found = self.saver.get_tuple({"configurable": conf})
            if found is None:
                continue
            parent = (found.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            yield Entry(
                thread_id, ns, dict(found.checkpoint), dict(found.metadata), parent, self.writes(thread_id, ns, cid)
            )

    def close(self) -> None:
        self._closer()


class _SqlSource(LangGraphSource):
    """SqliteSaver and PostgresSaver: the same keyset queries, two parameter styles."""

    mark = "?"
    checkpoints_table, writes_table, value_column = "checkpoints", "writes", "value"
    task_path = "task_path"

    def _query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _pages(self, select: str, keys: str, fixed: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
        """Rows of ``select`` in ``keys`` order, a page per query, each after the last row of the one before."""
        m = self.mark
        columns = keys.split(", ")
        after: tuple[Any, ...] | None = None
        while True:
            cond = "" if after is None else f" AND ({keys}) > ({', '.join([m] * len(columns))})"
            rows = self._query(f"{select}{cond} ORDER BY {keys} LIMIT {PAGE}", (*fixed, *(after or ())))
            yield from rows
            if len(rows) < PAGE:
                return
            after = tuple(rows[-1])

    def threads(self) -> Iterator[str]:
        select = f"SELECT DISTINCT thread_id FROM {self.checkpoints_table} WHERE TRUE"
        for (thread_id,) in self._pages(select, "thread_id", ()):
            yield str(thread_id)

    def checkpoint_keys(self, thread_id: str) -> Iterator[tuple[str, str]]:
        select = f"SELECT checkpoint_ns, checkpoint_id FROM {self.checkpoints_table} WHERE thread_id = {self.mark}"
        for ns, cid in self._pages(select, "checkpoint_ns, checkpoint_id", (thread_id,)):
            yield str(ns), str(cid)

    def writes(self, thread_id: str, ns: str, cid: str) -> list[Write]:
        m = self.mark
        rows = self._query(
            f"SELECT {self.task_path}, task_id, idx, channel, type, {self.value_column} FROM {self.writes_table} "
            f"WHERE thread_id = {m} AND checkpoint_ns = {m} AND checkpoint_id = {m} ORDER BY task_id, idx",
            (thread_id, ns, cid),
        )
        serde = self.saver.serde
        return [
            (str(path), str(task), int(idx), str(ch), serde.loads_typed((str(t), bytes(v))))
            for path, task, idx, ch, t, v in rows
        ]


class SqliteSource(_SqlSource):
    """A ``SqliteSaver`` file."""

    def __init__(self, path: str, serde: SerializerProtocol) -> None:
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        saver = SqliteSaver(self.conn, serde=serde)
        columns = {row[1] for row in self.conn.execute("PRAGMA table_info(writes)")}
        if "task_path" not in columns:  # a file from before task paths
            self.task_path = "''"
        super().__init__(saver, self.conn.close)

    def _query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return list(self.conn.execute(sql, params).fetchall())


class PostgresSource(_SqlSource):
    """A ``PostgresSaver`` database."""

    mark = "%s"
    writes_table, value_column = "checkpoint_writes", "blob"

    def __init__(self, conninfo: str, serde: SerializerProtocol) -> None:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        self.conn = psycopg.connect(conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        super().__init__(PostgresSaver(self.conn, serde=serde), self.conn.close)

    def _query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        from psycopg.rows import tuple_row

        with self.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())


class PlainRedisSource(LangGraphSource):
    """The keys of ``langgraph-checkpoint-plainredis`` under one prefix."""

    def __init__(self, url: str, prefix: str, serde: SerializerProtocol) -> None:
        import redis
        from langgraph_checkpoint_plainredis import RedisSaver

        self.client: Any = redis.Redis.from_url(url)
        self.prefix = prefix
        super().__init__(RedisSaver(self.client, prefix=prefix, serde=serde), self.client.close)
        self._timelines: dict[str, list[tuple[str, str]]] | None = None

    def _registry(self) -> dict[str, list[tuple[str, str]]]:
        """thread id -> [(namespace, timeline key)] from the ``{prefix}:threads`` hash (one entry per pair)."""
        if self._timelines is None:
            found: dict[str, list[tuple[str, str]]] = {}
            for key, raw in self.client.hscan_iter(f"{self.prefix}:threads", count=PAGE):
                info = json.loads(raw)
                found.setdefault(str(info["thread"]), []).append((str(info["ns"]), key.decode()))
            self._timelines = found
        return self._timelines

    def threads(self) -> Iterator[str]:
        yield from sorted(self._registry())

    def checkpoint_keys(self, thread_id: str) -> Iterator[tuple[str, str]]:
        for ns, key in sorted(self._registry().get(thread_id, [])):
            start = 0
            while True:
                members = self.client.zrange(key, start, start + PAGE - 1)
                yield from ((ns, m.decode()) for m in members)
                if len(members) < PAGE:
                    break
                start += PAGE

    def writes(self, thread_id: str, ns: str, cid: str) -> list[Write]:
        raw = self.client.hgetall(f"{self.prefix}:wr:{thread_id}:{ns}:{cid}")
        out: list[Write] = []
        for key, packed in raw.items():
            idx = int(key.decode().rpartition(":")[2])
            obj = json.loads(packed)
            task_id, channel, value = self.saver.serde.loads_typed((obj["t"], base64.b64decode(obj["d"])))
            out.append(("", str(task_id), idx, str(channel), value))
        return sorted(out, key=lambda w: (w[1], w[2]))


def _sqlite_path(url: str) -> str:
    parts = urlsplit(url)
    path = unquote(parts.path[1:])
    if parts.netloc or not path:
        raise ValueError(f"{url!r}: expected langgraph+sqlite:///relative.db or langgraph+sqlite:////absolute.db")
    return path


def open_langgraph(url: str, serde: SerializerProtocol) -> LangGraphSource:
    """Open a LangGraph saver URL (see the module docstring) as a read-only source."""
    parts = urlsplit(url)
    if parts.scheme == "langgraph+sqlite":
        return SqliteSource(_sqlite_path(url), serde)
    if parts.scheme in ("langgraph+postgres", "langgraph+postgresql"):
        return PostgresSource(urlunsplit(("postgresql", *parts[1:])), serde)
    if parts.scheme == "langgraph+plainredis":
        query = dict(parse_qsl(parts.query))
        prefix = query.pop("prefix", "lg")
        if query:
            raise ValueError(f"{url!r}: unknown option(s) {sorted(query)}; supported: prefix")
        return PlainRedisSource(urlunsplit(("redis", parts.netloc, parts.path, "", "")), prefix, serde)
    raise ValueError(f"{url!r} is not a LangGraph saver URL: expected one of {', '.join(s + '://' for s in SCHEMES)}")
