"""The loop on real sockets, driven by a stand-in node: what still leaves when it stops."""

from __future__ import annotations

import socket
import threading
import types

import pytest

from torch_mingle._loop import Loop
from torch_mingle._node import Board, Diagnostics
from torch_mingle._store import StoreKeeper

pytestmark = pytest.mark.integration


class _StandIn:
    """Just enough of a ``Node`` for the loop: it records the connect and decides nothing."""

    batching = False

    def __init__(self) -> None:
        self.board = Board(Diagnostics(node_id="1", job="job", role="idle"))
        self.core = types.SimpleNamespace(wall_offset_s=0.0)  # the loop follows clock steps there
        self.connected = threading.Event()

    def start(self, now: float) -> None: ...
    def next_timer(self) -> float | None:
        return None

    def end_batch(self, now: float) -> None: ...
    def on_connected(self, conn: int, now: float) -> None:
        self.connected.set()

    def on_accepted(self, conn: int, now: float) -> None: ...
    def on_frames(self, conn: int, frames: object, now: float) -> None: ...
    def on_closed(self, conn: int, reason: str, evidence: object, now: float) -> None: ...
    def on_timer(self, now: float) -> None: ...
    def recover(self, exc: BaseException, now: float) -> None:
        raise exc


def test_what_a_closing_connection_still_has_to_send_goes_out_when_the_loop_stops():
    """A follower's shutdown closes its connection with its close and leave frames queued, and
    stops the loop at once: a leader that reads slowly (a thousand joins at once) must still
    get them, within CLOSE_FLUSH_S."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the peer takes little at once
    loop = Loop([], keeper=StoreKeeper("127.0.0.1", "127.0.0.1"), label="[test]")
    node = _StandIn()
    loop.start(node)  # type: ignore[arg-type]
    peer: socket.socket | None = None
    try:
        conns: list[int] = []
        loop.call(lambda now: conns.append(loop.connect("127.0.0.1", listener.getsockname()[1])))
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
