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
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from torch_mingle._interfaces import Interface
from torch_mingle._protocol import (
    RESIGNED,
    BecomeLeader,
    Claim,
    Dest,
    Discovery,
    LeaderFound,
    LeaderLost,
    LeaderView,
    Role,
    Stats,
    SteppedDown,
)
from torch_mingle._transport import McastTransport, PeerList
from torch_mingle.errors import README_NETWORKS

log = logging.getLogger(__name__)

IDLE_WAKE_S = 1.0
MAX_ROUTES = 4096


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
    """Runs one ``Discovery`` core over the transports of one or more interfaces in a daemon thread.

    Group datagrams go out on every interface (and by unicast to ``peers``); a reply goes out
    on the interface its destination was last heard on. ``heard_via(ip)`` tells the handler
    which interface reaches a peer.
    """

    def __init__(
        self,
        core: Discovery,
        transports: list[McastTransport],
        *,
        peers: PeerList | None = None,
        on_become_leader: Callable[[int], tuple[str, int]],
        on_step_down: Callable[[Claim], None],
        label: str,
        quiet_warning_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.transports = transports
        self.peers = peers
        self._by_socket: dict[socket.socket, McastTransport] = {}
        self._heard_via: OrderedDict[str, McastTransport] = OrderedDict()
        self.on_become_leader = on_become_leader
        self.on_step_down = on_step_down
        self.label = label
        self.clock = clock
        self.quiet_warning_s = quiet_warning_s
        self._quiet_check_at: float | None = None
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
        opened = []
        try:
            for transport in self.transports:
                opened.append(transport.open())
                for sock in transport.sockets():
                    self._by_socket[sock] = transport
        except BaseException:
            for transport in opened:
                transport.close()
            raise
        if self.peers is not None:
            self.peers.start()
        if self.quiet_warning_s > 0:
            self._quiet_check_at = self.clock() + self.quiet_warning_s
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
                send_errors=sum(t.send_errors for t in self.transports),
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
        for transport in self.transports:
            transport.close()
        if self.peers is not None:
            self.peers.stop()
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
        sockets = list(self._by_socket)
        while True:
            with self._cond:
                if self._stopping and not self._commands:
                    self._flush(self.clock())
                    return
                timer = self.core.next_timer()
            if self._commands:
                timer = self.clock()
            if self._quiet_check_at is not None:
                timer = self._quiet_check_at if timer is None else min(timer, self._quiet_check_at)
            now = self.clock()
            timeout = IDLE_WAKE_S if timer is None else min(IDLE_WAKE_S, max(0.0, timer - now))
            ready, _, _ = select.select([*sockets, self._wake_r], [], [], timeout)
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            received: list[tuple[bytes, Dest, McastTransport]] = []
            for sock in ready:
                transport = self._by_socket.get(sock)
                if transport is not None:
                    received.extend((data, addr, transport) for data, addr in transport.receive([sock]))
            with self._cond:
                now = self.clock()
                while True:
                    with self._commands_lock:
                        if not self._commands:
                            break
                        command = self._commands.popleft()
                    command(now)
                for data, addr, transport in received:
                    self._note_route(addr, transport)
                    self.core.receive_datagram(data, addr, now)
                timer = self.core.next_timer()
                if timer is not None and timer <= now:
                    self.core.handle_timer(now)
                self._flush(now)
                if self._quiet_check_at is not None and now >= self._quiet_check_at:
                    self._quiet_check_at = None
                    self._warn_if_alone()

    def _flush(self, now: float) -> None:
        """Send what the core queued and act on its events (called with the lock held)."""
        for _ in range(8):
            for data, dest in self.core.datagrams_to_send(now):
                self._send(data, dest)
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

    def _warn_if_alone(self) -> None:
        """Nothing heard from the job's other nodes yet: say early that multicast may be blocked."""
        if self.core.peers:
            return
        first = self.transports[0]
        where = ", ".join(f"{t.iface.name} ({t.iface.address})" for t in self.transports)
        job = self.core.job
        log.warning(
            "%s no other node of job %r heard on %s, group %s port %d, in %gs: either they have not "
            "started, or multicast does not reach them (probably blocked between the nodes). Check with "
            "`python -m torch_mingle doctor --job %s` on each node; fallback=broadcast or peers=HOST;HOST "
            "work without multicast (%s)",
            self.label,
            job,
            where,
            first.group,
            first.port,
            self.quiet_warning_s,
            job,
            README_NETWORKS,
        )

    def _send(self, data: bytes, dest: Dest) -> None:
        if dest is not None:
            self._route(str(dest[0])).send(data, dest)
            return
        for transport in self.transports:
            transport.send(data, None)
        if self.peers is not None:
            port = self.transports[0].port
            for ip in self.peers.addresses():
                self._route(ip).send(data, (ip, port))

    def _note_route(self, addr: Dest, transport: McastTransport) -> None:
        if addr is None or len(self.transports) == 1:
            return
        ip = str(addr[0])
        self._heard_via[ip] = transport
        self._heard_via.move_to_end(ip)
        if len(self._heard_via) > MAX_ROUTES:
            self._heard_via.popitem(last=False)

    def _route(self, ip: str) -> McastTransport:
        via = self._heard_via.get(ip)
        if via is not None:
            return via
        return next((t for t in self.transports if t.iface.holds_network_of(ip)), self.transports[0])

    def heard_via(self, ip: str) -> Interface:
        """The interface that reaches ``ip``: where it was heard, else the one on its subnet."""
        with self._cond:
            return self._route(ip).iface

    def _become_leader(self, ev: BecomeLeader, now: float) -> None:
        ip, port = self.on_become_leader(ev.epoch)
        if not self.core.leader_ready(now, ip, port):
            self.on_step_down(Claim(epoch=ev.epoch, leader=self.core.node_id))
