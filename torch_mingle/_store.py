"""Rounds on the leader's TCPStore: the leader's round master and each node's session.

How it works
------------
The leader hosts a *control* store for its term. Nodes talk to the leader's round master
through an ordered event log on that store: a node reserves a slot with the atomic
``add("mingle/ev", 1)`` and writes its event (join, close, leave) into ``mingle/ev/<n>``.
The master blocks in ``wait()`` on the next slot (no polling), applies each event to its
``RoundBook`` and, when the book says ``Form``, publishes the round and answers every
admitted join at ``mingle/ev/<n>/reply``; the joiners were blocked in ``wait()`` on that
key. Deaths reported by the liveness channel enter the same log, so one thread decides.

Every round gets a fresh TCPStore (port 0) on the leader: it is the store handed to the
elastic agent and named by ``MASTER_ADDR``/``MASTER_PORT``, so each round's workers start
with a clean key space (torch's workers do not prefix keys per round). The last two round
stores are kept, so agents still in an exit barrier of the previous round keep theirs.

torch's agents end a job in an *exit barrier* on their agent store: each adds itself to a
counter and waits (300 s by default) until the last one arrives. A node whose workers failed
never arrives; it shuts down instead, and the leader hears it leave. The round master counts
members of the current round that left or died as arrived, and opens the barrier once the
count is full, so the others exit at once instead of sitting out the timeout.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch.distributed import DistError, DistNetworkError, DistStoreError, PrefixStore, TCPStore

from torch_mingle._liveness import LivenessServer, ip_family, sockaddr
from torch_mingle._protocol import Claim
from torch_mingle._rounds import Form, History, JoinRequest, Round, RoundBook, Status, node_hex

try:  # torch's exit-barrier keys in an agent store: the counter and "the last one arrived"
    from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
    from torch.distributed.elastic.utils.store import _LAST_MEMBER_CHECKIN, _NUM_MEMBERS

    EXIT_BARRIER_KEYS: tuple[str, str] | None = (
        _TERMINAL_STATE_SYNC_ID + _NUM_MEMBERS,
        _TERMINAL_STATE_SYNC_ID + _LAST_MEMBER_CHECKIN,
    )
except ImportError:  # pragma: no cover - a torch that renamed them: its agents wait out their timeout
    EXIT_BARRIER_KEYS = None

log = logging.getLogger(__name__)

EPOCH_KEY = "mingle/epoch"
LIVENESS_KEY = "mingle/liveness_port"
STATUS_KEY = "mingle/status"
EV_COUNTER = "mingle/ev"
HOLE_CHECK_S = 2.0
FOREVER = timedelta(days=365)
ROUND_STORES_KEPT = 2
CLIENT_TIMEOUT_S = 300.0
#: TCPStore's own connect retries a refused port until this passes: a leader that steps down
#: between our probe and the handshake costs this long. Long enough for a slow reverse lookup.
HANDSHAKE_TIMEOUT_S = 15.0


def agent_store(control: TCPStore, round_number: int) -> PrefixStore:
    """The elastic agents' store for one round: a key space of its own on the control store."""
    return PrefixStore(f"mingle/agent/{round_number}/", control)


def ev_key(seq: int) -> str:
    return f"mingle/ev/{seq}"


def reply_key(seq: int) -> str:
    return f"mingle/ev/{seq}/reply"


def round_key(number: int) -> str:
    return f"mingle/round/{number}"


def epoch_value(claim: Claim) -> str:
    return f"{claim.epoch}:{node_hex(claim.leader)}"


class LeaderUnreachable(Exception):
    """The leader's store or liveness channel cannot be used; the claim should be fenced."""


class JoinClosed(Exception):
    """The job's rendezvous is closed."""


class JoinAborted(Exception):
    """The leader asks this node to join again (it had declared the node dead)."""


class JoinTimeout(Exception):
    """``join_timeout`` passed while waiting for a round."""


