"""The Redis backend's way to the server: clients, round trips, retries.

A *transport* runs one round trip: a pipeline of commands out, their replies
back in order, error replies in place (``execute`` / ``aexecute``). There are
two, and this module is the only place that knows them:

* :class:`LeanTransport` (the default) writes each round trip with one
  ``sendall`` on a connection the backend keeps between calls, out of the
  client's pool, and the async face reads the replies straight from the
  connection's hiredis reader. It leans on redis-py internals (the
  connection's parser and stream reader/writer, ``NOT_ENOUGH_DATA``); every
  such use is in this module, behind the checks of :func:`_lean_sync` and
  :func:`_hiredis_parts`.
* :class:`StockTransport` is public redis-py only: one
  ``client.pipeline(transaction=False)`` per round trip, executed with
  ``raise_on_error=False``. It is what a Cluster always uses, what
  ``transport="stock"`` selects, and what a client gets when the lean path
  cannot be used (no hiredis, internals not where expected): that choice is
  made once per client, when it connects, never per call.

:class:`Link` sits above them: it owns the clients (made from the URL on
first use, one async client per event loop), picks each client's transport,
and runs every round trip under the backend's bounded retry (the driver's own
retry is off: it would multiply ours) and the script cache protocol
(``EVALSHA``; on ``NOSCRIPT`` the round trip is sent again with ``EVAL``,
which on a standalone server also reloads the other scripts). Both transports
go through it, so they behave the same; the tests run on both. See
``docs/redis.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import os
import random
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

try:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.cluster
    import redis.exceptions as rex
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Redis backend needs redis-py: pip install 'checkpointers[redis]'") from exc
try:
    from hiredis import Reader as _HiredisReader
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - depends on the environment
    _HiredisReader = _hiredis_pack = None  # type: ignore[assignment,misc]
try:
    from hiredis import PushNotification as _Push  # RESP3 push messages (hiredis >= 3.2)
except ImportError:  # pragma: no cover - depends on the environment
    _Push = None  # type: ignore[assignment,misc]
try:
    # what redis-py's hiredis readers return while a reply is incomplete
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - depends on the redis-py version
    _NOT_ENOUGH_DATA = None
if sys.version_info >= (3, 11):
    from asyncio import timeout as _atimeout
else:  # pragma: no cover - redis-py requires async-timeout before 3.11.3
    from async_timeout import timeout as _atimeout

from ..errors import BackendUnavailableError

__all__ = [
    "DRIVER_ERRORS",
    "TRANSIENT_ERRORS",
    "TRANSPORTS",
    "Eval",
    "LeanTransport",
    "Link",
    "Script",
    "StockTransport",
    "Transport",
    "is_transient",
    "translate_errors",
]

#: The ``transport=`` options: ``lean`` (falls back to ``stock`` per client) or ``stock``.
TRANSPORTS = ("lean", "stock")

#: Driver errors worth retrying: the next attempt may well succeed.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    rex.ConnectionError,
    rex.TimeoutError,
    rex.TryAgainError,
    rex.ClusterError,  # CLUSTERDOWN, MASTERDOWN, exhausted redirections
    rex.ReadOnlyError,  # we reached a replica during a fail-over
    rex.AskError,  # MOVED/ASK that escaped the cluster client during resharding
    rex.SlotNotCoveredError,
    rex.InvalidResponse,  # a connection left in a broken state
)
#: Connection errors that a retry cannot fix.
_PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    rex.AuthenticationError,
    rex.AuthorizationError,
    rex.ExternalAuthProviderError,
)
#: Everything the driver raises on its own account.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    rex.RedisError,
    rex.RedisClusterException,
    rex.ChildDeadlockedError,
    rex.IncorrectPolicyType,
)


@contextlib.contextmanager
def translate_errors(what: str = "redis") -> Iterator[None]:
    """Turn every redis-py exception into :class:`BackendUnavailableError`.

    The driver's exception is chained as ``__cause__``. This is the only place
    the backend maps driver errors; the retry loop runs inside it.
    """
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise BackendUnavailableError(
            f"{what}: {type(exc).__name__}: {exc}. Check that the Redis server is "
            f"reachable and healthy; transient errors were retried."
        ) from exc


def is_transient(exc: BaseException) -> bool:
    """Whether a driver error may go away on its own (and is worth a retry)."""
    return isinstance(exc, TRANSIENT_ERRORS) and not isinstance(exc, _PERMANENT_ERRORS)


def kept_in_place(reply: BaseException) -> bool:
    """Whether an error reply is data, not an outage: ``WRONGTYPE`` (a key holding another type).

    The round trip returns it in place for the caller to report; every other
    error reply is raised (and retried if transient).
    """
    return isinstance(reply, rex.ResponseError) and str(reply).startswith("WRONGTYPE")


# -- scripts -------------------------------------------------------------------


@dataclass(frozen=True)
class Script:
    """A Lua script; run with ``EVALSHA`` and re-sent with ``EVAL`` on ``NOSCRIPT``."""

    source: str

    @functools.cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


@dataclass(frozen=True)
class Eval:
    """One script invocation inside a round trip."""

    script: Script
    keys: Sequence[str]
    args: Sequence[bytes | str | int]


#: One command (``("HGET", key, field)``) or one script call.
Command = tuple[Any, ...] | Eval
#: A command as redis-py sends it.
Wire = tuple[Any, ...]


# -- transports ------------------------------------------------------------------


class Transport(Protocol):
    """One round trip at a time over one redis-py client (the sync or an async one)."""

    kind: str

    def execute(self, wire: Sequence[Wire]) -> list[Any]:
        """Send every command in one round trip; the replies in order, error replies in place."""

    async def aexecute(self, wire: Sequence[Wire]) -> list[Any]:
        """Async :meth:`execute` (the client is a ``redis.asyncio`` one)."""

    def release(self) -> None:
        """Hand any connection kept between calls back to the client's pool."""


