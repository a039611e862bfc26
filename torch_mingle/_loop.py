"""The I/O loop of one node: the thread that owns every socket and timer, and drives the ``Node``.

How it works
------------
One thread per node runs a ``selectors`` loop (epoll on Linux: no limit on descriptor
numbers) over the discovery sockets of every interface, the leader's control listener and
the node's control connections. It reads what arrives, hands it to the ``Node`` with the
time, and carries out what the node asks (``Net``): datagrams, connects, frames, closes.

* **Nothing blocks the loop.** Sockets are non-blocking; a connection whose peer stops
  reading is closed once its output has not moved for ``write_timeout_s``, and so is one
  that has more than ``MAX_OUTPUT_BYTES`` waiting. Blocking work (opening a TCPStore,
  resolving ``peers=`` names) runs on one worker thread and comes back as a result.
* **Nothing calls back into the node while it is busy.** Outcomes of the node's own calls
  (a refused connect, a closed connection) are queued and delivered after the call returns.
* **Nothing dies silently.** An exception in the node's code is logged at ERROR and the node
  recovers (a leader resigns, a follower re-joins, ``Node.recover``); more than
  ``MAX_RECOVERIES`` in ``RECOVERY_WINDOW_S``, an error in the recovery itself, or an error in
  the loop, fails the node loudly: the agent's next call raises instead of hanging. The
  worker thread catches every job's error and reports it as that job's result.
* **Other threads** only queue calls (``call``), which the loop runs between its reads.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import selectors
import socket
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

from torch.distributed import TCPStore

from torch_mingle import _faults
from torch_mingle._ballot import NodeState
from torch_mingle._board import Board
from torch_mingle._claims import Dest
from torch_mingle._evidence import Evidence, of_errno
from torch_mingle._frames import from_leader_stream, from_node
from torch_mingle._identity import Identity
from torch_mingle._interfaces import Interface
from torch_mingle._jobs import Job, OpenClient
from torch_mingle._node import Node
from torch_mingle._outbox import Outbox
from torch_mingle._ready import (
    CodeFailed,
    Connected,
    ConnectionAccepted,
    ConnectionClosed,
    DatagramReceived,
    FramesReceived,
    Input,
    Ready,
    Started,
    StateNotRecorded,
    TimerFired,
    WorkDone,
    apply,
)
from torch_mingle._record import field, record
from torch_mingle._slurm import STANDBY_AFTER_S, STANDBY_CHECKS
from torch_mingle._store import (
    LISTEN_BACKLOG,
    EndedStores,
    StoreKeeper,
    cut,
    ip_family,
    open_client,
    sockaddr,
)
from torch_mingle._transport import RENEW_RETRY_S, McastTransport
from torch_mingle._wire import FrameReader
from torch_mingle.errors import MingleStateError

log = logging.getLogger(__name__)

IDLE_WAKE_S = 1.0
MAX_ROUTES = 4096
MAX_OUTPUT_BYTES = 8 * 1024 * 1024
READ_BYTES = 256 * 1024
#: What a node may send the leader: its first frame (hello) is small, a join carries at most a
#: history of 65,536 ids. A connection that has not said hello costs the leader 64 KiB at most.
HELLO_BYTES = 64 * 1024
ACCEPTED_FRAME_BYTES = 2 * 1024 * 1024
CLOSE_FLUSH_S = 2.0
ACCEPT_PAUSE_S = 0.5
MAX_RECOVERIES = 5
RECOVERY_WINDOW_S = 60.0
PEERS_REFRESH_S = 5.0
STOP_JOIN_S = 5.0
#: Linux's option numbers (linux/tcp.h); Python's socket module does not name them.
TCP_THIN_LINEAR_TIMEOUTS, TCP_RTO_MAX_MS, TCP_RTO_MIN_US = 16, 44, 45
#: A control connection's retransmission timeout floor and ceiling (Linux: 200 ms and 120 s).
CONTROL_RTO_MIN_US, CONTROL_RTO_MAX_MS = 20_000, 1_000


@record(frozen=False)
class _Stream:
    id: int
    sock: socket.socket
    connecting: bool
    reader: FrameReader
    out: Outbox = field(default_factory=Outbox)
    stalled_since: float | None = None
    closing_by: float | None = None
    events: int = 0


@record
class _Resolve:
    """Resolve the ``peers=`` names (on the worker thread)."""

    hosts: tuple[str, ...]
    family: int


class Worker:
    """One thread for blocking jobs; every job's outcome (result or error) goes back to the loop."""

    def __init__(
        self,
        execute: Callable[[Any], Any],
        post: Callable[[Callable[[float], None]], None],
        label: str,
        *,
        name: str = "worker",
        on_exit: Callable[[], None] | None = None,
        failure_level: int = logging.WARNING,
    ):
        self._execute = execute
        self._post = post
        self._on_exit = on_exit
        self._failure_level = failure_level
        self._jobs: deque[tuple[Any, Callable[[Any, str | None, float], None]] | None] = deque()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"mingle-{name}{label}", daemon=True)
        self.label = label

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Any, done: Callable[[Any, str | None, float], None]) -> None:
        with self._cond:
            self._jobs.append((job, done))
            self._cond.notify()

    def stop(self, timeout_s: float) -> bool:
        """Finish the queued jobs (then ``on_exit``, on the thread), stop; False if not in ``timeout_s``."""
        with self._cond:
            self._jobs.append(None)
            self._cond.notify()
        if not self._thread.is_alive():
            return True
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                item = self._jobs.popleft()
            if item is None:
                if self._on_exit is not None:
                    self._on_exit()
                return
            job, done = item
            try:
                result, error = self._execute(job), None
            except Exception as exc:  # every job's failure is its result, for the node to judge
                log.log(
                    self._failure_level,
                    "%s background job %s failed: %s",
                    self.label,
                    type(job).__name__,
                    exc,
                )
                result, error = None, f"{type(exc).__name__}: {exc}"
            self._post(functools.partial(_deliver, done, result, error))


