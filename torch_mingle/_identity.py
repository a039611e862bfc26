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
slot: it has no vote left to keep. A live agent touches its slot every quarter of ``keep_s``
(the job's ``join_timeout``); a slot whose lock is free and that nobody touched for longer
than ``keep_s`` (plus that quarter) belongs to an agent that died longer ago than the job's
other agents wait for a node: they formed a round without it or gave up, so its vote counts
no more, and the next agent that claims a slot in the directory deletes it (of any job). A
job started again under the same ``rdzv_id`` later than that starts afresh, not from a dead
job's round. Without a usable directory the node runs with a fresh identity and says so
once: it then gets its vote back only when the others form a round without it.

Each vote is on the disk before it goes out, so that a host that loses power keeps it. A slot
keeps two copies of its state, written in turn in place (one ``fdatasync`` each, where a new
file, its ``fsync``, a rename and the directory's ``fsync`` cost three times as long), each
with its number in the sequence and a checksum: a write that a power loss cut short leaves the
other copy whole, and the newer of the copies that check out is the state.

The directory holds votes, so another local user must not be able to write into it (plant a
slot with another host's node id, or a link where a state file goes): as ssh and tmux do, it
is refused unless it is this user's and nobody else may write to it (``_check_private``), it
is created with mode 0700, and its files are opened without following symbolic links.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch_mingle._ballot import NodeState
from torch_mingle._records import Heard, History
from torch_mingle.errors import MingleConfigError

log = logging.getLogger(__name__)

ENV = "TORCH_MINGLE_STATE_DIR"
MAX_SLOTS = 256
#: What a slot's state file may hold. It names up to six rounds with their members (``NodeState``:
#: the history, the vote and up to ``MAX_EARLIER`` replaced votes), about 19 bytes per member:
#: 7.5 MB at 65,536 members. A file cut short would read as garbage and lose the vote.
MAX_STATE_BYTES = 1 << 25
#: How long a slot outlives its process by default (torch's ``join_timeout``).
KEEP_S = 600.0
#: At most this many slots of other jobs are swept per claim.
MAX_SWEPT = 4 * MAX_SLOTS
#: A slot's lock file: the job's prefix, the slot number.
_SLOT_LOCK = re.compile(r"[0-9a-f]{16}\.[0-9]{1,3}\.lock")
#: Held while a process claims a slot (``_claiming``), at most CLAIM_WAIT_S.
CLAIM_LOCK = "claiming.lock"
CLAIM_WAIT_S = 2.0


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
        self,
        node_id: int,
        incarnation: int,
        state: NodeState,
        *,
        lock_fd: int | None,
        path: Path | None,
        keep_s: float = KEEP_S,
    ) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self.state = state
        self.keep_s = keep_s
        self._lock_fd = lock_fd
        self._path = path
        #: The two copies' descriptors, open from the first ``save`` to the release.
        self._copies: tuple[int, int] | None = None
        #: The number of the newest state written (the next goes to the other copy).
        self._seq = 0
        self._touched = time.monotonic()
        #: ``save`` (the loop's thread) against ``release`` (the agent's, as it leaves).
        self._guard = threading.Lock()

    @classmethod
    def fresh(cls, node_id: int | None = None) -> Identity:
        """An identity kept nowhere (no state directory, or a test that names its node)."""
        return cls(node_id or secrets.randbits(64) or 1, 1, NodeState(), lock_fd=None, path=None)

    @classmethod
    def claim(cls, state_dir: Path, job: str, label: str = "", *, keep_s: float = KEEP_S) -> Identity:
        """This process's slot of ``job``: a dead predecessor's if one is free (and died less
        than ``keep_s`` ago), else a new one."""
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            return cls._kept_nowhere(
                label, f"cannot use the state directory {state_dir}", exc, "a writable directory"
            )
        try:
            state_dir = _private(state_dir)
        except OSError as exc:
            return cls._kept_nowhere(
                label, f"cannot make a private directory in {state_dir}", exc, "a directory of this user's"
            )
        prefix = hashlib.sha256(job.encode()).hexdigest()[:16]
        with _claiming(state_dir, prefix):
            return cls._claim(state_dir, prefix, label, keep_s)

    @classmethod
    def _kept_nowhere(cls, label: str, problem: str, exc: OSError, fix: str) -> Identity:
        """A fresh identity, when ``state_dir`` cannot hold this node's (``problem``)."""
        log.warning(
            "%s %s (%s): a restarted agent of this node will not get its vote back at once; "
            "set state_dir= or $%s to %s",
            label, problem, exc, ENV, fix,
        )  # fmt: skip
        return cls.fresh()

    @classmethod
    def _claim(cls, state_dir: Path, prefix: str, label: str, keep_s: float) -> Identity:
        for slot in range(MAX_SLOTS):
            path = state_dir / f"{prefix}.{slot}"
            fd = _try_lock(_lock_path(path))
            if fd is None:
                continue  # a live (or frozen) process holds it
            node_id, incarnation, state, kept, seq = _read(path)
            if node_id and (state.left or _stale(path, kept)):
                # It left the job (its vote went with it: ``Ballot.leave``), or died long ago:
                # start afresh, as a new node.
                node_id, incarnation, state = 0, 0, NodeState()
            ident = cls(
                node_id or secrets.randbits(64) or 1,
                incarnation + 1,
                state,
                lock_fd=fd,
                path=path,
                keep_s=keep_s,
            )
            ident._seq = seq
            ident.save(state)
            if incarnation:
                log.info(
                    "%s this agent takes over node %016x (incarnation %d), whose process is gone",
                    label, node_id, incarnation + 1,
                )  # fmt: skip
            return ident
        log.warning(
            "%s all %d state slots of this job are held: running with a fresh identity", label, MAX_SLOTS
        )
        return cls.fresh()

    def save(self, state: NodeState) -> bool:
        """Record ``state``: atomically (a crash leaves the old or the new, never half) and on
        the disk (a host that loses power keeps it) before the vote goes out.

        False: the vote must not go out. The write failed and the slot could not be forsaken
        either; a new process of this node would take over the slot with what it held before,
        and vote again where this one's vote counted. (Forsaken, its state file deleted, the
        slot gives its next process a fresh node id: this one goes on without a slot.)"""
        with self._guard:
            self.state = state
            path = self._path
            if path is None:
                return True
            data = {
                "node": f"{self.node_id:016x}",
                "incarnation": self.incarnation,
                "keep_s": self.keep_s,
                "history": state.history.to_json() if state.history else None,
                "accepted": state.accepted.to_json() if state.accepted else None,
                "led": state.led,
                "seen": state.heard.to_json(),
                "left": state.left,
            }
            if state.earlier:
                data["earlier"] = [h.to_json() for h in state.earlier]
            seq = self._seq + 1
            data["seq"] = seq
            body = json.dumps(data, separators=(",", ":")).encode()
            try:
                if self._copies is None:
                    self._copies = _open_copies(path)
                _write_through(self._copies[seq % 2], body + b"\n" + _checksum(body))
            except OSError as exc:
                return self._forsake(path, exc)
            self._seq = seq
            self._touched = time.monotonic()
            return True

    def _forsake(self, path: Path, exc: OSError) -> bool:
        self._close_copies()
        try:
            for p in (path, _twin_path(path)):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            _fsync_dir(path.parent)
        except OSError as again:
            log.warning(
                "cannot write this node's state to %s (%s), nor delete it (%s): this node votes "
                "no more (a new process of it would vote again with older state); free the "
                "state directory or set state_dir= elsewhere (docs/usage.md#configuration-in-detail)",
                path, exc, again,
            )  # fmt: skip
            return False
        log.warning(
            "cannot write this node's state to %s (%s): going on without a state file (a new "
            "process of this node will get a fresh node id)",
            path, exc,
        )  # fmt: skip
        self._path = None
        return True

    def _close_copies(self) -> None:
        copies, self._copies = self._copies, None
        for fd in copies or ():
            with contextlib.suppress(OSError):
                os.close(fd)

    def keep_alive(self) -> None:
        """Touch the slot if a quarter of ``keep_s`` passed (called by the loop as it runs):
        how long ago its process died is how long nobody touched it."""
        with self._guard:
            path = self._path
            if path is None or time.monotonic() - self._touched < self.keep_s / 4:
                return
            self._touched = time.monotonic()
            try:
                os.utime(path)
            except OSError as exc:
                log.warning("cannot touch this node's state %s: %s", path, exc)

    def release(self, *, forget: bool) -> None:
        """Give the slot up (``forget``: the node ended gracefully, nothing is left to keep)."""
        with self._guard:
            if forget and self._path is not None:
                # The lock file last, while locked (``_try_lock`` checks that it is still there).
                for path in (self._path, _twin_path(self._path), _lock_path(self._path)):
                    with contextlib.suppress(OSError):
                        path.unlink()
                self._path = None  # the loop may still record a vote as it stops: nowhere now
            self._close_copies()
            if self._lock_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._lock_fd)
                self._lock_fd = None


def _private(state_dir: Path, *, inside: bool = False) -> Path:
    """Where this user's slots go: ``state_dir`` if it is a directory of this user's that nobody
    else may write to; a private directory of this user's inside it if it is this user's or
    root's and others may write there (``/tmp``, a Kubernetes emptyDir); a link of this user's
    is followed. Anything else is refused: there, another local user could plant a slot (a node
    id of another host: one vote on two hosts) or a link where a state file is written."""
    info = os.lstat(state_dir)
    uid = os.geteuid()
    if info.st_uid not in (uid, 0) or (inside and info.st_uid != uid):
        problem = f"belongs to uid {info.st_uid}, not to this user (uid {uid})"
    elif stat.S_ISLNK(info.st_mode):
        if inside:
            problem = "is a symbolic link"
        else:
            return _private(state_dir.resolve(strict=True))
    elif not stat.S_ISDIR(info.st_mode):
        problem = "is not a directory"
    elif not info.st_mode & 0o022 and info.st_uid == uid:
        return state_dir
    elif inside:
        problem = f"may be written by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    else:
        own = state_dir / f"torch_mingle-{uid}"
        with contextlib.suppress(FileExistsError):
            own.mkdir(mode=0o700)
        return _private(own, inside=True)
    raise MingleConfigError(
        f"the state directory {state_dir} {problem}: another local user could plant this node's "
        "identity or vote there, so it is not used. Fix: remove it (a new one is created with "
        f"mode 0700), or set state_dir= (or ${ENV}) to a directory of this user's with mode 0700 "
        "(docs/security.md#local-users)"
    )


def _lock_path(state: Path) -> Path:
    return state.with_name(state.name + ".lock")


def _twin_path(state: Path) -> Path:
    """The slot's second copy of its state (the first is at ``state``)."""
    return state.with_name(state.name + ".b")


def _open_copies(state: Path) -> tuple[int, int]:
    """The slot's two copies, opened for writing in place (created if missing, and then on the
    disk before a vote is written into them), never through a link."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    created = not (state.exists() and _twin_path(state).exists())
    fds: list[int] = []
    try:
        for path in (state, _twin_path(state)):
            fds.append(os.open(path, flags, 0o600))
            _regular(fds[-1], path)
        if created:
            _fsync_dir(state.parent)
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds[0], fds[1]


def _regular(fd: int, path: Path) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError(errno.EINVAL, f"{path} is not a regular file")


def _write_through(fd: int, blob: bytes) -> None:
    """``blob`` as the whole content of ``fd``'s file, on the disk when this returns."""
    view, at = memoryview(blob), 0
    while at < len(blob):
        at += os.pwrite(fd, view[at:], at)
    os.ftruncate(fd, len(blob))
    os.fdatasync(fd)


def _checksum(body: bytes) -> bytes:
    """What tells a copy that a power loss cut short (CRC-32: a torn write, not a forger)."""
    return b"%08x" % zlib.crc32(body)


def _stale(path: Path, keep_s: float) -> bool:
    """Nobody touched the slot for longer than its process's ``keep_s`` (and one touch more)."""
    return _mtime(path) < time.time() - keep_s * 1.25


@contextlib.contextmanager
def _claiming(state_dir: Path, prefix: str) -> Iterator[None]:
    """A claim in ``state_dir``, and a sweep if none runs. A sweep locks other jobs' slots for a
    moment, and an agent of that job claiming then would take the busy slot for a live one and
    start under a fresh node id: so the sweep holds the directory's lock exclusively, claims
    hold it shared (they run side by side), and a claim that finds a sweep under way waits for
    it, CLAIM_WAIT_S at most (a sweeper frozen mid-sweep), then claims anyway (the slot locks
    keep that safe; only that race comes back). A claim that finds other claims under way
    does not sweep: the next claim will."""
    try:
        fd = os.open(state_dir / CLAIM_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        _sweep(state_dir, skip=prefix)
        yield
        return
    try:
        if _flock_now(fd, fcntl.LOCK_EX):
            _sweep(state_dir, skip=prefix)
        deadline = time.monotonic() + CLAIM_WAIT_S
        while not _flock_now(fd, fcntl.LOCK_SH) and time.monotonic() < deadline:
            time.sleep(0.001)  # a sweep of at most MAX_SWEPT files is under way
        yield
    finally:
        os.close(fd)


def _flock_now(fd: int, how: int) -> bool:
    """Take (or convert to) ``how`` on ``fd`` without waiting; False if another holds it."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True  # a file system without flock: go on (as without the directory lock)
    return True


def _sweep(state_dir: Path, skip: str) -> None:
    """Delete the stale slots of other jobs (ours: ``claim`` looks at each), a bounded number:
    only files named as slots are, and only a slot whose state file is one (or is missing)."""
    try:
        names = [e.name for _, e in zip(range(MAX_SWEPT), os.scandir(state_dir), strict=False)]
    except OSError:
        return
    for name in names:
        if not _SLOT_LOCK.fullmatch(name) or name.startswith(skip):
            continue
        lock = state_dir / name
        state = lock.with_name(name[: -len(".lock")])
        fd = _try_lock(lock)
        if fd is None:
            continue  # its process lives (or is frozen)
        try:
            if not state.exists() and _mtime(lock) > time.time() - KEEP_S:
                continue  # being set up right now
            if state.exists():
                node_id, _, _, kept, _ = _read(state)
                if not node_id or not _stale(state, kept):
                    continue  # not a slot's state (left alone), or kept still
            for path in (state, _twin_path(state), lock):
                with contextlib.suppress(OSError):
                    path.unlink()
        finally:
            os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _try_lock(path: Path) -> int | None:
    """Lock ``path`` (created if missing) without waiting; None if another process holds it.
    A lock file unlinked by the slot's holder as we opened it is no lock: the path may name a
    new file, locked by another process."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        ours = os.fstat(fd).st_ino == os.stat(path).st_ino
    except OSError:
        ours = False
    if not ours:
        os.close(fd)
        return None
    return fd


def _read(path: Path) -> tuple[int, int, NodeState, float, int]:
    """A slot's node id, incarnation, state, ``keep_s`` and the state's number in its sequence,
    from the newer of its two copies that check out (zeros for none)."""
    best: tuple[int, int, NodeState, float, int] = (0, 0, NodeState(), KEEP_S, 0)
    for copy in (path, _twin_path(path)):
        read = _read_copy(copy)
        if read is not None and read[4] > best[4]:
            best = read
    return best


def _read_copy(path: Path) -> tuple[int, int, NodeState, float, int] | None:
    """One copy of a slot's state; None if missing, cut short or garbage."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
            blob = f.read(MAX_STATE_BYTES)
        body, _, checksum = blob.rpartition(b"\n")
        if checksum != _checksum(body):
            return None
        data: Any = json.loads(body)
        node_id = int(data["node"], 16)
        incarnation = int(data["incarnation"])
        keep_s = float(data.get("keep_s", KEEP_S))
        history = History.from_json(data["history"]) if data.get("history") else None
        accepted = History.from_json(data["accepted"]) if data.get("accepted") else None
        led = int(data.get("led", 0))
        heard = Heard.of(data.get("seen"))
        left = data.get("left", False) is not False
        earlier = tuple(History.from_json(h) for h in data.get("earlier") or ())
        seq = int(data["seq"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if seq < 1:
        return None
    return node_id, incarnation, NodeState(history, accepted, led, heard, left, earlier), keep_s, seq


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