class StockTransport:
    """Public redis-py only: a non-transactional pipeline per round trip."""

    kind = "stock"

    def __init__(self, client: Any) -> None:
        self.client = client

    def _pipeline(self, wire: Sequence[Wire]) -> Any:
        pipe = self.client.pipeline(transaction=False)
        for args in wire:
            pipe.execute_command(*args)
        return pipe

    def execute(self, wire: Sequence[Wire]) -> list[Any]:
        return self._pipeline(wire).execute(raise_on_error=False)  # type: ignore[no-any-return]

    async def aexecute(self, wire: Sequence[Wire]) -> list[Any]:
        return await self._pipeline(wire).execute(raise_on_error=False)  # type: ignore[no-any-return]

    def release(self) -> None:
        pass


class LeanTransport:
    """One packed write per round trip on a connection kept out of the pool.

    What ``pipeline(transaction=False).execute(raise_on_error=False)`` does for
    a standalone client, without the pipeline object: the same packing (sent
    with one ``sendall``, not one per large argument), reply parsing and
    callbacks, error replies returned in place. A connection that failed
    mid-way is dropped, never reused.

    Connections stay checked out of the client's pool between calls, on
    ``idle`` (a LIFO shared by the threads; ``pop``/``append`` are atomic):
    ``pool.get_connection()``/``release()`` cost a lock, metrics and events
    per round trip, several times the rest of the client's work for a small
    write. What the pool checks before handing out a connection is done here
    too: same process, nothing unread, else reconnect. :meth:`release` hands
    them back. Only for a client the backend created (``owned``): a client
    passed in may share a bounded pool with the rest of the application,
    which must not find it drained, so it gets each connection back after
    every round trip.
    """

    kind = "lean"

    def __init__(self, client: Any, owned: bool, sync: bool) -> None:
        self.client = client
        self.pool = client.connection_pool
        self.owned = owned
        self.sync = sync
        #: Idle connections held out of the pool (only for an ``owned`` client).
        self.idle: list[Any] = []
        if sync:  # never closed: back to the pool (async ones close with their loop's client)
            weakref.finalize(self, _release_idle, self.pool, self.idle)

    def release(self) -> None:
        if self.sync:
            _release_idle(self.pool, self.idle)

    def _connection(self) -> Any:
        """A connection for one round trip (sync): an idle one, else the pool's."""
        pid = os.getpid()
        while True:
            try:
                conn = self.idle.pop()
            except IndexError:
                return self.pool.get_connection()
            if conn.pid != pid:
                continue  # inherited from the parent process: never touch its socket
            try:
                stale = conn.can_read()  # closed by the server, or a stray reply
            except (rex.ConnectionError, rex.TimeoutError, OSError):
                stale = True
            if stale:
                conn.disconnect()  # the send reconnects
            return conn

    def execute(self, wire: Sequence[Wire]) -> list[Any]:
        pool, client = self.pool, self.client
        conn = self._connection()
        try:
            conn.send_packed_command(_pack(conn, wire))
            replies = _sync_replies(conn, client, wire)
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        if self.owned:
            self.idle.append(conn)
        else:
            pool.release(conn)
        return replies

    async def aexecute(self, wire: Sequence[Wire]) -> list[Any]:
        """Async :meth:`execute`; the replies are read from the connection's hiredis reader."""
        pool, client, idle = self.pool, self.client, self.idle
        try:
            conn = idle.pop()
        except IndexError:
            conn = await pool.get_connection()
        else:
            try:  # what the pool checks: closed by the server, or a stray reply
                stale = await conn.can_read()
            except (rex.ConnectionError, rex.TimeoutError, OSError):
                stale = True
            if stale:
                await conn.disconnect()  # reconnected below
        try:
            if not conn.is_connected:
                await conn.connect()  # before reading the parser: it is set up on connect
            replies: list[Any] = []
            await _async_round_trip(conn, _pack(conn, wire), replies, len(wire))
            for i, args in enumerate(wire):
                reply = _callback(client, args[0], replies[i])
                replies[i] = await reply if inspect.isawaitable(reply) else reply
        except BaseException:
            await conn.disconnect()
            await pool.release(conn)
            raise
        if self.owned:
            idle.append(conn)
        else:
            await pool.release(conn)
        return replies


