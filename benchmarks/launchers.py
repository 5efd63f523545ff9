"""The launchers of the services the benchmarks and the tests talk to, on loopback only.

* :func:`free_port` — a TCP port nobody listens on at 127.0.0.1 right now.
* :class:`RedisServer` — one throwaway ``redis-server`` process (no persistence).
* :class:`MotoServer` — moto's ``ThreadedMotoServer`` (S3 over real HTTP).

Standard library only at import time (moto is imported when a server starts), so
``tests/plugins`` and ``tests/langgraph_suite`` can import them without the
benchmarks' dependencies; there is no other copy of these launchers to keep.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MotoServer", "RedisServer", "free_port"]


def free_port(with_bus: bool = False) -> int:
    """A TCP port nobody listens on at 127.0.0.1 right now (``with_bus``: port + 10000 too, for a cluster node)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not with_bus:
            return port
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free loopback port found")


#: How long :meth:`RedisServer.start` waits for ``PING`` to be answered.
_START_TIMEOUT = 15.0


@dataclass
class RedisServer:
    """One ``redis-server`` process on 127.0.0.1, persistence off, logging to ``directory``.

    ``args`` are appended to the command line (a later option wins, so
    ``["--appendonly", "yes"]`` turns the append-only file on). ``start``
    waits until the server answers ``PING``; calling it again after
    :meth:`kill` or :meth:`stop` restarts it on the same port and directory.
    """

    directory: Path
    port: int
    args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
            *self.args,
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server on port {self.port} exited: {log}")
            if self.ping():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING")
            time.sleep(0.05)

    def ping(self) -> bool:
        """Whether the server answers ``PING`` (not while it is still loading its data)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def cli(self, *args: str) -> str:
        """``redis-cli`` on this server; its output."""
        out = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return out.stdout.decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final save."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


class MotoServer:
    """moto's ``ThreadedMotoServer`` (S3 over real HTTP) on a loopback port, in this process.

    ``port`` defaults to a free one. ``wrap`` wraps moto's WSGI app, as the
    benchmarks' request counter does (:class:`_CountingApp`).
    """

    def __init__(self, port: int | None = None, wrap: Callable[[Any], Any] | None = None) -> None:
        self.port = free_port() if port is None else port
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._wrap = wrap
        self._server: Any = None

    def start(self) -> MotoServer:
        from moto.server import ThreadedMotoServer

        kind = ThreadedMotoServer if self._wrap is None else _wrapping_moto_server(self._wrap)
        self._server = kind(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def _wrapping_moto_server(wrap: Callable[[Any], Any]) -> Any:
    """A ``ThreadedMotoServer`` whose WSGI app is ``wrap(moto's app)``."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class WrappingMotoServer(ThreadedMotoServer):  # type: ignore[misc]
        def _server_entry(self) -> None:
            app = wrap(DomainDispatcherApplication(create_backend_app))
            self._server = make_server(
                self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    return WrappingMotoServer
