"""Who a node is across restarts of its agent: its node id, its incarnation, and its vote.

How it works
------------
Every agent of a job takes a *slot* under ``state_dir``: a lock file it holds locked
(``flock``) for as long as its process lives, and a state file beside it. A new agent takes
the first slot of its job whose lock is free. The kernel releases the lock of a process that
died, so an agent restarted on the same host (by torchrun's scheduler, Kubernetes, Slurm)
takes over its dead predecessor's node id, one incarnation later, with what it had recorded:
the newest round it knew formed and the proposal it accepted (``NodeState``, written before
each vote goes out). It therefore votes again at once, where a new node id would leave the
old one's vote to nobody until the job's other nodes form a round without it. A process that
is only frozen (SIGSTOP) keeps its lock: an agent started beside it gets a fresh slot, and the
frozen one's vote is never taken over while it may still come back.

A node that ends gracefully (its job finished, it left, its rendezvous failed) deletes its
slot: it has no vote left to keep. A slot whose lock is free and that was written more than
``STALE_S`` ago (an agent that crashed and never came back) is deleted by the next agent that
looks. Without a usable directory the node runs with a fresh identity and says so once: it
then gets its vote back only when the others form a round without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from torch_mingle._node import NodeState
from torch_mingle._rounds import History

log = logging.getLogger(__name__)

ENV = "TORCH_MINGLE_STATE_DIR"
MAX_SLOTS = 256
STALE_S = 7 * 24 * 3600.0


def default_state_dir() -> Path:
    """``$TORCH_MINGLE_STATE_DIR``, else ``$XDG_RUNTIME_DIR/torch_mingle``, else a directory of
    this user's in the system's temporary directory."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.access(runtime, os.W_OK):
        return Path(runtime) / "torch_mingle"
    return Path(tempfile.gettempdir()) / f"torch_mingle-{os.getuid()}"


class Identity:
    """A node's slot (see the module doc): hold it for the process's life, ``save`` each vote."""

    def __init__(
        self, node_id: int, incarnation: int, state: NodeState, *, lock_fd: int | None, path: Path | None
    ) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.state = state
        self._lock_fd = lock_fd
        self._path = path

    @classmethod
    def fresh(cls, node_id: int | None = None) -> Identity:
        """An identity kept nowhere (no state directory, or a test that names its node)."""
        return cls(node_id or secrets.randbits(64) or 1, 1, NodeState(), lock_fd=None, path=None)

    @classmethod
    def claim(cls, state_dir: Path, job: str, label: str = "") -> Identity:
        """This process's slot of ``job``: a dead predecessor's if one is free, else a new one."""
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            log.warning(
                "%s cannot use the state directory %s (%s): a restarted agent of this node will "
                "not get its vote back at once; set state_dir= or $%s to a writable directory",
                label, state_dir, exc, ENV,
            )  # fmt: skip
            return cls.fresh()
        prefix = hashlib.sha256(job.encode()).hexdigest()[:16]
        for slot in range(MAX_SLOTS):
            path = state_dir / f"{prefix}.{slot}"
            fd = _try_lock(path.with_suffix(f".{slot}.lock"))
            if fd is None:
                continue  # a live (or frozen) process holds it
            node_id, incarnation, state = _read(path)
            if node_id and _mtime(path) < time.time() - STALE_S:
                node_id, incarnation, state = 0, 0, NodeState()  # a crash long ago: start afresh
            ident = cls(node_id or secrets.randbits(64) or 1, incarnation + 1, state, lock_fd=fd, path=path)
            ident.save(state)
            if node_id:
                log.info(
                    "%s this agent takes over node %016x (incarnation %d), whose process is gone",
                    label, node_id, incarnation + 1,
                )  # fmt: skip
            return ident
        log.warning(
            "%s all %d state slots of this job are held: running with a fresh identity", label, MAX_SLOTS
        )
        return cls.fresh()

    def save(self, state: NodeState) -> None:
        """Record ``state`` (atomically: a crash leaves the old or the new, never half)."""
        self.state = state
        if self._path is None:
            return
        data = {
            "node": f"{self.node_id:016x}",
            "incarnation": self.incarnation,
            "history": state.history.to_json() if state.history else None,
            "accepted": state.accepted.to_json() if state.accepted else None,
        }
        tmp = self._path.with_suffix(self._path.suffix + ".tmp")
        try:
            tmp.write_text(json.dumps(data, separators=(",", ":")))
            os.replace(tmp, self._path)
        except OSError as exc:
            log.warning("cannot write this node's state to %s: %s", self._path, exc)

    def release(self, *, forget: bool) -> None:
        """Give the slot up (``forget``: the node ended gracefully, nothing is left to keep)."""
        if forget and self._path is not None:
            with contextlib.suppress(OSError):
                self._path.unlink()
            self._path = None  # the loop may still record a vote as it stops: nowhere now
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None


def _try_lock(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _read(path: Path) -> tuple[int, int, NodeState]:
    try:
        data: Any = json.loads(path.read_text())
        node_id = int(data["node"], 16)
        incarnation = int(data["incarnation"])
        history = History.from_json(data["history"]) if data.get("history") else None
        accepted = History.from_json(data["accepted"]) if data.get("accepted") else None
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0, NodeState()
    return node_id, incarnation, NodeState(history, accepted)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