class Loop:
    """The real ``Net`` of one node: sockets, timers and a worker thread, driven from one thread."""

    def __init__(
        self,
        transports: list[McastTransport],
        *,
        keeper: StoreKeeper,
        peers: tuple[str, ...] = (),
        standby_peers: tuple[str, ...] = (),
        write_timeout_s: float = 15.0,
        connect_timeout_s: float = 5.0,
        label: str = "",
        clock: Callable[[], float] = time.monotonic,
        membership_refresh_s: float = 60.0,
        identity: Identity | None = None,
    ) -> None:
        self.transports = transports
        self.identity = identity
        self.membership_refresh_s = membership_refresh_s
        self._renew_at = math.inf  # set when the thread starts
        self.keeper = keeper
        self.ended_stores = EndedStores()
        self.peer_hosts = peers
        #: Hosts tried by unicast once the group stayed silent (``_slurm``), and when to look.
        self.standby_peers = standby_peers
        self._standby_at: float | None = None
        self._alone_checks = 0
        self.write_timeout_s = write_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.label = label
        self.clock = clock
        self.node: Node | None = None
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._calls: deque[Callable[[float], None]] = deque()
        # Re-entrant: a signal handler on the agent's thread (SIGTERM: leave) may call in while
        # that thread is inside call() already.
        self._calls_lock = threading.RLock()
        #: What happened since the node last stepped (a wake-up's datagrams, connections,
        #: frames and closes): handed in together, in order (``Node.step``).
        self._inputs: list[Input] = []
        self.board: Board | None = None
        #: When the node asked to step again (``Ready.timer``).
        self._timer: float | None = None
        self._streams: dict[int, _Stream] = {}
        #: The streams with a deadline (closing, or output that stopped moving): the only ones a
        #: wake-up looks at, so a leader of 16,384 members does not scan them all each time.
        self._timed: dict[int, _Stream] = {}
        self._next_id = 0
        self._listener: socket.socket | None = None
        self._accept_paused_until: float | None = None
        self._heard_via: OrderedDict[str, McastTransport] = OrderedDict()
        self._peer_addrs: tuple[str, ...] = ()
        self._next_resolve: float | None = None
        self._recoveries: deque[float] = deque()
        self._stopping = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mingle-loop{label}", daemon=True)
        self.worker = Worker(self.keeper.run, self.call, label, on_exit=self.keeper.close)
        # Names resolve on a thread of their own: a slow resolver never delays a round's store.
        self.resolver = Worker(self._resolve, self.call, label, name="resolver")
        # Clients opened ahead of a round too: a connect to a leader that froze waits out its
        # timeout there, never in front of this node's own stores.
        # Its failures cost nothing but the agent's own connect later: logged at DEBUG.
        self.connector = Worker(
            self._open_client, self.call, label, name="connector", failure_level=logging.DEBUG
        )

    # ------------------------------------------------------------ other threads

    def start(self, node: Node, board: Board) -> None:
        """Open the discovery sockets (errors raise here, in the caller) and start the thread."""
        self.node, self.board = node, board
        opened: list[McastTransport] = []
        try:
            for transport in self.transports:
                opened.append(transport.open())
                for sock in transport.sockets():
                    self._sel.register(sock, selectors.EVENT_READ, ("udp", transport))
        except BaseException:
            for transport in opened:
                transport.close()
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()
            raise
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self.worker.start()
        self.connector.start()
        if self.peer_hosts:
            self.resolver.start()
            self._resolve_peers_now()
        now = self.clock()
        self._renew_at = now + self.membership_refresh_s
        if self.standby_peers and not self.peer_hosts:
            self._standby_at = now + STANDBY_AFTER_S
        self._step([Started()], now)
        self._thread.start()

    def call(self, fn: Callable[[float], None]) -> None:
        """Run ``fn(now)`` on the loop thread, soon (thread-safe)."""
        with self._calls_lock:
            self._calls.append(fn)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def ask(self, event: Input) -> None:
        """Hand the node ``event`` (a request of the agent) on the loop thread, soon (thread-safe)."""
        self.call(lambda now: self._step([event], now))

    def stop(self, timeout_s: float = STOP_JOIN_S) -> None:
        """Stop the thread, finish the worker's queue, close every socket (bounded by ``timeout_s``)."""
        self.call(lambda now: self._begin_stop())
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("%s the loop did not stop within %gs", self.label, timeout_s)
        for worker in (self.worker, self.connector, self.resolver):
            if not worker.stop(timeout_s):
                log.error("%s a background thread did not stop within %gs", self.label, timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def interface_towards(self, ip: str) -> Interface:
        """The interface that reaches ``ip``: where it was heard, else the one on its subnet."""
        return self._route(ip).iface

    # ------------------------------------------------------------ Net (loop thread)

    def send_datagram(self, data: bytes, dest: Dest) -> None:
        if dest is not None:
            self._route(str(dest[0])).send(data, dest)
            return
        for transport in self.transports:
            transport.send(data, None)
        port = self.transports[0].port
        for ip in self._peer_addrs:
            self._route(ip).send(data, (ip, port))

    def listen(self, ip: str) -> int:
        self.stop_listening()
        sock = socket.socket(ip_family(ip), socket.SOCK_STREAM)
        try:
            # No SO_REUSEADDR: with it, Linux may hand out the port of a TCPStore listening on
            # the wildcard address, and TCPStore clients would reach us instead of the store.
            sock.bind(sockaddr(ip, 0))
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._listener = sock
        self._sel.register(sock, selectors.EVENT_READ, ("listen", None))
        return int(sock.getsockname()[1])

    def stop_listening(self) -> None:
        self._accept_paused_until = None
        sock, self._listener = self._listener, None
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
            sock.close()

    def connect(self, conn: int, ip: str, port: int) -> None:
        sock = socket.socket(ip_family(ip), socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            tune_control_socket(sock)
            code = sock.connect_ex(sockaddr(ip, port))
        except OSError:
            sock.close()
            raise
        stream = self._add_stream(sock, connecting=True, conn=conn)
        if code in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            self._watch(stream)
        else:
            self._defer_close(stream, f"connect failed: {errno.errorcode.get(code, code)}", of_errno(code))

    def send(self, conn: int, data: bytes) -> None:
        stream = self._streams.get(conn)
        if stream is None or stream.closing_by is not None:
            return
        stream.out.push(data)  # as it is: a frame sent to many is one object in every queue
        if not stream.connecting:
            self._write(stream, self.clock())

    def close(self, conn: int) -> None:
        stream = self._streams.get(conn)
        if stream is None or stream.closing_by is not None:
            return
        if not stream.out or stream.connecting:
            self._drop(stream)
            return
        stream.closing_by = self.clock() + CLOSE_FLUSH_S
        self._timed[stream.id] = stream
        self._write(stream, self.clock())

    def submit(self, job: Job, tag: int) -> None:
        def done(result: Any, error: str | None, now: float) -> None:
            self._step([WorkDone(job, tag, result, error)], now)

        (self.connector if isinstance(job, OpenClient) else self.worker).submit(job, done)

    def _open_client(self, job: OpenClient) -> TCPStore:
        ip = job.ip or self.keeper.connect_ip
        return open_client(ip, job.port, self.connect_timeout_s, ahead=True, ended=self.ended_stores)

    def abort_connections_to(self, ip: str, ports: Sequence[int], *, ended: bool = False) -> None:
        count = cut(ip, ports, ended=self.ended_stores if ended else None)
        if count:
            log.info("%s cut %d connection(s) to the lost leader's stores at %s", self.label, count, ip)

    def local_ip_towards(self, ip: str) -> str:
        return self._route(ip).iface.address

    def discovery_port_towards(self, ip: str) -> int:
        return self._route(ip).local_address[1]

    def persist(self, state: NodeState) -> bool:
        """Written before the node's vote goes out (``_identity``; nothing to keep without one);
        False: the vote must not go out."""
        return self.identity.save(state) if self.identity is not None else True

    def describe(self) -> str:
        first = self.transports[0]
        where = ", ".join(f"{t.iface.name} ({t.iface.address})" for t in self.transports)
        return f"{where}, group {first.group} port {first.port}"

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._iterate()
            self._drain_closing()
        except BaseException as exc:
            log.exception("%s the mingle loop failed", self.label)
            self._fail(exc)
        finally:
            self._close_all()
            self._stopped.set()

    def _iterate(self) -> None:
        _faults.hit("loop.iterate")
        node = self.node
        assert node is not None  # noqa: S101 - start() sets it
        now = self.clock()
        if now >= self._renew_at:  # a fresh membership report, for snooping switches
            self._guard("renewing the group membership", lambda: self._renew_membership(now), now)
        self._run_calls(now)
        timeout = self._timeout(node, now)
        events = self._sel.select(timeout)
        now = self.clock()
        for key, mask in events:
            kind, obj = key.data
            if kind == "udp":
                self._read_datagrams(key.fileobj, obj, now)  # type: ignore[arg-type]
            elif kind == "wake":
                with contextlib.suppress(OSError):
                    self._wake_r.recv(65536)
            elif kind == "listen":
                self._accept(now)
            elif kind == "stream":
                stream = self._streams.get(obj)
                if stream is not None:
                    self._stream_ready(stream, mask, now)
        self._step([], now)  # one step for everything this wake-up brought
        self._run_calls(now)
        self._housekeeping(now)
        if self._timer is not None and now >= self._timer:
            self._step([TimerFired()], now)
        self._step([], now)

    def _timeout(self, node: Node, now: float) -> float:
        times = [
            self._timer,
            self._next_resolve,
            self._accept_paused_until,
            self._renew_at,
            self._standby_at,
        ]
        times.extend(s.closing_by for s in self._timed.values() if s.closing_by is not None)
        times.extend(
            s.stalled_since + self.write_timeout_s
            for s in self._timed.values()
            if s.stalled_since is not None
        )
        present = [t for t in times if t is not None]
        if self._calls or self._inputs:
            return 0.0
        if not present:
            return IDLE_WAKE_S
        return max(0.0, min(IDLE_WAKE_S, min(present) - now))

    def _renew_membership(self, now: float) -> None:
        self._renew_at = now + self.membership_refresh_s  # first: a failure must not retry at once
        if not all([t.renew_membership() for t in self.transports]):
            self._renew_at = now + RENEW_RETRY_S

    def _run_calls(self, now: float) -> None:
        while self._calls:  # read without the lock: a call added meanwhile wakes the next select
            with self._calls_lock:
                if not self._calls:
                    return
                fn = self._calls.popleft()
            self._guard("a request", lambda fn=fn: fn(now), now)  # type: ignore[misc]

    def _step(self, inputs: list[Input], now: float) -> None:
        """Step the node with ``inputs`` and what else happened since it last stepped, carry
        out its ``Ready`` (``_ready.apply``), and step it again with what that brought back
        (a listening port, a close), until nothing is left."""
        todo = [*self._inputs, *inputs]
        self._inputs = []
        wall_s = wall_clock()  # (its datagrams follow clock steps: NTP)
        while todo and not self._stopping:
            ready = self._guarded_step(todo, now, wall_s)
            todo = []
            if ready is not None:
                self._timer = ready.timer
                try:
                    todo = self._apply(ready)
                except StateNotRecorded as exc:
                    log.error("%s %s", self.label, exc)  # noqa: TRY400 - the advice matters
                    self._fail(exc)
                    return
            todo += self._inputs
            self._inputs = []

    def _apply(self, ready: Ready) -> list[Input]:
        assert self.board is not None  # noqa: S101 - start() sets it
        return apply(ready, self, self.board)

    def _guarded_step(self, inputs: list[Input], now: float, wall_s: float) -> Ready | None:
        """The node's step; an error in its code makes it recover (logged at ERROR: it resigns
        as leader, or joins again), or, when errors keep coming, fails the loop loudly."""
        node = self.node
        if self._stopping or node is None:
            return None  # the loop failed or stops: the node's code runs no more
        try:
            _faults.hit("loop.callback")
            return node.step(inputs, now, wall_s=wall_s)
        except Exception as exc:
            log.exception("%s internal error while handling %s", self.label, type(inputs[0]).__name__)
            self._recoveries.append(now)
            while self._recoveries and now - self._recoveries[0] > RECOVERY_WINDOW_S:
                self._recoveries.popleft()
            if len(self._recoveries) > MAX_RECOVERIES:
                self._fail(exc)
                return None
            try:
                return node.step([CodeFailed(exc)], now, wall_s=wall_s)
            except Exception as again:
                log.exception("%s recovering from an internal error failed", self.label)
                self._fail(again)
                return None

    def _guard(self, what: str, fn: Callable[[], None], now: float) -> None:
        """Run the loop's own work of a call; an error in it fails the loop loudly."""
        if self._stopping:
            return
        try:
            fn()
        except Exception as exc:
            log.exception("%s internal error while handling %s", self.label, what)
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._stopping = True
        if self.board is not None:
            self.board.fail(
                MingleStateError(f"{self.label} the rendezvous loop stopped after an internal error: {exc}")
            )

    def _begin_stop(self) -> None:
        self._stopping = True

    def _drain_closing(self) -> None:
        """Stopping: the last frames of connections being closed (a leave, a job's close) still
        go out, within ``CLOSE_FLUSH_S``; nothing is read or decided any more."""
        deadline = self.clock() + CLOSE_FLUSH_S
        while True:
            pending = [s for s in self._streams.values() if s.closing_by is not None and s.out]
            now = self.clock()
            if not pending or now >= deadline:
                return
            try:
                sel = selectors.DefaultSelector()  # only these, for writing: nothing else wakes it
            except OSError:
                return  # out of descriptors: what is left is lost, as before this drain
            with sel:
                for stream in pending:
                    sel.register(stream.sock, selectors.EVENT_WRITE, stream)
                ready = [key.data for key, _ in sel.select(deadline - now)]
            for stream in ready:
                self._write(stream, self.clock())

    def _housekeeping(self, now: float) -> None:
        if self.identity is not None:
            self.identity.keep_alive()
        if self._accept_paused_until is not None and now >= self._accept_paused_until and self._listener:
            self._accept_paused_until = None
            with contextlib.suppress(KeyError, ValueError):
                self._sel.register(self._listener, selectors.EVENT_READ, ("listen", None))
        if self._next_resolve is not None and now >= self._next_resolve:
            self._resolve_peers_now()
        if self._standby_at is not None and now >= self._standby_at:
            self._use_standby_peers(now)
        for stream in list(self._timed.values()):
            if stream.closing_by is not None and now >= stream.closing_by:
                self._drop(stream)
            elif stream.stalled_since is not None and now - stream.stalled_since > self.write_timeout_s:
                why = f"the peer stopped reading for {self.write_timeout_s:g}s"
                self._defer_close(stream, why, Evidence.UNREACHABLE)

    # ------------------------------------------------------------ datagrams

    def _read_datagrams(self, sock: socket.socket, transport: McastTransport, now: float) -> None:
        node = self.node
        assert node is not None  # noqa: S101
        for data, addr in transport.receive([sock]):
            self._note_route(addr, transport)
            self._inputs.append(DatagramReceived(data, addr))

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

    def _use_standby_peers(self, now: float) -> None:
        """Looked at every ``STANDBY_AFTER_S``: a node still alone (``Node.alone``: multicast
        carries nothing between it and the others) reaches the standby hosts by unicast too,
        for good. At once if it never heard another node; one that did (multicast worked) must
        be alone at ``STANDBY_CHECKS`` looks in a row: a failover leaves a node without a
        leader for a moment, and unicasting every datagram to a thousand hosts is not its cure."""
        assert self.node is not None  # noqa: S101
        self._alone_checks = self._alone_checks + 1 if self.node.alone() else 0
        heard_others = bool(self.node.core.peers)
        if self._alone_checks == 0 or (heard_others and self._alone_checks < STANDBY_CHECKS):
            self._standby_at = now + STANDBY_AFTER_S
            return
        self._standby_at = None
        log.warning(
            "%s alone after %gs: no node of the job reached by multicast; trying the %d hosts of the "
            "Slurm node list by unicast (docs/networks.md#slurm)",
            self.label,
            STANDBY_AFTER_S * self._alone_checks,
            len(self.standby_peers),
        )
        self.peer_hosts = self.standby_peers
        self.resolver.start()
        self._resolve_peers_now()

    def _resolve_peers_now(self) -> None:
        self._next_resolve = None
        family = self.transports[0].iface.family

        def done(result: Any, error: str | None, now: float) -> None:
            if error is None and isinstance(result, tuple):
                self._peer_addrs = result
            self._next_resolve = now + PEERS_REFRESH_S

        self.resolver.submit(_Resolve(self.peer_hosts, family), done)

    def _resolve(self, job: _Resolve) -> tuple[str, ...]:
        return resolve_hosts(job.hosts, job.family, self.label)

    # ------------------------------------------------------------ streams

    def _add_stream(
        self, sock: socket.socket, *, connecting: bool, reader: FrameReader | None = None, conn: int = 0
    ) -> _Stream:
        """A stream under the node's id for it (``conn``, one it opens), or a new one (accepted)."""
        if not conn:
            self._next_id += 1
            conn = self._next_id
        reader = reader or FrameReader(from_leader_stream)  # one it opens goes to a leader
        stream = _Stream(id=conn, sock=sock, connecting=connecting, reader=reader)
        self._streams[stream.id] = stream
        return stream

    def _watch(self, stream: _Stream) -> None:
        wanted = selectors.EVENT_WRITE if stream.connecting else selectors.EVENT_READ
        if stream.out and not stream.connecting:
            wanted |= selectors.EVENT_WRITE
        if wanted == stream.events:
            return
        if stream.events:
            self._sel.modify(stream.sock, wanted, ("stream", stream.id))
        else:
            self._sel.register(stream.sock, wanted, ("stream", stream.id))
        stream.events = wanted

    def _accept(self, now: float) -> None:
        node = self.node
        listener = self._listener
        if listener is None or node is None:
            return
        for _ in range(256):
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # Out of descriptors (EMFILE/ENFILE): pause accepting instead of spinning.
                log.error(  # noqa: TRY400 - the advice matters, the traceback does not
                    "%s cannot accept a node's connection: %s; raise `ulimit -n` (docs/networks.md#limits)",
                    self.label,
                    exc,
                )
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(listener)
                self._accept_paused_until = now + ACCEPT_PAUSE_S
                return
            try:
                sock.setblocking(False)
                tune_control_socket(sock)
            except OSError:
                sock.close()  # reset before we got to it
                continue
            stream = self._add_stream(
                sock, connecting=False, reader=FrameReader(from_node, ACCEPTED_FRAME_BYTES, HELLO_BYTES)
            )
            self._watch(stream)
            source = str(addr[0]) if isinstance(addr, tuple) else ""
            self._inputs.append(ConnectionAccepted(stream.id, source))

    def _stream_ready(self, stream: _Stream, mask: int, now: float) -> None:
        node = self.node
        assert node is not None  # noqa: S101
        if stream.connecting:
            code = stream.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self._defer_close(
                    stream, f"connect failed: {errno.errorcode.get(code, code)}", of_errno(code)
                )
                return
            stream.connecting = False
            self._watch(stream)
            self._inputs.append(Connected(stream.id))
            self._write(stream, now)
            return
        if mask & selectors.EVENT_WRITE:
            self._write(stream, now)
        if mask & selectors.EVENT_READ and stream.id in self._streams:
            self._read(stream, now)

    def _read(self, stream: _Stream, now: float) -> None:
        node = self.node
        assert node is not None  # noqa: S101
        try:
            data = stream.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._defer_close(stream, f"connection error: {exc.strerror or exc}", of_errno(exc.errno))
            return
        if not data:
            self._defer_close(stream, "closed by the peer (or by something on the way)", Evidence.CLOSED)
            return
        if stream.closing_by is not None:
            return  # we are done with it; only its output still drains
        self._inputs.append(FramesReceived(stream.id, stream.reader.feed(data)))

    def _write(self, stream: _Stream, now: float) -> None:
        out = stream.out
        if not out:
            self._stalled(stream, None)
        else:
            try:
                sent = out.send_to(stream.sock)
            except OSError as exc:
                self._defer_close(stream, f"connection error: {exc.strerror or exc}", of_errno(exc.errno))
                return
            if sent:
                self._stalled(stream, None if not out else now)
            elif stream.stalled_since is None:
                self._stalled(stream, now)
            if out.queued > MAX_OUTPUT_BYTES:
                why = f"the peer stopped reading ({out.queued} bytes waiting)"
                self._defer_close(stream, why, Evidence.UNREACHABLE)
                return
        if stream.closing_by is not None and not out:
            self._drop(stream)
            return
        self._watch(stream)

    def _defer_close(self, stream: _Stream, reason: str, evidence: Evidence) -> None:
        """Close ``stream`` now; tell the node after its current call (if it still cares), with
        what was seen (``evidence``: the node's ``_evidence.judge`` decides what it proves)."""
        notify = stream.closing_by is None
        self._drop(stream)
        if notify:
            self._inputs.append(ConnectionClosed(stream.id, reason, evidence))

    def _stalled(self, stream: _Stream, since: float | None) -> None:
        """Set when ``stream``'s output stopped moving (None: it moves, or nothing waits)."""
        stream.stalled_since = since
        if since is not None:
            self._timed[stream.id] = stream
        elif stream.closing_by is None:
            self._timed.pop(stream.id, None)

    def _drop(self, stream: _Stream) -> None:
        self._timed.pop(stream.id, None)
        if self._streams.pop(stream.id, None) is None:
            return
        if stream.events:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(stream.sock)
        stream.sock.close()

    def _close_all(self) -> None:
        for stream in list(self._streams.values()):
            self._drop(stream)
        self.stop_listening()
        for transport in self.transports:
            transport.close()
        with contextlib.suppress(OSError):
            self._wake_r.close()
        with contextlib.suppress(OSError):
            self._wake_w.close()
        self._sel.close()


def tune_control_socket(sock: socket.socket) -> None:
    """A control connection carries small frames that must not wait: no Nagle delay; and, on
    Linux, quick retransmissions. Heartbeats keep fewer than four segments in flight (a thin
    stream, tcp(7)): with linear timeouts a segment lost again is resent every RTO instead of
    after 0.2, 0.4, 0.8, 1.6 s, and a lower RTO floor (20 ms against 200 ms; kernels from 6.11
    on) and ceiling (1 s; from 6.15) shorten each try. Every later frame waits behind a lost
    segment, so each stretch of retransmissions is a silence the heartbeat timeout must outlast:
    on a link that loses 20 % of its packets both ways it reached 4.5 s with Linux's defaults
    (measured: ``benchmarks/lossy_heartbeats.py``, docs/faults.md#detection-and-the-knobs).
    Options the kernel does not know are skipped."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not sys.platform.startswith("linux"):
        return
    for option, value in (
        (TCP_THIN_LINEAR_TIMEOUTS, 1),
        (TCP_RTO_MIN_US, CONTROL_RTO_MIN_US),
        (TCP_RTO_MAX_MS, CONTROL_RTO_MAX_MS),
    ):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def wall_clock() -> float:
    """The wall clock that signed datagrams carry (a seam for the clock-step test)."""
    return time.time()


def _deliver(
    done: Callable[[Any, str | None, float], None], result: Any, error: str | None, now: float
) -> None:
    done(result, error, now)


def resolve_hosts(hosts: tuple[str, ...], family: int, label: str = "") -> tuple[str, ...]:
    """Every address of ``hosts`` (names or addresses; a headless Service's name gives every pod)."""
    found: list[str] = []
    for host in hosts:
        try:
            infos = socket.getaddrinfo(host, None, family, socket.SOCK_DGRAM)
        except OSError as exc:
            log.debug("%s peers: %s does not resolve (yet): %s", label, host, exc)
            continue
        found.extend(str(info[4][0]) for info in infos)
    return tuple(dict.fromkeys(found))
