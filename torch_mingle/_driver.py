"""The thread that owns the discovery sockets and the clock, and feeds the protocol core.

Other threads never touch the core directly: they read snapshots under a lock, block on
a condition until a leader is known, or queue commands that the driver thread runs.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from torch_mingle._protocol import (
    RESIGNED,
    BecomeLeader,
    Claim,
    Discovery,
    LeaderFound,
    LeaderLost,
    LeaderView,
    Role,
    Stats,
    SteppedDown,
)
from torch_mingle._transport import McastTransport

log = logging.getLogger(__name__)

IDLE_WAKE_S = 1.0


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of what discovery knows, for diagnostics and error messages."""

    role: Role
    leader: LeaderView | None
    generation: int
    stats: Stats
    peers_heard: int
    max_epoch_seen: int
    send_errors: int


class Driver:
    """Runs one ``Discovery`` core over one transport in a daemon thread."""

    def __init__(
        self,
        core: Discovery,
        transport: McastTransport,
        *,
        on_become_leader: Callable[[int], tuple[str, int]],
        on_step_down: Callable[[Claim], None],
        label: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.transport = transport
        self.on_become_leader = on_become_leader
        self.on_step_down = on_step_down
        self.label = label
        self.clock = clock
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._commands: deque[Callable[[float], None]] = deque()
        self._commands_lock = threading.Lock()  # not _cond: callers may hold locks the driver waits for
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = False
        self._generation = 0
        self._thread = threading.Thread(target=self._run, name=f"mingle-driver{label}", daemon=True)

    # ------------------------------------------------------------ other threads

    def start(self) -> None:
        """Open the sockets (errors raise here, in the caller) and start discovering."""
        self.transport.open()
        with self._cond:
            self.core.start(self.clock())
            self._flush(self.clock())
        self._thread.start()

    def call(self, command: Callable[[float], None]) -> None:
        """Run ``command(now)`` on the driver thread, soon."""
        with self._commands_lock:
            self._commands.append(command)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def report_leader_failed(self, claim: Claim, reason: str) -> None:
        self.call(lambda now: self.core.leader_failed(now, claim, reason))

    def report_leader_alive(self, claim: Claim) -> None:
        self.call(lambda now: self.core.leader_alive(now, claim))

    def wait_leader(self, deadline: float, *, after_generation: int = -1) -> tuple[LeaderView, int] | None:
        """Block until a leader newer than ``after_generation`` is known (with its generation)."""
        with self._cond:
            while True:
                if self.error is not None:
                    raise self.error
                leader = self.core.leader
                if leader is not None and self._generation > after_generation:
                    return leader, self._generation
                left = deadline - self.clock()
                if left <= 0:
                    return None
                self._cond.wait(min(left, IDLE_WAKE_S))

    @property
    def generation(self) -> int:
        """Increases every time the known leader changes (found, lost, replaced)."""
        with self._cond:
            return self._generation

    def snapshot(self) -> Snapshot:
        with self._cond:
            core = self.core
            stats = replace(
                core.stats, invalid=core.stats.invalid.copy(), other_jobs=dict(core.stats.other_jobs)
            )
            return Snapshot(
                role=core.role,
                leader=core.leader,
                generation=self._generation,
                stats=stats,
                peers_heard=len(core.peers),
                max_epoch_seen=core.max_epoch_seen,
                send_errors=self.transport.send_errors,
            )

    def stop(self, *, resign: bool) -> None:
        """Stop the thread and close the sockets; ``resign`` tells followers first."""
        if resign:
            self.call(self.core.resign)
        self.call(lambda now: self.core.stop())
        with self._cond:
            self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self.transport.close()
        for sock in (self._wake_r, self._wake_w):
            sock.close()

    # ------------------------------------------------------------ driver thread

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:
            log.exception("%s discovery stopped on an internal error", self.label)
            with self._cond:
                self.error = exc
                self._cond.notify_all()

    def _loop(self) -> None:
        sockets = self.transport.sockets()
        while True:
            with self._cond:
                if self._stopping and not self._commands:
                    self._flush(self.clock())
                    return
                timer = self.core.next_timer()
            if self._commands:
                timer = self.clock()
            now = self.clock()
            timeout = IDLE_WAKE_S if timer is None else min(IDLE_WAKE_S, max(0.0, timer - now))
            ready, _, _ = select.select([*sockets, self._wake_r], [], [], timeout)
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            received = self.transport.receive(s for s in ready if s is not self._wake_r)
            with self._cond:
                now = self.clock()
                while True:
                    with self._commands_lock:
                        if not self._commands:
                            break
                        command = self._commands.popleft()
                    command(now)
                for data, addr in received:
                    self.core.receive_datagram(data, addr, now)
                timer = self.core.next_timer()
                if timer is not None and timer <= now:
                    self.core.handle_timer(now)
                self._flush(now)

    def _flush(self, now: float) -> None:
        """Send what the core queued and act on its events (called with the lock held)."""
        for _ in range(8):
            for data, dest in self.core.datagrams_to_send(now):
                self.transport.send(data, dest)
            events = self.core.events()
            if not events:
                return
            for ev in events:
                if isinstance(ev, BecomeLeader):
                    self._become_leader(ev, now)
                elif isinstance(ev, SteppedDown):
                    log.warning("%s stepping down: %s beats our %s", self.label, ev.winner, ev.own)
                    self.on_step_down(ev.own)
                elif isinstance(ev, LeaderFound):
                    self._generation += 1
                    who = "this node" if ev.leader.is_self else f"{ev.leader.store_ip}"
                    log.info(
                        "%s leader: %s (%s), store port %d",
                        self.label,
                        who,
                        ev.leader.claim,
                        ev.leader.store_port,
                    )
                elif isinstance(ev, LeaderLost):
                    self._generation += 1
                    level = logging.INFO if ev.reason == RESIGNED else logging.WARNING
                    log.log(level, "%s lost leader %s: %s; electing again", self.label, ev.claim, ev.reason)
            self._cond.notify_all()

    def _become_leader(self, ev: BecomeLeader, now: float) -> None:
        ip, port = self.on_become_leader(ev.epoch)
        if not self.core.leader_ready(now, ip, port):
            self.on_step_down(Claim(epoch=ev.epoch, leader=self.core.node_id))