def _sync_replies(conn: Any, client: Any, wire: Sequence[Wire]) -> list[Any]:
    """The replies of ``wire``, sent on the sync connection ``conn``, error replies in place.

    Read straight from the connection's hiredis reader when it has one (what
    its parser's ``read_response`` does, per round trip instead of per reply:
    each ``client.parse_response`` also passes through the connection's
    ``read_response``, which formats the host for an error message it may
    never raise; callgrind: 1,288k -> 1,255-1,268k client instructions per
    put + put_writes); else ``client.parse_response`` per reply.
    """
    parser = conn._parser
    reader = getattr(parser, "_reader", None)
    replies: list[Any] = []
    if (
        reader.__class__ is not _HiredisReader
        or _NOT_ENOUGH_DATA is None
        or (_Push is None and conn.protocol not in (2, "2"))  # RESP3 pushes it cannot tell from replies
    ):
        for args in wire:
            try:
                replies.append(client.parse_response(conn, args[0]))
            except rex.ResponseError as exc:
                replies.append(exc)
        return replies
    pushes: list[Any] = []
    try:
        while not _collect_replies(reader, replies, len(wire), pushes):
            parser.read_from_socket()  # redis-py's TimeoutError / ConnectionError (closed)
    except OSError as exc:  # what the connection's read_response makes of it
        raise rex.ConnectionError(f"Error while reading from socket: {exc.args}") from exc
    if conn.health_check_interval:
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    for push in pushes:
        parser.handle_push_response(push)
    return [_callback(client, args[0], reply) for args, reply in zip(wire, replies, strict=True)]


