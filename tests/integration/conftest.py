"""Fixtures for in-process handlers on 127.0.0.1 (real multicast, real TCPStores)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from tests.helpers import random_port
from torch_mingle.handler import MingleRendezvousHandler

Factory = Callable[..., MingleRendezvousHandler]


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