def probe(ip: str, port: int, timeout_s: float) -> None:
    """Plain TCP connect: the evidence that a leader is gone (refused, unreachable, no answer).

    TCPStore's own connect retries a refused port until its timeout, and its handshake can
    stall on things that say nothing about the peer (see ``open_client``).
    """
    with socket.socket(ip_family(ip), socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(sockaddr(ip, port))


def open_client(
    ip: str, port: int, probe_timeout_s: float, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
) -> TCPStore:
    """A TCPStore client to ``ip:port``; raises ``LeaderUnreachable`` if the probe or handshake fails.

    Once the port answered, the handshake gets ``handshake_timeout_s``: TCPStore resolves the
    peer's address back to a name (getnameinfo) for its logs on every connect, and a resolver
    that drops queries stalls that for seconds without saying anything about the leader.
    """
    try:
        probe(ip, port, probe_timeout_s)
    except OSError as exc:
        raise LeaderUnreachable(f"cannot connect to the leader's store at {ip}:{port}: {exc}") from exc
    try:
        store = TCPStore(ip, port, None, False, timeout=timedelta(seconds=handshake_timeout_s))
    except (DistError, RuntimeError) as exc:
        raise LeaderUnreachable(f"the store at {ip}:{port} answered but its handshake failed: {exc}") from exc
    store.set_timeout(timedelta(seconds=CLIENT_TIMEOUT_S))
    return store


def open_server(ip: str, connect_ip: str | None = None) -> TCPStore:
    """A TCPStore server on a free port of ``ip`` (an address, or 0.0.0.0 / :: for every one).

    ``connect_ip`` is where the server object's own client connects (``ip`` by default; give
    a loopback address when ``ip`` is a wildcard).

    We bind the listening socket ourselves: an IPv4 listener makes the store see IPv4 peers,
    which /etc/hosts resolves for loopback, instead of IPv4-mapped IPv6 ones that always go
    to DNS (TCPStore resolves every peer for its logs, and a slow resolver stalls the store).
    """
    global _libuv_takes_listen_fd  # noqa: PLW0603 - learnt once per process
    if _libuv_takes_listen_fd:
        try:
            return _server_on_own_listener(ip, connect_ip, use_libuv=True)
        except (NotImplementedError, RuntimeError) as exc:
            # torch before 2.8: the libuv server (the default since 2.4) cannot take over a
            # listening socket; the classic one can, and does the same job.
            log.debug("libuv TCPStore refused our listening socket (%s); using the classic server", exc)
            _libuv_takes_listen_fd = False
    return _server_on_own_listener(ip, connect_ip, use_libuv=False)


_libuv_takes_listen_fd = True


def _server_on_own_listener(ip: str, connect_ip: str | None, *, use_libuv: bool) -> TCPStore:
    listener = socket.socket(ip_family(ip), socket.SOCK_STREAM)
    try:
        listener.bind(sockaddr(ip, 0))
        listener.listen(1024)
        port = int(listener.getsockname()[1])
        store = TCPStore(
            connect_ip or ip, port, None, True, timeout=timedelta(seconds=CLIENT_TIMEOUT_S),
            wait_for_workers=False, master_listen_fd=listener.fileno(), use_libuv=use_libuv,
        )  # fmt: skip
    except BaseException:
        with contextlib.suppress(OSError):  # a refusing store may have closed it already
            listener.close()
        raise
    listener.detach()  # the store owns the descriptor from here on and closes it
    return store


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, DistStoreError) and not isinstance(exc, DistNetworkError)