def _lean_sync(client: Any) -> bool:
    """Whether :class:`LeanTransport` can drive this sync standalone client."""
    pool = getattr(client, "connection_pool", None)
    conn_class = getattr(pool, "connection_class", None)
    return (
        callable(getattr(client, "parse_response", None))
        and all(callable(getattr(pool, name, None)) for name in ("get_connection", "release"))
        and all(callable(getattr(conn_class, name, None)) for name in _CONNECTION_METHODS)
    )


_CONNECTION_METHODS = ("send_packed_command", "pack_commands", "can_read", "disconnect")


async def _lean_async(client: Any) -> bool:
    """Whether :class:`LeanTransport` can drive this async standalone client.

    Opens (or takes) one connection of its pool to look at its parser, then
    hands it back: see :func:`_hiredis_parts`.
    """
    pool: Any = getattr(client, "connection_pool", None)
    if (
        _NOT_ENOUGH_DATA is None
        or _HiredisReader is None
        or not hasattr(client, "response_callbacks")
        or not all(callable(getattr(pool, name, None)) for name in ("get_connection", "release"))
    ):
        return False
    conn = await pool.get_connection()
    try:
        if not conn.is_connected:
            await conn.connect()
        return _hiredis_parts(conn) is not None
    finally:
        await pool.release(conn)


def _pack(conn: Any, wire: Sequence[Wire]) -> list[bytes]:
    """``wire`` as one buffer for ``conn.send_packed_command`` (one ``sendall``).

    With hiredis, every command is packed by ``hiredis.pack_command`` in one
    pass, as redis-py's sync hiredis serializer does (utf-8 for ``str``), minus
    its per-argument checks; redis-py's own packing is the fallback.
    """
    if _hiredis_pack is not None:
        try:
            return [b"".join(map(_hiredis_pack, wire))]
        except TypeError:
            pass  # an argument type only redis-py converts (bytearray, ...)
    packed: list[bytes] = conn.pack_commands(wire)
    return packed if len(packed) == 1 else [b"".join(packed)]


def _hiredis_parts(conn: Any) -> tuple[Any, Any, asyncio.StreamReader, asyncio.StreamWriter] | None:
    """``(parser, hiredis reader, stream reader, stream writer)`` of a
    connected ``redis.asyncio`` connection whose replies this module may read
    itself, else ``None``.

    That is a connection parsing with hiredis, as ``redis[hiredis]`` gives.
    Anything else (the pure-Python parser, a hiredis too old to mark RESP3
    push messages, a redis-py whose internals moved) gets the stock transport.
    """
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    stream, writer = getattr(conn, "_reader", None), getattr(conn, "_writer", None)
    if (
        _NOT_ENOUGH_DATA is None
        or _HiredisReader is None
        or not isinstance(reader, _HiredisReader)
        or (_Push is None and getattr(conn, "protocol", None) not in (2, "2"))
        or not hasattr(parser, "handle_push_response")
        or not isinstance(stream, asyncio.StreamReader)
        or not isinstance(writer, asyncio.StreamWriter)
    ):
        return None
    return parser, reader, stream, writer


