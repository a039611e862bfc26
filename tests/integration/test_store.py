"""The leader's TCPStore servers across torch versions, and what it keeps in them for torch's agents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from torch.distributed import DistError, TCPStore
from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
from torch.distributed.elastic.utils import store as store_util

from tests.helpers import rendezvous_all, unique_job, wait_until
from torch_mingle import _store

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


def test_the_leader_opens_torchs_exit_barrier_for_a_member_that_left(make_handler):
    """Two members wait in torch's own exit barrier; the third leaves instead (its workers failed)."""
    job = unique_job("barrier")
    handlers = [make_handler(job, 3) for _ in range(3)]
    infos = rendezvous_all(handlers)
    by_rank = sorted(zip(infos, handlers, strict=True), key=lambda pair: pair[0].rank)
    waiting, (leaving_info, leaving) = by_rank[:2], by_rank[2]
    with ThreadPoolExecutor(2) as pool:
        # What torch's agent does when its workers succeeded (it would wait 300 s in torchrun).
        barriers = [
            pool.submit(store_util.barrier, info.store, 3, _TERMINAL_STATE_SYNC_ID, 60) for info, _ in waiting
        ]
        counter = _store.EXIT_BARRIER_KEYS[0] if _store.EXIT_BARRIER_KEYS else ""
        wait_until(lambda: leaving_info.store.add(counter, 0) == 2, 10, "two members in the barrier")
        assert not any(b.done() for b in barriers), "the barrier opened before anyone left"
        leaving.shutdown()  # leaves without arriving: it will never come
        for b in barriers:
            b.result(timeout=30)


_SERVER = (
    "import time; from torch.distributed import TCPStore; "
    "s = TCPStore('127.0.0.1', 0, None, True, wait_for_workers=False); "
    "print(s.port, flush=True); time.sleep(600)"
)


def _agent_store_whose_server_dies(broke_after_s: float | None) -> tuple[_store.AgentStore, Any]:
    """An agent's store on a real TCPStore whose server process is then killed (its kernel
    resets the connection); the node says the round broke ``broke_after_s`` later (None: never)."""
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        client = TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=5))
    except BaseException:
        server.kill()
        raise
    broke = threading.Event()
    store = _store.AgentStore(
        client, on_barrier=lambda: None, round_broke=broke.is_set, world_size=3,
        wait_broken=broke.wait, heartbeat_timeout_s=1.0,
    )  # fmt: skip
    role = json.dumps({"role": "trainer", "rank": 1, "local_world_size": 2})
    store.set("torchelastic/role_info/1", role)
    server.kill()
    server.wait(timeout=30)
    if broke_after_s is not None:
        threading.Timer(broke_after_s, broke.set).start()
    return store, server


def test_a_rank_read_that_fails_before_the_node_says_the_round_broke_waits_for_its_word():
    """The store's connection resets before the node knows its round broke (a firewall blip, a
    leader lost): the read waits for the node's word, then stands in, as in any broken round.
    It raised at once, and torch's agent failed and closed the job (swarm seed 2708)."""
    store, _ = _agent_store_whose_server_dies(broke_after_s=0.5)
    assert store.get("torchelastic/assigned_ranks/1") == b"[2, 6, 2, 6]"  # rank 1 of 3 nodes x 2 workers


def test_a_rank_read_that_fails_while_the_node_says_nothing_fails_after_its_wait():
    """...and a store that fails while the node never says its round broke is an error of the
    store (after ``_world.store_error_wait_s``), not a round to stand in for."""
    store, _ = _agent_store_whose_server_dies(broke_after_s=None)
    with pytest.raises((DistError, RuntimeError)):
        store.get("torchelastic/assigned_ranks/1")
