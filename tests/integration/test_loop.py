"""The loop on real sockets, driven by a stand-in node: what still leaves when it stops, how a
frame sent to many connections is queued, and the cap on what a connection may have waiting."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from torch_mingle._board import Board
from torch_mingle._loop import MAX_OUTPUT_BYTES, Loop
from torch_mingle._ready import CodeFailed, Connected, ConnectionClosed, Ready
from torch_mingle._slurm import STANDBY_AFTER_S, STANDBY_CHECKS
from torch_mingle._store import StoreKeeper
from torch_mingle._view import Diagnostics

pytestmark = pytest.mark.integration


class _StandIn:
    """Just enough of a ``Node`` for the loop: it records the connects and closes, decides nothing."""

    def __init__(self) -> None:
        self.board = Board(Diagnostics(node_id="1", job="job", role="idle"))
        self.connected = threading.Event()
        self.up: set[int] = set()  # connections whose connect completed
        self.changed = threading.Condition()
        self.closed: list[tuple[int, str]] = []
        self.closed_any = threading.Event()
        self._ids = itertools.count(-1, -1)

    def conn_id(self) -> int:
        """An id for a connection the test opens, as the node numbers its own (negative)."""
        return next(self._ids)

    def step(self, inputs: list[object], now: float, *, wall_s: float | None = None) -> Ready:
        for event in inputs:
            if isinstance(event, Connected):
                with self.changed:
                    self.up.add(event.conn)
                    self.changed.notify_all()
                self.connected.set()
            elif isinstance(event, ConnectionClosed):
                self.closed.append((event.conn, event.reason))
                self.closed_any.set()
            elif isinstance(event, CodeFailed):
                raise event.exc
        return Ready()


def _connect(loop: Loop, node: _StandIn, port: int) -> int:
    conn = node.conn_id()
    loop.connect(conn, "127.0.0.1", port)
    return conn


def test_what_a_closing_connection_still_has_to_send_goes_out_when_the_loop_stops():
    """A follower's shutdown closes its connection with its close and leave frames queued, and
    stops the loop at once: a leader that reads slowly (a thousand joins at once) must still
    get them, within CLOSE_FLUSH_S."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the peer takes little at once
    loop = Loop([], keeper=StoreKeeper("127.0.0.1", "127.0.0.1"), label="[test]")
    node = _StandIn()
    loop.start(node, node.board)  # type: ignore[arg-type]
    peer: socket.socket | None = None
    try:
        conns: list[int] = []
        loop.call(lambda now: conns.append(_connect(loop, node, listener.getsockname()[1])))
        assert node.connected.wait(10), "the loop did not connect"
        listener.settimeout(10)
        peer, _ = listener.accept()
        payload = bytes(range(256)) * (24 * 1024)  # 6 MiB: more than the kernel takes while unread

        def send_and_close(now: float) -> None:
            loop.send(conns[0], payload)
            loop.close(conns[0])

        loop.call(send_and_close)
        stopper = threading.Thread(target=loop.stop)  # queued behind the close, as in shutdown()
        stopper.start()
        received = bytearray()
        peer.settimeout(10)
        while chunk := peer.recv(1 << 20):
            received += chunk
        stopper.join(15)
        assert not stopper.is_alive()
        assert len(received) == len(payload), f"{len(received)} of {len(payload)} bytes arrived"
        assert bytes(received) == payload
    finally:
        loop.stop()
        listener.close()
        if peer is not None:
            peer.close()


@contextlib.contextmanager
def _started(**loop_options: Any) -> Iterator[tuple[Loop, _StandIn, socket.socket]]:
    """A started loop with a stand-in node, and a listener whose connections take little at
    once and are never read (the peers of the loop's connections stop reading)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.settimeout(10)
    loop = Loop([], keeper=StoreKeeper("127.0.0.1", "127.0.0.1"), label="[test]", **loop_options)
    node = _StandIn()
    loop.start(node, node.board)  # type: ignore[arg-type]
    try:
        yield loop, node, listener
    finally:
        loop.stop()
        listener.close()


@pytest.fixture
def running() -> Iterator[tuple[Loop, _StandIn, socket.socket]]:
    with _started() as started:
        yield started


def _on_loop(loop: Loop, fn: Callable[[float], Any]) -> Any:
    """``fn(now)`` run on the loop's thread; its result (within 10 s)."""
    done = threading.Event()
    result: list[Any] = []

    def run(now: float) -> None:
        result.append(fn(now))
        done.set()

    loop.call(run)
    assert done.wait(10), "the loop did not run the call"
    return result[0]


def _connected(
    loop: Loop, node: _StandIn, listener: socket.socket, count: int
) -> tuple[list[int], list[socket.socket]]:
    """``count`` connections of the loop to ``listener``, established; and the peers' ends."""
    port = listener.getsockname()[1]
    conns = [_on_loop(loop, lambda now: _connect(loop, node, port)) for _ in range(count)]
    peers = [listener.accept()[0] for _ in conns]
    with node.changed:  # every connect seen by the loop: frames go out at once, not held
        assert node.changed.wait_for(lambda: node.up >= set(conns), 10), "the loop did not connect"
    return conns, peers