async def _async_round_trip(conn: Any, packed: list[bytes], replies: list[Any], want: int) -> None:
    """Send ``packed`` on a connected ``redis.asyncio`` connection and read ``want`` replies.

    What ``send_packed_command`` and ``parse_response`` per reply do
    (health check, ``socket_timeout``, error replies, RESP3 push messages
    to the parser's handler; the caller connects), with one timeout for
    the whole round trip and no task: redis-py (with a ``socket_timeout``,
    which the backend always sets) runs each send in a task of its own
    (``asyncio.wait_for``) and arms a timer per reply, so a small write
    took five event-loop turns instead of two, and about a third more
    client CPU (145 vs 93, 194 vs 144, 266 vs 180 µs in three runs, each
    the medians of 10 interleaved rounds of 1,000 writes).
    """
    if conn.health_check_interval:
        await conn.check_health()
    parser = conn._parser
    reader, stream, writer = parser._reader, conn._reader, conn._writer
    pushes: list[Any] = []
    try:
        async with _atimeout(conn.socket_timeout):
            writer.writelines(packed)
            await writer.drain()
            while not _collect_replies(reader, replies, want, pushes):
                chunk = await stream.read(65536)
                if not chunk:
                    raise rex.ConnectionError("Connection closed by server.")
                reader.feed(chunk)
            for push in pushes:
                await parser.handle_push_response(push)
    except asyncio.TimeoutError as exc:
        raise rex.TimeoutError("Timeout reading from or writing to socket") from exc
    except OSError as exc:
        raise rex.ConnectionError(f"Error while reading from or writing to socket: {exc.args}") from exc


def _collect_replies(reader: Any, replies: list[Any], want: int, pushes: list[Any]) -> bool:
    """Move the complete replies buffered in ``reader`` to ``replies``; whether all ``want`` are there.

    As redis-py's parsers do: an error reply is its exception, returned in
    place, except a connection-level one (``LOADING`` and the like), raised;
    a RESP3 push message is no reply: it goes to ``pushes``, for the parser's
    push handler.
    """
    while len(replies) < want:
        reply = reader.gets()
        if reply is _NOT_ENOUGH_DATA:
            return False
        if isinstance(reply, rex.ConnectionError):
            raise reply
        if isinstance(reply, list) and reply and isinstance(reply[0], rex.ConnectionError):
            raise reply[0]
        if _Push is not None and isinstance(reply, _Push):
            pushes.append(reply)
        else:
            replies.append(reply)
    return True


def _callback(client: Any, command: Any, reply: Any) -> Any:
    """``reply`` as ``client.parse_response`` returns it (the client's response callback applied)."""
    if isinstance(reply, BaseException):
        return reply
    callback = client.response_callbacks.get(command)
    return reply if callback is None else callback(reply)


def _release_idle(pool: Any, idle: list[Any]) -> None:
    """Hand idle sync connections back to their pool (this process's only)."""
    pid = os.getpid()
    while True:
        try:
            conn = idle.pop()
        except IndexError:
            return
        if getattr(conn, "pid", pid) == pid:
            pool.release(conn)


async def _loop_guard(client: Any) -> AsyncIterator[None]:
    """Close ``client`` when its event loop shuts down.

    A loop finalizes the async generators started in it before it closes
    (``loop.shutdown_asyncgens()``, called by ``asyncio.run`` and
    ``asyncio.Runner``), which runs this ``finally`` while the loop can still
    close the connections.
    """
    try:
        yield
    finally:
        with contextlib.suppress(*DRIVER_ERRORS, RuntimeError):
            await client.aclose()


# -- the link: clients, transports, retries, scripts ------------------------------


@dataclass
class _Client:
    """A client and the transport chosen for it (``None`` until it first connects)."""

    client: Any
    owned: bool
    transport: Transport | None = None
    guard: AsyncIterator[None] | None = None  #: closes an async client with its loop


