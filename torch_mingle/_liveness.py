"""Liveness between the leader and each node: one TCP connection per node, heartbeats both ways.

A process that dies (SIGKILL included) has its sockets closed by the kernel, so the other
end sees EOF at once: node loss and leader loss are detected in milliseconds, not after a
heartbeat timeout. A host that freezes or vanishes, or a cut link, sends no EOF; then the
missing heartbeats (every ``interval_s``, dead after ``timeout_s``) decide.

The same connection carries the leader's job status to every node as it changes, so the
agent's frequent ``num_nodes_waiting()`` polls are answered locally and never block on a
leader that stopped answering.

Lines on the wire (ASCII): node to leader ``hello <node hex> <epoch>`` and ``hb``; leader
to node ``hb``, ``status <json>`` and ``evicted``.
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
MAX_LINE_BYTES = 4096
MAX_PENDING_OUT_BYTES = 64 * 1024
MAX_CONNECTIONS = 4096


def ip_family(ip: str) -> int:
    """AF_INET6 or AF_INET for an address literal (a wildcard, or IPv6 with ``%scope``, included)."""
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def sockaddr(ip: str, port: int) -> tuple[str, int] | tuple[str, int, int, int]:
    """A connect/bind address for ``ip`` (IPv6 with ``%scope`` resolved) and ``port``."""
    if ":" not in ip:
        return (ip, port)
    info: tuple[Any, ...] = socket.getaddrinfo(ip, port, socket.AF_INET6, socket.SOCK_STREAM)[0][4]
    return (str(info[0]), int(info[1]), int(info[2]), int(info[3]))


class _LineBuffer:
    """Splits a byte stream into lines; too long a line is a protocol error."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[str] | None:
        self._buf += data
        lines = []
        while (end := self._buf.find(b"\n")) >= 0:
            lines.append(self._buf[:end].decode("utf-8", "replace"))
            del self._buf[: end + 1]
        return None if len(self._buf) > MAX_LINE_BYTES else lines


@dataclass
class _Conn:
    sock: socket.socket
    opened: float
    node: int | None = None
    last_heard: float = 0.0
    lines: _LineBuffer = field(default_factory=_LineBuffer)
    out: bytearray = field(default_factory=bytearray)


