"""A call blocked on a frozen leader's TCPStore is cut loose, whatever TCPStore's own timeouts say."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import DistError, TCPStore

from tests.helpers import wait_until
from torch_mingle import _store
from torch_mingle._store import EndedStores, abort_connections_to, cut, open_client

pytestmark = pytest.mark.integration

SERVER = """
import sys, time
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
print(store.port, flush=True)
time.sleep(600)
"""


def test_a_call_blocked_on_a_frozen_store_returns_once_its_connections_are_cut():
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    wake_r, wake_w = socket.socketpair()  # a Unix socket in the process, as the loop has one
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        client = TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=2))
        client.set("k", "v")
        os.kill(server.pid, signal.SIGSTOP)  # frozen: the kernel still holds its connections open
        outcome: dict[str, object] = {}

        def blocked_get() -> None:
            started = time.monotonic()
            try:
                client.get("k")
                outcome["result"] = "returned"
            except Exception as exc:  # what TCPStore raises when its socket is shut down
                outcome["result"] = type(exc).__name__
            outcome["after"] = time.monotonic() - started

        thread = threading.Thread(target=blocked_get, daemon=True)
        thread.start()
        thread.join(timeout=3.0)
        assert thread.is_alive(), "the get did not block on the frozen server: nothing to test"
        assert abort_connections_to("127.0.0.1", [port]) >= 1
        thread.join(timeout=5.0)
        assert not thread.is_alive(), "the blocked call was not cut loose"
        assert outcome["result"] != "returned"
        assert abort_connections_to("127.0.0.1", [port + 1]) == 0  # other ports: untouched
    finally:
        os.kill(server.pid, signal.SIGKILL)  # SIGKILL ends a stopped process too
        server.wait(timeout=30)
        wake_r.close()
        wake_w.close()


def test_the_store_of_an_ended_round_is_refused_to_new_clients_of_the_node_but_a_store_cut_ahead_is_not():
    """A connect that starts after the cut (a retry, a connect queued behind it) would block on
    a frozen store again: the node refuses the store of an ended round at once. A store
    connected ahead for the next round is only cut: a leader that was merely silent may still
    use it. Another node of the process (which may still be in that round) is not refused."""
    server = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    port = int(server.port)
    ours, another = EndedStores(), EndedStores()
    first = open_client("127.0.0.1", port, 2.0, ended=ours)
    abort_connections_to("127.0.0.1", [port])  # cut as a connect ahead
    with pytest.raises(DistError):
        first.set("x", "y")  # the cut client is dead
    open_client("127.0.0.1", port, 2.0, ended=ours).set("k", "v")  # a new one may connect
    ours.add("127.0.0.1", [port])  # its round ended with its leader
    started = time.monotonic()
    with pytest.raises(DistError, match="lost leader"):
        open_client("127.0.0.1", port, 2.0, ended=ours)
    assert time.monotonic() - started < 1.0  # refused here, no connect tried
    assert open_client("127.0.0.1", port, 2.0, ended=another).get("k") == b"v"


def test_a_connect_under_way_when_its_leader_is_cut_is_cut_too(monkeypatch):
    """The race: a connect passes the check for ended stores, the leader is lost and its stores
    cut (nothing to cut yet: the connect has not opened its socket), then the connect reaches
    the frozen host, whose kernel completes the handshake, and TCPStore's first request blocks
    for as long as the host stays frozen. The cut must keep cutting what a connect under way at
    its moment opens, until that connect returns."""
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    real = TCPStore
    checked, cut_done = threading.Event(), threading.Event()

    def tcpstore_after_the_cut(*args: Any, **kwargs: Any) -> TCPStore:
        checked.set()  # past the check for ended stores
        assert cut_done.wait(10.0)  # the cut happens now, before this connect opens its socket
        return real(*args, **kwargs)

    monkeypatch.setattr(_store, "TCPStore", tcpstore_after_the_cut)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        os.kill(server.pid, signal.SIGSTOP)
        outcome: dict[str, object] = {}

        def connect() -> None:
            try:
                open_client("127.0.0.1", port, 2.0, ended=ended)
                outcome["result"] = "connected"
            except DistError as exc:
                outcome["result"] = str(exc)

        ended = EndedStores()
        thread = threading.Thread(target=connect, daemon=True)
        thread.start()
        assert checked.wait(10.0)
        cut("127.0.0.1", [port], ended=ended)  # the leader is lost: finds nothing to cut yet
        cut_done.set()
        thread.join(timeout=10.0)
        assert not thread.is_alive(), "the connect under way at the cut blocked on the frozen store"
        assert "cut while connecting" in str(outcome["result"]), outcome
    finally:
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
    # Its thread, left to torch's client, ends past the client's own bound (2 s + the
    # resolver's allowance): torch sleeps a random back-off (seen: 9.7 s) before a try that the
    # bound then ends, so up to about 2.5 times it (32 s seen in CI); the cut keeps cutting
    # until then, for at most ``CUT_FOR_AT_MOST_S``.
    wait_until(
        lambda: _store._flights.under_way() == 0, _store.CUT_FOR_AT_MOST_S, "the connect's thread to end"
    )


def test_the_cut_keeps_cutting_only_while_a_connect_under_way_at_its_moment_runs(monkeypatch):
    """A connect that starts after the cut (to a store not ended: no ``EndedStores`` given)
    is a new one: once those under way at the cut return, the cutter stops, even if the new one
    still runs (it must not cut that one for the next minute)."""
    flights = _store._Flights()
    aborts: list[float] = []

    def abort_now(ip: str, ports: object) -> int:
        aborts.append(time.monotonic())
        return 0

    monkeypatch.setattr(_store, "_abort_now", abort_now)
    monkeypatch.setattr(_store, "abort_connections_to", lambda ip, ports: 0)
    before = flights.begin("127.0.0.1", 1, None)
    assert before.refused is False
    flights.cut("127.0.0.1", [1], None)
    after = flights.begin("127.0.0.1", 1, None)
    assert after.refused is False  # starts after the cut, and runs on
    deadline = time.monotonic() + 10.0
    while not aborts and time.monotonic() < deadline:
        time.sleep(0.005)
    assert aborts, "the cutter never cut the connect under way at the cut"
    flights.end(before)  # that connect returned
    cutter_gone = lambda: not [t for t in threading.enumerate() if t.name == "mingle-cutter"]  # noqa: E731
    while not cutter_gone() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert cutter_gone(), "the cutter went on cutting for a connect that started after the cut"
    assert flights.under_way() == 1
    flights.end(after)


def test_a_port_that_refuses_fails_the_connect_with_its_reason_and_leaves_no_try_behind():
    """torch's client tries a refused port again until its bound (the connect bound and the
    resolver's allowance, 10.5 s here, and a back-off past it), on a thread its caller no
    longer waits for. The node's own connect, made first, fails at once with the reason, and
    torch's client never starts: the connect's thread ends with the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(DistError, match=r"cannot be reached: Connection refused"):
        open_client("127.0.0.1", port, 0.5)
    # Ended within the connect bound (0.5 s; 2 s of slack for a loaded machine), where torch's
    # try would still run for seconds.
    wait_until(lambda: _store._flights.under_way() == 0, 2.5, "the connect's thread to end")
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name == _store.CONNECT_THREAD],
        2.5,
        "the connect's thread to end",
    )