class MemberSession:
    """One node's connection to the control store of one leader's term."""

    def __init__(
        self, claim: Claim, ip: str, port: int, *, node: int, timeout_s: float, op_timeout_s: float
    ) -> None:
        self.claim = claim
        self.ip = ip
        self.port = port
        self.node = node
        self._ops = open_client(ip, port, timeout_s)
        # Once connected, a plain operation that takes this long means the leader is stuck
        # (or this store is not a leader's at all: the keys below never appear).
        self._ops.set_timeout(timedelta(seconds=op_timeout_s))
        try:
            epoch, liveness = self._call(lambda: self._ops.multi_get([EPOCH_KEY, LIVENESS_KEY]))
        except DistError as exc:
            raise LeaderUnreachable(f"the store at {ip}:{port} is not the store of {claim}: {exc}") from exc
        if epoch.decode() != epoch_value(claim):
            raise LeaderUnreachable(
                f"the store at {ip}:{port} belongs to {epoch.decode()}, not to {claim}: a stale announcement"
            )
        self.liveness_port = int(liveness)

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (DistError, RuntimeError, OSError) as exc:
            if _is_timeout(exc):
                raise
            raise LeaderUnreachable(f"the leader's store at {self.ip}:{self.port} failed: {exc}") from exc

    def push(self, kind: str, **fields: Any) -> int:
        payload = json.dumps({"t": kind, "node": node_hex(self.node), **fields})

        def push() -> int:
            seq = int(self._ops.add(EV_COUNTER, 1))
            self._ops.set(ev_key(seq), payload)
            return seq

        seq: int = self._call(push)
        return seq

    def join(self, *, ip: str, history: History | None, deadline: float, spare_wait_s: float) -> Round:
        """Ask for a place in the next round and block until it forms (or closes, or the leader goes).

        If the deadline passes while a round of this job runs without us (we are a spare, or
        the members have not restarted yet), we keep waiting, ``spare_wait_s`` at a time:
        the job is alive, so there is nothing to time out on.
        """
        seq = self.push("join", ip=ip, history=history.to_json() if history else None)
        while True:
            left = timedelta(seconds=max(0.001, deadline - time.monotonic()))
            try:
                self._call(functools.partial(self._ops.wait, [reply_key(seq)], left))
                break
            except DistError as exc:
                status = self.status()
                if status.closed or status.round == 0:
                    raise JoinTimeout(f"no round formed (join request #{seq})") from exc
                log.info(
                    "round %d runs with %d nodes; still waiting for a place (join request #%d)",
                    status.round,
                    status.size,
                    seq,
                )
                deadline = time.monotonic() + spare_wait_s
        reply = json.loads(self._call(lambda: self._ops.get(reply_key(seq))))
        if reply.get("closed"):
            raise JoinClosed("the rendezvous was closed while this node waited")
        if "retry" in reply:
            raise JoinAborted(str(reply["retry"]))
        return Round.from_json(reply["round"])

    def status(self) -> Status:
        return Status.decode(self._call(lambda: self._ops.get(STATUS_KEY)))

    def agent_store(self, round_number: int) -> PrefixStore:
        """The agent's store for one round, on the connection we already hold (no new socket)."""
        return agent_store(self._ops, round_number)


class EventLog:
    """Appends events to the leader's log from threads other than the master (thread-safe)."""

    def __init__(self, store: TCPStore) -> None:
        self._client: TCPStore | None = store
        self._lock = threading.Lock()

    def close(self) -> None:
        """Drop the store: when it is the control server object, that stops the server."""
        with self._lock:
            self._client = None

    def _store(self) -> TCPStore:
        if self._client is None:
            raise RuntimeError("the event log is closed")
        return self._client

    def push(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload)
        with self._lock:
            store = self._store()
            seq = int(store.add(EV_COUNTER, 1))
            store.set(ev_key(seq), data)

    def fill_hole(self, seq: int) -> bool:
        """If slot ``seq`` was reserved but never written, write a no-op there; True if we did."""
        with self._lock:
            store = self._store()
            if int(store.add(EV_COUNTER, 0)) < seq or store.check([ev_key(seq)]):
                return False
            skip = json.dumps({"t": "skip"})
            return bool(store.compare_set(ev_key(seq), "", skip) == skip.encode())

    def slot_missing(self, seq: int) -> bool:
        with self._lock:
            store = self._store()
            return int(store.add(EV_COUNTER, 0)) >= seq and not store.check([ev_key(seq)])


