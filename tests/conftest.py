"""Shared fixtures: every test fails if it leaves a torch_mingle thread running."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

THREAD_PREFIX = "mingle-"
LEAK_GRACE_S = 10.0


def _ours() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


@pytest.fixture(autouse=True)
def no_thread_leaks() -> Iterator[None]:
    before = set(_ours())
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    while time.monotonic() < deadline:
        leaked = [t for t in _ours() if t not in before and t.is_alive()]
        if not leaked:
            return
        leaked[0].join(timeout=0.1)
    pytest.fail(f"test leaked threads: {sorted(t.name for t in leaked)}")
