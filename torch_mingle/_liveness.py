"""Liveness between the leader and each node: one TCP connection per node, heartbeats both ways.

A process that dies (SIGKILL included) has its sockets closed by the kernel, so the other
end sees EOF at once: node loss and leader loss are detected in milliseconds, not after a
heartbeat timeout. A host that vanishes or a cut link sends no EOF; then the missing
heartbeats (every ``interval_s``, dead after ``timeout_s``) decide.

Lines on the wire (ASCII): ``hello <node hex> <epoch>``, ``hb``, ``evicted``.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
MAX_LINE_BYTES = 128
MAX_CONNECTIONS = 4096


def _family(ip: str) -> int:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def sockaddr(ip: str, port: int) -> tuple[str, int] | tuple[str, int, int, int]:
    """A connect/bind address for ``ip`` (IPv6 with ``%scope`` resolved) and ``port``."""
    if ":" not in ip:
        return (ip, port)
    info: tuple[Any, ...] = socket.getaddrinfo(ip, port, socket.AF_INET6, socket.SOCK_STREAM)[0][4]
    return (str(info[0]), int(info[1]), int(info[2]), int(info[3]))


@dataclass
class _Conn:
    sock: socket.socket
    opened: float
    node: int | None = None
    last_heard: float = 0.0
    buf: bytearray = field(default_factory=bytearray)


class LivenessServer:
    """Runs on the leader: tracks every node's connection and reports deaths."""

    def __init__(
        self,
        ip: str,
        *,
        interval_s: float,
        timeout_s: float,
        on_dead: Callable[[int, str], None],
        label: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ip = ip
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.on_dead = on_dead
        self.label = label
        self.clock = clock
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._conns: dict[socket.socket, _Conn] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mingle-liveness-server{label}", daemon=True)
        self.port = 0

    def start(self) -> int:
        listener = socket.socket(_family(self.ip), socket.SOCK_STREAM)
        # No SO_REUSEADDR: with it, Linux may hand out the port of a TCPStore listening on the
        # wildcard address, and TCPStore clients of 127.0.0.1 would reach us instead of the store.
        listener.bind(sockaddr(self.ip, 0))
        listener.listen(256)
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._thread.start()
        return self.port

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        for sock in (self._listener, self._wake_r, self._wake_w, *self._conns):
            if sock is not None:
                sock.close()
        self._conns.clear()

    def _run(self) -> None:
        next_beat = self.clock() + self.interval_s
        while not self._stopping.is_set():
            assert self._listener is not None  # noqa: S101 - set in start()
            timeout = max(0.0, min(next_beat - self.clock(), self.interval_s))
            try:
                ready, _, _ = select.select([self._listener, self._wake_r, *self._conns], [], [], timeout)
            except (OSError, ValueError):
                break
            now = self.clock()
            for sock in ready:
                if sock is self._listener:
                    self._accept(now)
                elif sock is self._wake_r:
                    return
                else:
                    self._read(sock, now)
            if now >= next_beat:
                next_beat = now + self.interval_s
                self._beat(now)

    def _accept(self, now: float) -> None:
        assert self._listener is not None  # noqa: S101
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        if len(self._conns) >= MAX_CONNECTIONS:
            sock.close()
            return
        sock.setblocking(False)
        self._conns[sock] = _Conn(sock=sock, opened=now, last_heard=now)

    def _read(self, sock: socket.socket, now: float) -> None:
        conn = self._conns.get(sock)
        if conn is None:
            return
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(conn, f"connection error: {exc}")
            return
        if not data:
            self._drop(conn, "connection closed (process exited or was killed)")
            return
        conn.last_heard = now
        conn.buf += data
        while b"\n" in conn.buf:
            line, _, rest = bytes(conn.buf).partition(b"\n")
            conn.buf = bytearray(rest)
            self._line(conn, line.decode("ascii", "replace").split())
        if len(conn.buf) > MAX_LINE_BYTES:
            self._drop(conn, "protocol error: line too long")

    def _line(self, conn: _Conn, words: list[str]) -> None:
        if words[:1] == ["hello"] and len(words) >= 2 and conn.node is None:
            try:
                node = int(words[1], 16)
            except ValueError:
                return
            for other in list(self._conns.values()):
                if other is not conn and other.node == node:
                    other.node = None  # superseded by the new connection: not a death
                    self._close(other)
            conn.node = node

    def _beat(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if conn.node is None:
                if now - conn.opened > HELLO_TIMEOUT_S:
                    self._close(conn)
                continue
            if now - conn.last_heard > self.timeout_s:
                with contextlib.suppress(OSError):
                    conn.sock.send(b"evicted\n")
                self._drop(conn, f"no heartbeat for {self.timeout_s:g}s")
                continue
            try:
                conn.sock.send(b"hb\n")
            except OSError as exc:
                self._drop(conn, f"connection error: {exc}")

    def _close(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock, None)
        conn.sock.close()

    def _drop(self, conn: _Conn, reason: str) -> None:
        self._close(conn)
        if conn.node is not None:
            try:
                self.on_dead(conn.node, reason)
            except Exception:
                log.exception("%s reporting the death of node %016x failed", self.label, conn.node)


class LivenessClient:
    """Runs on every node (the leader's too): heartbeats to the leader, and notices its loss."""

    def __init__(
        self,
        ip: str,
        port: int,
        *,
        node: int,
        epoch: int,
        interval_s: float,
        timeout_s: float,
        on_lost: Callable[[str, bool], None],
        on_heartbeat: Callable[[], None] | None = None,
        label: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.addr = (ip, port)
        self.node = node
        self.epoch = epoch
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.on_lost = on_lost
        self.on_heartbeat = on_heartbeat
        self.label = label
        self.clock = clock
        self._sock: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mingle-liveness{label}", daemon=True)

    def start(self, connect_timeout_s: float) -> None:
        """Connect and say hello; raises ``OSError`` if the leader cannot be reached."""
        ip, port = self.addr
        sock = socket.socket(_family(ip), socket.SOCK_STREAM)
        sock.settimeout(connect_timeout_s)
        try:
            sock.connect(sockaddr(ip, port))
            sock.sendall(f"hello {self.node:016x} {self.epoch}\n".encode())
        except OSError:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self._sock = sock
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        for sock in (self._sock, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None  # noqa: S101 - set in start()
        last_heard = self.clock()
        next_beat = last_heard + self.interval_s
        buf = b""
        while not self._stopping.is_set():
            now = self.clock()
            timeout = max(0.0, min(next_beat, last_heard + self.timeout_s) - now)
            try:
                ready, _, _ = select.select([sock, self._wake_r], [], [], timeout)
            except (OSError, ValueError):
                return
            if self._wake_r in ready or self._stopping.is_set():
                return
            now = self.clock()
            if sock in ready:
                try:
                    data = sock.recv(4096)
                except (BlockingIOError, InterruptedError):
                    data = b"-"
                except OSError as exc:
                    self._lost(f"connection to the leader failed: {exc}", evicted=False)
                    return
                if not data:
                    self._lost(
                        "the leader closed its connection (its process exited or was killed)", evicted=False
                    )
                    return
                last_heard = now
                buf = (buf + data)[-MAX_LINE_BYTES:]
                if b"evicted\n" in buf:
                    self._lost("the leader declared this node dead (missed heartbeats)", evicted=True)
                    return
                if self.on_heartbeat is not None:
                    self.on_heartbeat()
            if now - last_heard > self.timeout_s:
                self._lost(f"no heartbeat from the leader for {self.timeout_s:g}s", evicted=False)
                return
            if now >= next_beat:
                next_beat = now + self.interval_s
                try:
                    sock.send(b"hb\n")
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as exc:
                    self._lost(f"connection to the leader failed: {exc}", evicted=False)
                    return

    def _lost(self, reason: str, *, evicted: bool) -> None:
        if self._stopping.is_set():
            return
        try:
            self.on_lost(reason, evicted)
        except Exception:
            log.exception("%s liveness callback failed", self.label)
