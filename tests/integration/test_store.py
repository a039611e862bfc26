"""The leader's TCPStore servers across torch versions, and what it keeps in them for torch's agents."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from torch.distributed import TCPStore
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
