"""Shared fixtures: handlers on 127.0.0.1, network namespaces, failpoints, and the thread-leak check.

Every test fails if it leaves a torch_mingle thread running.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from tests.helpers import random_port
from tests.netns.segment import Segment, netns_available
from torch_mingle import _faults, _store
from torch_mingle.handler import MingleRendezvousHandler

Factory = Callable[..., MingleRendezvousHandler]

THREAD_PREFIX = "mingle-"
LEAK_GRACE_S = 10.0
#: A store connect that a cut found inside torch's client runs on until torch gives up: its
#: bound plus a random back-off (32 s seen in CI). The node's cutter gives it
#: ``CUT_FOR_AT_MOST_S`` and then logs an error; the check gives it as long, and no longer.
CONNECT_GRACE_S = _store.CUT_FOR_AT_MOST_S
CONNECT_THREAD = _store.CONNECT_THREAD


def _ours() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


@pytest.fixture(autouse=True)
def no_thread_leaks() -> Iterator[None]:
    before = set(_ours())
    yield
    started = time.monotonic()
    while True:
        leaked = [t for t in _ours() if t not in before and t.is_alive()]
        if not leaked:
            return
        waited = time.monotonic() - started
        others = [t for t in leaked if t.name != CONNECT_THREAD]
        if waited > CONNECT_GRACE_S or (others and waited > LEAK_GRACE_S):
            pytest.fail(f"test leaked threads: {sorted(t.name for t in leaked)}")
        leaked[0].join(timeout=0.1)


@pytest.fixture(autouse=True)
def own_environment() -> Iterator[None]:
    """A handler run in the test process exports the workers' variables (``GLOO_SOCKET_IFNAME``,
    ``MINGLE_ROUND``...) into ``os.environ``, as it must under torchrun: the next test gets the
    environment back as it was, so a later child (a Slurm job exports ours) never inherits them."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def no_armed_failpoints() -> Iterator[None]:
    """A test that arms failpoints never leaves them armed for the next one."""
    yield
    _faults.disarm_all()


@pytest.fixture
def port() -> int:
    return random_port()


@pytest.fixture
def make_handler(port: int) -> Iterator[Factory]:
    """Creates handlers pinned to 127.0.0.1 on this test's port; shuts every one down at the end."""
    made: list[MingleRendezvousHandler] = []

    def make(
        job: str, min_nodes: int = 1, max_nodes: int | None = None, **conf: Any
    ) -> MingleRendezvousHandler:
        conf.setdefault("interface", "127.0.0.1")
        conf.setdefault("port", str(port))
        params = RendezvousParameters("mingle", "", job, min_nodes, max_nodes or min_nodes, **conf)
        handler = MingleRendezvousHandler.from_params(params)
        made.append(handler)
        return handler

    yield make
    with ThreadPoolExecutor(max_workers=max(1, len(made))) as pool:
        list(pool.map(lambda h: h.shutdown(), made))


@pytest.fixture
def segment() -> Iterator[Segment]:
    """A fresh bridge in a namespace of its own; every namespace is deleted also on failure."""
    reason = netns_available()
    if reason is not None:
        pytest.skip(reason)
    seg = Segment()
    try:
        seg.create_bridge()
        yield seg
    finally:
        seg.destroy()
