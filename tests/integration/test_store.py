"""The leader's TCPStore servers across torch versions."""

from __future__ import annotations

import os
from typing import Any

import pytest
from torch.distributed import TCPStore

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