def test_a_frame_sent_on_many_connections_is_queued_as_that_one_object_on_each(running):
    """A round's ``members`` frame goes to every member: each connection's queue holds the
    frame itself (or a view of what is left of it), never a copy of its own."""
    loop, node, listener = running
    conns, peers = _connected(loop, node, listener, 8)
    try:
        frame = bytes(range(256)) * (24 * 1024)  # 6 MiB: more than the kernel takes while unread

        def send_all(now: float) -> list[tuple[object, int]]:
            for conn in conns:
                loop.send(conn, frame)
            heads = []
            for conn in conns:
                out = loop._streams[conn].out
                (head,) = out.chunks()
                heads.append((head.obj if isinstance(head, memoryview) else head, out.queued))
            return heads

        heads = _on_loop(loop, send_all)
        assert all(obj is frame for obj, _ in heads)
        assert all(0 < queued < len(frame) for _, queued in heads)  # partly sent, the rest waits
        assert not node.closed
    finally:
        for peer in peers:
            peer.close()


def test_a_connection_whose_peer_stops_reading_is_closed_once_more_than_the_cap_waits(running):
    """The cap counts the bytes queued, shared or not: the same frame sent again and again to a
    peer that reads nothing closes the connection once more than MAX_OUTPUT_BYTES wait."""
    loop, node, listener = running
    (conn,), peers = _connected(loop, node, listener, 1)
    try:
        frame = b"x" * (MAX_OUTPUT_BYTES // 4)

        def send_until_closed(now: float) -> int:
            for sent in range(1, 20):
                loop.send(conn, frame)
                if conn not in loop._streams:
                    return sent
            return 0

        sent = _on_loop(loop, send_until_closed)
        assert 4 <= sent < 20, f"closed after {sent} frames of {len(frame)} bytes"
        assert node.closed_any.wait(10)
        ((closed, why),) = node.closed
        assert closed == conn and "the peer stopped reading" in why and "bytes waiting" in why
    finally:
        for peer in peers:
            peer.close()


def test_only_the_connection_whose_output_stopped_moving_is_closed_at_the_write_timeout():
    """A peer that stops reading is closed once its output has not moved for write_timeout_s;
    peers that read are left alone, however much they were sent (the loop keeps the streams
    with a deadline apart, so a wake-up does not look at every connection)."""
    with _started(write_timeout_s=1.0) as (loop, node, listener):
        conns, peers = _connected(loop, node, listener, 4)
        stop_reading = threading.Event()
        received = [0] * len(peers)

        def drain(i: int) -> None:
            peers[i].settimeout(0.2)
            while not stop_reading.is_set():
                try:
                    chunk = peers[i].recv(1 << 20)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                received[i] += len(chunk)

        readers = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(1, len(peers))]
        try:
            for t in readers:
                t.start()
            frame = bytes(range(256)) * (24 * 1024)  # 6 MiB: more than the kernel takes while unread

            def send_all(now: float) -> None:
                for conn in conns:
                    loop.send(conn, frame)

            _on_loop(loop, send_all)
            assert node.closed_any.wait(10), "the unread connection was not closed"
            ((closed, why),) = node.closed
            assert closed == conns[0] and "stopped reading for 1s" in why, why
            deadline = time.monotonic() + 10
            while min(received[1:]) < len(frame) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert received[1:] == [len(frame)] * (len(peers) - 1)
            assert len(node.closed) == 1
            assert _on_loop(loop, lambda now: set(loop._timed)) == set()
        finally:
            stop_reading.set()
            for peer in peers:
                peer.close()


@pytest.mark.parametrize("heard_others", [False, True], ids=["heard-nobody", "heard-the-job"])
def test_a_slurm_node_alone_for_a_moment_keeps_to_multicast(heard_others, monkeypatch):
    """Alone at one look (a failover: no leader for a moment) after it heard the job by
    multicast, a node does not switch for good to unicasting every datagram to the node list;
    alone at STANDBY_CHECKS looks in a row, or having heard nobody, it does."""
    loop = Loop([], keeper=StoreKeeper("127.0.0.1", "127.0.0.1"), standby_peers=("s1", "s2"), label="[t]")
    alone = [True]
    loop.node = types.SimpleNamespace(  # type: ignore[assignment]
        alone=lambda: alone[0], core=types.SimpleNamespace(peers={7: object()} if heard_others else {})
    )
    started: list[bool] = []
    monkeypatch.setattr(loop, "_resolve_peers_now", lambda: started.append(True))
    monkeypatch.setattr(loop.resolver, "start", lambda: None)
    now = 0.0
    if heard_others:
        for _ in range(4):  # alone, then a leader again, and so on: never STANDBY_CHECKS in a row
            loop._use_standby_peers(now)
            alone[0] = not alone[0]
            now += STANDBY_AFTER_S
        assert loop.peer_hosts == () and not started
        alone[0] = True
        for _ in range(STANDBY_CHECKS - 1):
            loop._use_standby_peers(now)
            now += STANDBY_AFTER_S
        assert loop.peer_hosts == ()
    loop._use_standby_peers(now)
    assert loop.peer_hosts == ("s1", "s2") and started
    loop._sel.close()
    loop._wake_r.close()
    loop._wake_w.close()
