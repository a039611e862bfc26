"""Failpoints: named places where a test makes torch_mingle fail on purpose. Off unless armed.

The fault-injection tests use them to prove that no background loop dies silently: each
armed point raises once per count, and the test checks that the node recovers (a leader
resigns, a follower re-joins) or fails loudly. Armed in-process with ``arm(name, times)``,
or for real agents by the environment, read once at import (``count:seconds`` arms a point
only that many seconds after the process started)::

    TORCH_MINGLE_FAILPOINTS="leader.decide=1,worker.open_store=2,loop.iterate=1:8"

Points: ``loop.callback`` (any event handed to the node), ``leader.decide`` (the leader's
round decisions), ``follower.frame`` (a frame from the leader), ``worker.open_store``
(opening a round store fails as if out of descriptors), ``store.connect`` (the agent's client
of the round store times out, as behind a stalled resolver), ``store.connect_ahead`` (the
same for the client a waiting node opens ahead of the round), ``loop.iterate`` (the loop
itself, outside the node's code: the node cannot recover, it must fail loudly),
``agent.lost_before_role_info`` (the agent process kills itself with SIGKILL right after its
``next_rendezvous()`` returned, before torch writes its role info: a member lost in that window),
``node.publish`` (the node's snapshot for the agent's thread is held back, as if the thread
read it just before the loop published: what the agent does must not depend on its timing).
"""

from __future__ import annotations

import errno
import os
import threading
import time

from torch_mingle import _failpoints
from torch_mingle._failpoints import FailpointError

__all__ = ["ENV", "POINTS", "FailpointError", "arm", "disarm_all", "hit", "remaining"]

ENV = "TORCH_MINGLE_FAILPOINTS"
POINTS = (
    "loop.callback", "leader.decide", "follower.frame", "worker.open_store", "store.connect",
    "store.connect_ahead", "loop.iterate", "agent.lost_before_role_info", "node.publish",
)  # fmt: skip


_STARTED = time.monotonic()


def _parse(raw: str) -> dict[str, tuple[int, float]]:
    armed: dict[str, tuple[int, float]] = {}
    for item in raw.replace(";", ",").split(","):
        name, _, spec = item.strip().partition("=")
        count, _, after = spec.partition(":")
        if name in POINTS:
            armed[name] = (
                int(count) if count.strip().isdigit() else 1,
                _STARTED + (float(after) if after.strip() else 0.0),
            )
    return armed


_armed: dict[str, tuple[int, float]] = _parse(os.environ.get(ENV, ""))
_lock = threading.Lock()


def arm(name: str, times: int = 1) -> None:
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(POINTS)}")
    with _lock:
        _armed[name] = (times, 0.0)


def disarm_all() -> None:
    with _lock:
        _armed.clear()


def remaining(name: str) -> int:
    with _lock:
        return _armed.get(name, (0, 0.0))[0]


def hit(name: str) -> None:
    """Raise if ``name`` is armed (and count it down); nothing at all otherwise."""
    if not _armed:
        return
    with _lock:
        left, not_before = _armed.get(name, (0, 0.0))
        if left <= 0 or time.monotonic() < not_before:
            return
        _armed[name] = (left - 1, not_before)
    if name == "worker.open_store":
        raise OSError(errno.EMFILE, f"Too many open files (failpoint {name})")
    raise FailpointError(f"failpoint {name}")


_failpoints.check = hit  # the core's failpoints (``_failpoints.hit``) are these