class RoundMaster:
    """The leader's thread that applies the event log to its ``RoundBook`` and publishes rounds.

    It blocks in ``wait()`` on the next slot of the log and never wakes on its own: a ticker
    thread pushes a ``tick`` event when the book's deadline (the last call) is due, and
    repairs a slot whose writer died between reserving and writing it.
    """

    def __init__(
        self,
        *,
        ip: str,
        connect_ip: str,
        control_port: int,
        book: RoundBook,
        events: EventLog,
        on_status: Callable[[Status], None],
        label: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ip = ip  # where round stores listen, and the address rounds publish (may be a wildcard)
        self.connect_ip = connect_ip
        self.book = book
        self.events = events
        self.on_status = on_status
        self.label = label
        self.clock = clock
        self.all_gone = threading.Event()
        self.round_stores: dict[int, TCPStore] = {}
        self._spare_store: TCPStore | None = None
        self._client = open_client(connect_ip, control_port, CLIENT_TIMEOUT_S)
        self._stopping = False
        self._status: Status | None = None
        self._next_seq = 1
        self._deadline: float | None = None
        self._barrier_open_for = 0  # the last round whose exit barrier is known to be open
        self._barrier_watch = False  # members left before the others arrived: the ticker re-checks
        self._tick_cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"mingle-master{label}", daemon=True)
        self._ticker = threading.Thread(target=self._tick_loop, name=f"mingle-ticker{label}", daemon=True)

    def start(self) -> None:
        self._spare_store = open_server(self.ip, self.connect_ip)
        self._publish_status()
        self._thread.start()
        self._ticker.start()

    def stop(self) -> None:
        self._stopping = True
        with self._tick_cond:
            self._tick_cond.notify_all()
        if self._thread.is_alive():
            with contextlib.suppress(DistError, RuntimeError):
                self.events.push({"t": "stop"})
        for thread in (self._thread, self._ticker):
            if thread.is_alive() and threading.current_thread() is not thread:
                thread.join(timeout=10)
        self.round_stores.clear()
        self._spare_store = None

    # ---------------------------------------------------------------- master

    def _run(self) -> None:
        try:
            self._loop()
        except (DistError, RuntimeError) as exc:
            if not self._stopping:
                log.warning("%s round master stopped: the control store failed: %s", self.label, exc)

    def _loop(self) -> None:
        client = self._client
        while not self._stopping:
            decision = self.book.decide(self.clock())
            if isinstance(decision, Form):
                self._form(decision)
                continue
            self._publish_status()
            with self._tick_cond:
                self._deadline = decision.until
                self._tick_cond.notify_all()
            client.wait([ev_key(self._next_seq)], FOREVER)
            for event in self._read_events():
                self._apply(self._next_seq, json.loads(event))
                self._next_seq += 1

    def _read_events(self) -> list[bytes]:
        """The next event and every one already written after it, in one round trip when possible."""
        client = self._client
        last = int(client.add(EV_COUNTER, 0))
        keys = [ev_key(seq) for seq in range(self._next_seq, max(last, self._next_seq) + 1)]
        if len(keys) > 1 and client.check(keys):
            return list(client.multi_get(keys))
        return [client.get(keys[0])]

    def _reply(self, seq: int, **answer: Any) -> None:
        self._client.set(reply_key(seq), json.dumps(answer))

    def _apply(self, seq: int, event: dict[str, Any]) -> None:
        kind = event.get("t")
        if kind == "stop":
            # Whoever still waits for a round of ours must go and find the new leader.
            for waiting in [r.seq for r in self.book.pending.values()]:
                self._reply(waiting, retry="the leader stepped down")
            self._stopping = True
            return
        if kind == "tick":
            self._open_exit_barrier()
            return
        if kind == "skip":
            return
        node = int(event["node"], 16)
        if kind == "join":
            hist = event.get("history")
            self.book.join(
                JoinRequest(
                    node=node, seq=seq, ip=event["ip"], history=History.from_json(hist) if hist else None
                )
            )
            if self.book.closed:
                self._reply(seq, closed=True)
        elif kind == "close":
            for waiting in self.book.close():
                self._reply(waiting, closed=True)
            log.info("%s rendezvous closed by node %s", self.label, event["node"])
        elif kind == "leave":
            self.book.leave(node)
        elif kind == "dead" and node not in self.book.left:
            log.warning("%s node %s is gone: %s", self.label, event["node"], event.get("why"))
            dropped = self.book.died(node)
            if dropped is not None:
                self._reply(dropped, retry=f"the leader declared this node dead: {event.get('why')}")
        if kind in ("leave", "dead"):
            self._open_exit_barrier()
        if self.book.closed and self.book.all_gone():
            self.all_gone.set()

    def _open_exit_barrier(self) -> None:
        """Count the current round's members that left or died as arrived at torch's exit barrier."""
        rnd = self.book.current
        gone = self.book.departed()
        if rnd is None or not gone or EXIT_BARRIER_KEYS is None or self._barrier_open_for >= rnd.number:
            self._barrier_watch = False
            return
        counter, last = EXIT_BARRIER_KEYS
        store = agent_store(self._client, rnd.number)
        if store.check([last]):  # every member arrived: it opened by itself
            self._barrier_open_for, self._barrier_watch = rnd.number, False
            return
        arrived = int(store.add(counter, 0))
        self._barrier_watch = arrived + len(gone) < rnd.world_size
        if self._barrier_watch:
            return
        self._barrier_open_for = rnd.number
        if arrived:  # else nobody waits there
            store.set(last, "opened by the leader")
            log.info(
                "%s exit barrier of round %d opened: %d node(s) arrived, %d left or died (%s)",
                self.label,
                rnd.number,
                arrived,
                len(gone),
                " ".join(sorted(node_hex(n) for n in gone)),
            )

    def _form(self, form: Form) -> None:
        number = self.book.last_round_number + 1
        store, self._spare_store = self._spare_store or open_server(self.ip, self.connect_ip), None
        self.round_stores[number] = store
        for old in [n for n in self.round_stores if n <= number - ROUND_STORES_KEPT]:
            del self.round_stores[old]
        rnd = Round(
            number=number,
            epoch=self.book.epoch,
            members=form.members,
            store_ip=self.ip,
            store_port=store.port,
            ips=form.ips,
        )
        reply = json.dumps({"round": rnd.to_json()})
        self._client.multi_set(  # type: ignore[attr-defined]  # missing from torch's stubs
            [round_key(number), *(reply_key(s) for s in form.admitted)],
            [rnd.encode(), *([reply] * len(form.admitted))],
        )
        self.book.formed(rnd)
        self._publish_status()
        # The next round's store is made now, off the path of the nodes that wait for a round.
        self._spare_store = open_server(self.ip, self.connect_ip)
        log.info(
            "%s round %d formed (%s): world size %d, store %s:%d, members %s",
            self.label,
            number,
            form.reason,
            rnd.world_size,
            self.ip,
            store.port,
            " ".join(node_hex(m) for m in form.members),
        )

    def _publish_status(self) -> None:
        status = self.book.status()
        if status == self._status:
            return
        self._status = status
        self._client.set(STATUS_KEY, status.encode())
        self.on_status(status)

    # ---------------------------------------------------------------- ticker

    def _tick_loop(self) -> None:
        suspect: int | None = None
        next_check = self.clock() + HOLE_CHECK_S
        with self._tick_cond:
            while not self._stopping:
                now = self.clock()
                due = self._deadline
                if due is not None and now >= due:
                    self._deadline = None
                    self._safely(lambda: self.events.push({"t": "tick"}))
                elif now >= next_check:
                    next_check = now + HOLE_CHECK_S
                    suspect = self._check_hole(suspect)
                    if self._barrier_watch:  # see whether the rest of the round reached its exit barrier
                        self._safely(lambda: self.events.push({"t": "tick"}))
                else:
                    self._tick_cond.wait((next_check if due is None else min(due, next_check)) - now)

    def _check_hole(self, suspect: int | None) -> int | None:
        """A slot missing on two checks in a row had a writer that died: fill it so the master moves on."""
        seq = self._next_seq
        if not self._safely(lambda: self.events.slot_missing(seq)):
            return None
        if suspect != seq:
            return seq
        if self._safely(lambda: self.events.fill_hole(seq)):
            log.warning("%s skipped event #%d: its writer died mid-write", self.label, seq)
        return None

    def _safely(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (DistError, RuntimeError) as exc:
            if not self._stopping:
                log.debug("%s ticker: store call failed: %s", self.label, exc)
            return None


class LeaderHost:
    """Everything the leader hosts for its term: control store, liveness server, round master."""

    def __init__(
        self,
        *,
        ip: str,
        connect_ip: str,
        claim: Claim,
        book: RoundBook,
        keep_alive_interval_s: float,
        keep_alive_timeout_s: float,
        on_status: Callable[[Status], None],
        label: str,
    ) -> None:
        self.ip = ip
        self.claim = claim
        self.label = label
        self.control = open_server(ip, connect_ip)
        self.port = int(self.control.port)
        self.control.set(EPOCH_KEY, epoch_value(claim))
        self.events = EventLog(self.control)
        self.liveness = LivenessServer(
            ip,
            interval_s=keep_alive_interval_s,
            timeout_s=keep_alive_timeout_s,
            on_dead=lambda node, why: self.events.push({"t": "dead", "node": node_hex(node), "why": why}),
            label=label,
        )
        self.control.set(LIVENESS_KEY, str(self.liveness.start()))

        def status_changed(status: Status) -> None:
            self.liveness.publish(status.encode())
            on_status(status)

        self.master = RoundMaster(
            ip=ip,
            connect_ip=connect_ip,
            control_port=self.port,
            book=book,
            events=self.events,
            on_status=status_changed,
            label=label,
        )
        self.master.start()

    def wait_all_gone(self, timeout_s: float) -> bool:
        return self.master.all_gone.wait(timeout_s)

    def stop(self) -> None:
        self.liveness.stop()
        self.master.stop()
        self.events.close()
        del self.control  # the last reference: the store server stops and its clients see EOF