class LivenessServer:
    """Runs on the leader: tracks every node's connection, reports deaths, pushes the status."""

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
        self._wake_r.setblocking(False)
        self._conns: dict[socket.socket, _Conn] = {}
        self._status_line = b""
        self._status_lock = threading.Lock()
        self._status_dirty = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mingle-liveness-server{label}", daemon=True)
        self.port = 0

    def start(self) -> int:
        listener = socket.socket(ip_family(self.ip), socket.SOCK_STREAM)
        # No SO_REUSEADDR: with it, Linux may hand out the port of a TCPStore listening on the
        # wildcard address, and TCPStore clients of 127.0.0.1 would reach us instead of the store.
        listener.bind(sockaddr(self.ip, 0))
        listener.listen(256)
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._thread.start()
        return self.port

    def publish(self, status_json: str) -> None:
        """Send the job status to every node now, and to every node that connects later."""
        with self._status_lock:
            self._status_line = f"status {status_json}\n".encode()
            self._status_dirty = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"s")

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

    # ------------------------------------------------------------ server thread

    def _run(self) -> None:
        listener = self._listener
        if listener is None:
            return
        next_beat = self.clock() + self.interval_s
        while not self._stopping.is_set():
            timeout = max(0.0, min(next_beat - self.clock(), self.interval_s))
            writers = [c.sock for c in self._conns.values() if c.out]
            try:
                ready, writable, _ = select.select(
                    [listener, self._wake_r, *self._conns], writers, [], timeout
                )
            except (OSError, ValueError):
                return
            now = self.clock()
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
                if self._stopping.is_set():
                    return
                self._send_status_if_new()
            for sock in ready:
                if sock is listener:
                    self._accept(listener, now)
                elif sock is not self._wake_r:
                    self._read(sock, now)
            for sock in writable:
                conn = self._conns.get(sock)
                if conn is not None:
                    self._flush(conn)
            if now >= next_beat:
                next_beat = now + self.interval_s
                self._beat(now)

    def _send_status_if_new(self) -> None:
        with self._status_lock:
            if not self._status_dirty:
                return
            self._status_dirty = False
            line = self._status_line
        for conn in list(self._conns.values()):
            if conn.node is not None:
                self._send(conn, line)

    def _accept(self, listener: socket.socket, now: float) -> None:
        try:
            sock, _ = listener.accept()
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
        lines = conn.lines.feed(data)
        if lines is None:
            self._drop(conn, "protocol error: line too long")
            return
        for line in lines:
            words = line.split()
            if words[:1] == ["hello"] and len(words) >= 2 and conn.node is None:
                self._hello(conn, words[1])

    def _hello(self, conn: _Conn, node_hex: str) -> None:
        try:
            node = int(node_hex, 16)
        except ValueError:
            return
        for other in list(self._conns.values()):
            if other is not conn and other.node == node:
                other.node = None  # superseded by the new connection: not a death
                self._close(other)
        conn.node = node
        with self._status_lock:
            line = self._status_line
        if line:
            self._send(conn, line)

    def _beat(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if conn.node is None:
                if now - conn.opened > HELLO_TIMEOUT_S:
                    self._close(conn)
                continue
            if now - conn.last_heard > self.timeout_s:
                self._send(conn, b"evicted\n")
                self._drop(conn, f"no heartbeat for {self.timeout_s:g}s")
                continue
            self._send(conn, b"hb\n")

    def _send(self, conn: _Conn, data: bytes) -> None:
        conn.out += data
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._drop(conn, f"connection error: {exc}")
            return
        del conn.out[:sent]
        if len(conn.out) > MAX_PENDING_OUT_BYTES:
            self._drop(conn, "the node stopped reading its connection")

    def _close(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock, None)
        conn.sock.close()

    def _drop(self, conn: _Conn, reason: str) -> None:
        if conn.sock not in self._conns:
            return
        self._close(conn)
        if conn.node is not None:
            try:
                self.on_dead(conn.node, reason)
            except Exception:
                log.exception("%s reporting the death of node %016x failed", self.label, conn.node)


class LivenessClient:
    """Runs on every node (the leader's too): heartbeats to the leader, its status, and its loss."""

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
        #: The leader's latest ``status`` JSON (the ``Status`` of ``_rounds``), or None so far.
        self.status_json: str | None = None
        self._sock: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mingle-liveness{label}", daemon=True)

    def start(self, connect_timeout_s: float) -> None:
        """Connect and say hello; raises ``OSError`` if the leader cannot be reached."""
        ip, port = self.addr
        sock = socket.socket(ip_family(ip), socket.SOCK_STREAM)
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
        if sock is None:
            return
        last_heard = self.clock()
        next_beat = last_heard + self.interval_s
        lines = _LineBuffer()
        while not self._stopping.is_set():
            timeout = max(0.0, min(next_beat, last_heard + self.timeout_s) - self.clock())
            try:
                ready, _, _ = select.select([sock, self._wake_r], [], [], timeout)
            except (OSError, ValueError):
                return
            if self._wake_r in ready or self._stopping.is_set():
                return
            now = self.clock()
            if sock in ready:
                why = self._receive(sock, lines)
                if why is not None:
                    self._lost(*why)
                    return
                last_heard = now
            if now - last_heard > self.timeout_s:
                self._lost(f"no heartbeat from the leader for {self.timeout_s:g}s", False)
                return
            if now >= next_beat:
                next_beat = now + self.interval_s
                try:
                    sock.send(b"hb\n")
                except (BlockingIOError, InterruptedError):
                    pass  # the leader is not reading: its own silence will time out
                except OSError as exc:
                    self._lost(f"connection to the leader failed: {exc}", False)
                    return

    def _receive(self, sock: socket.socket, lines: _LineBuffer) -> tuple[str, bool] | None:
        """Read what the leader sent; returns (reason, evicted) when the connection is over."""
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            return f"connection to the leader failed: {exc}", False
        if not data:
            return "the leader closed its connection (its process exited or was killed)", False
        parsed = lines.feed(data)
        if parsed is None:
            return "protocol error from the leader: line too long", False
        for line in parsed:
            if line == "evicted":
                return "the leader declared this node dead (missed heartbeats)", True
            if line.startswith("status "):
                self.status_json = line[len("status ") :]
        if self.on_heartbeat is not None:
            self.on_heartbeat()
        return None

    def _lost(self, reason: str, evicted: bool) -> None:
        if self._stopping.is_set():
            return
        try:
            self.on_lost(reason, evicted)
        except Exception:
            log.exception("%s liveness callback failed", self.label)