class Link:
    """The clients of one backend and every round trip it makes.

    ``url`` + ``options`` make the clients this link owns (the sync one on
    first use, one async client per event loop, since ``redis.asyncio``
    connections belong to the loop that opened them); ``client`` / ``aclient``
    are clients passed in, used as they are and never closed here.
    ``scripts``: every script the backend runs, reloaded together when the
    server lost its script cache (standalone only).
    """

    def __init__(
        self,
        *,
        url: str | None,
        options: dict[str, Any],
        cluster: bool,
        client: Any,
        aclient: Any,
        transport: str,
        scripts: Sequence[Script],
        retry_attempts: int,
        retry_backoff: float,
        retry_backoff_max: float,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        self.url, self.options, self.cluster, self.transport = url, options, cluster, transport
        self.scripts = tuple(scripts)
        self.retry_attempts = retry_attempts
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = retry_backoff_max
        #: Round trips sent (failed attempts included: a pipeline or script counts once).
        self.round_trips = 0
        #: Attempts that failed with a transient error and were retried.
        self.retries = 0
        self._sync = None if client is None else self._sync_client(client, owned=False)
        self._auser = None if aclient is None else _Client(aclient, owned=False)
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Client] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    # -- clients and their transports --------------------------------------------

    def client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"socket_timeout": 10.0, "socket_connect_timeout": 5.0}
        if not self.cluster:
            kwargs["retry"] = Retry(NoBackoff(), 0)  # our loop retries: the driver's would multiply it
        kwargs.update(self.options)
        kwargs["decode_responses"] = False
        return kwargs

    def _sync_client(self, client: Any, owned: bool) -> _Client:
        """``client`` with its transport, chosen once: lean where it can run, else stock."""
        lean = self.transport == "lean" and not self.cluster and _lean_sync(client)
        return _Client(client, owned, LeanTransport(client, owned, sync=True) if lean else StockTransport(client))

    def _sync_entry(self) -> _Client:
        entry = self._sync
        if entry is None:
            if self.url is None:
                raise RuntimeError(
                    "this RedisBackend has only an async client: use the a-prefixed methods, "
                    "or pass client= (a redis.Redis) too"
                )
            with self._lock:
                if self._sync is None:
                    kind = redis.cluster.RedisCluster if self.cluster else redis.Redis
                    with translate_errors("connecting to Redis"):
                        client = kind.from_url(self.url, **self.client_kwargs())
                    self._sync = self._sync_client(client, owned=True)
                entry = self._sync
        return entry

    def sync_client(self) -> Any:
        """The sync client (made on first use)."""
        return self._sync_entry().client

    def sync_transport(self) -> Transport:
        """The sync client's transport."""
        return self._sync_entry().transport  # type: ignore[return-value]

    async def _async_entry(self) -> _Client:
        if self._auser is not None:
            return self._auser
        if self.url is None:
            raise RuntimeError(
                "this RedisBackend has only a sync client: use the sync methods, or pass "
                "aclient= (a redis.asyncio.Redis) too"
            )
        loop = asyncio.get_running_loop()
        entry = self._aclients.get(loop)
        if entry is None:
            kind = redis.asyncio.cluster.RedisCluster if self.cluster else redis.asyncio.Redis
            client = kind.from_url(self.url, **self.client_kwargs())
            guard = _loop_guard(client)
            await guard.__anext__()
            entry = self._aclients[loop] = _Client(client, owned=True, guard=guard)
        return entry

    async def async_client(self) -> Any:
        """The current event loop's async client (made on first use)."""
        return (await self._async_entry()).client

    async def async_transport(self) -> Transport:
        """The current loop's async client's transport, chosen when it first connects."""
        return await self._async_transport(await self._async_entry())

    async def _async_transport(self, entry: _Client) -> Transport:
        if entry.transport is None:
            lean = self.transport == "lean" and not self.cluster and await _lean_async(entry.client)
            if entry.transport is None:  # another task may have chosen meanwhile
                chosen = LeanTransport(entry.client, entry.owned, sync=False) if lean else StockTransport(entry.client)
                entry.transport = chosen
        return entry.transport

    def close(self) -> None:
        """Close the clients this link made (idempotent); see ``RedisBackend.close``."""
        entry = self._sync
        if entry is not None:
            if entry.transport is not None:
                entry.transport.release()
            if entry.owned:
                self._sync = None
                with contextlib.suppress(*DRIVER_ERRORS):
                    entry.client.close()
        for loop, aentry in list(self._aclients.items()):
            if not loop.is_closed() and not loop.is_running():
                del self._aclients[loop]
                loop.run_until_complete(aentry.guard.aclose())  # type: ignore[union-attr]

    async def aclose(self) -> None:
        """:meth:`close`, the current loop's async client included."""
        self.close()
        entry = self._aclients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry.guard.aclose()  # type: ignore[union-attr]

    # -- round trips ------------------------------------------------------------------

    def call(self, commands: Sequence[Command]) -> tuple[list[Any], bool]:
        """One round trip's replies (retried as needed) and whether an earlier attempt failed.

        Every error reply is raised except those :func:`kept_in_place`.
        """
        with translate_errors("redis"):
            attempt = 0
            while True:
                try:
                    for use_sha in (True, False):
                        transport = (self._sync or self._sync_entry()).transport
                        self.round_trips += 1  # an attempt counts, even if connecting fails
                        replies = transport.execute(self._wire(commands, use_sha))  # type: ignore[union-attr]
                        if self._complete(replies, len(commands), use_sha):
                            return replies[: len(commands)], attempt > 0 or not use_sha
                except DRIVER_ERRORS as exc:
                    time.sleep(self._delay(exc, attempt))
                    attempt += 1

    async def acall(self, commands: Sequence[Command]) -> tuple[list[Any], bool]:
        """Async :meth:`call`."""
        with translate_errors("redis"):
            attempt = 0
            while True:
                try:
                    for use_sha in (True, False):
                        entry = await self._async_entry()
                        self.round_trips += 1  # an attempt counts, even if connecting fails
                        transport = entry.transport or await self._async_transport(entry)
                        replies = await transport.aexecute(self._wire(commands, use_sha))
                        if self._complete(replies, len(commands), use_sha):
                            return replies[: len(commands)], attempt > 0 or not use_sha
                except DRIVER_ERRORS as exc:
                    await asyncio.sleep(self._delay(exc, attempt))
                    attempt += 1

    def _wire(self, commands: Sequence[Command], use_sha: bool) -> list[Wire]:
        """Every command as redis-py sends it, plus the script reloads an ``EVAL`` round carries."""
        wire = [_args(c, use_sha) for c in commands]
        if not use_sha and not self.cluster:
            # The server lost its script cache (restart, fail-over, FLUSH):
            # reload the other scripts on the way, so they do not each cost
            # a NOSCRIPT round trip of their own. (A cluster routes SCRIPT
            # LOAD to one node only: there each script reloads on first use.)
            used = {c.script for c in commands if isinstance(c, Eval)}
            wire += [("SCRIPT", "LOAD", script.source) for script in self.scripts if script not in used]
        return wire

    @staticmethod
    def _complete(replies: list[Any], count: int, use_sha: bool) -> bool:
        """``False`` to re-send with ``EVAL`` (a ``NOSCRIPT`` anywhere); else raise
        the first error not kept in place."""
        first = None
        for res in replies[:count]:
            if isinstance(res, BaseException):
                if use_sha and isinstance(res, rex.NoScriptError):
                    return False
                if first is None and not kept_in_place(res):
                    first = res
        if first is not None:
            raise first
        return True

    def _delay(self, exc: BaseException, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (0-based), or re-raise ``exc``."""
        if not is_transient(exc) or attempt >= self.retry_attempts:
            raise exc
        self.retries += 1
        return min(self.retry_backoff * 2.0**attempt, self.retry_backoff_max) * (0.5 + random.random() / 2)


def _args(command: Command, use_sha: bool) -> Wire:
    """The wire arguments of ``command``."""
    if isinstance(command, Eval):
        head = ("EVALSHA", command.script.sha) if use_sha else ("EVAL", command.script.source)
        return (*head, len(command.keys), *command.keys, *command.args)
    return tuple(command)
