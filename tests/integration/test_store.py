"""The leader's TCPStore servers across torch versions, and what it keeps in them for torch's agents."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
from torch.distributed.elastic.utils import store as store_util

from tests.helpers import wait_until
from torch_mingle import _store
from torch_mingle._protocol import Claim
from torch_mingle._rounds import RoundBook

pytestmark = pytest.mark.integration


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_libuv_store_that_refuses_our_listener_falls_back_to_the_classic_server(monkeypatch):
    # torch 2.5 to 2.7: the libuv server (their default) raises on master_listen_fd.
    calls: list[bool] = []

    def old_torch_store(*args: Any, **kwargs: Any) -> TCPStore:
        calls.append(kwargs.get("use_libuv", True))
        if calls[-1] and kwargs.get("master_listen_fd") is not None:
            raise NotImplementedError("use_libuv=True does not support master_listen_fd")
        return TCPStore(*args, **kwargs)

    monkeypatch.setattr(_store, "TCPStore", old_torch_store)
    monkeypatch.setattr(_store, "_libuv_takes_listen_fd", True)
    fds = _open_fds()
    server = _store.open_server("127.0.0.1")
    assert calls == [True, False]
    assert not server.libuvBackend  # type: ignore[attr-defined]  # missing from torch's stubs
    client = TCPStore("127.0.0.1", server.port, None, False)
    client.set("k", "v")
    assert server.get("k") == b"v"
    # Learnt once: the next store goes straight to the classic server.
    second = _store.open_server("127.0.0.1")
    assert calls == [True, False, False]
    del client, server, second
    assert _open_fds() <= fds, "a refused listener was leaked"


def test_the_pinned_torch_serves_our_listener_on_libuv():
    server = _store.open_server("127.0.0.1")  # torch 2.13 (constraints.txt) takes it since 2.8
    assert server.libuvBackend  # type: ignore[attr-defined]  # missing from torch's stubs
    assert _store._libuv_takes_listen_fd


def test_the_leader_opens_torchs_exit_barrier_for_a_member_that_left():
    """Two members wait in torch's own exit barrier; the third leaves instead (its workers failed)."""
    leader, others = 0x1, (0x2, 0x3)
    book = RoundBook(leader=leader, epoch=1, min_nodes=3, max_nodes=3, last_call_timeout=30)
    host = _store.LeaderHost(
        ip="127.0.0.1", connect_ip="127.0.0.1", claim=Claim(epoch=1, leader=leader), book=book,
        keep_alive_interval_s=5, keep_alive_timeout_s=15, on_status=lambda status: None, label="[test]",
    )  # fmt: skip
    try:
        sessions = {
            node: _store.MemberSession(
                host.claim, "127.0.0.1", host.port, node=node, timeout_s=10, op_timeout_s=30
            )
            for node in (leader, *others)
        }
        with ThreadPoolExecutor(3) as pool:
            deadline = time.monotonic() + 30
            joins = [
                pool.submit(s.join, ip="127.0.0.1", history=None, deadline=deadline, spare_wait_s=30)
                for s in sessions.values()
            ]
            (number,) = {j.result(timeout=30).number for j in joins}

            def exit_barrier(node: int) -> None:  # what torch's agent does when its workers succeeded
                store_util.barrier(sessions[node].agent_store(number), 3, _TERMINAL_STATE_SYNC_ID, 60)

            waiting = [pool.submit(exit_barrier, node) for node in (leader, others[0])]
            assert _store.EXIT_BARRIER_KEYS is not None
            counter, agents = _store.EXIT_BARRIER_KEYS[0], _store.agent_store(host.control, number)
            wait_until(lambda: agents.add(counter, 0) == 2, 30, "two nodes in the exit barrier")
            assert not any(w.done() for w in waiting), "the barrier opened before anyone left"
            sessions[others[1]].push("leave")
            for w in waiting:
                w.result(timeout=30)  # torch's barrier would hold them 60 s (300 s in torchrun)
    finally:
        host.stop()
