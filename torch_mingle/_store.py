"""TCPStores, only where torch needs them: each round's store, and the agent's view of it.

How it works
------------
The control plane (joins, rounds, heartbeats) runs on mingle's own connection to the leader
(``_leader.py``, ``_follower.py``); a TCPStore is used only for what torch itself reads:

* Every round gets a fresh TCPStore server on the leader (``StoreKeeper``, on the shell's
  worker thread, opened ahead of time). Its address is the round's ``MASTER_ADDR`` /
  ``MASTER_PORT``, so each round's workers start with a clean key space (torch's workers do
  not prefix keys per round).
* The agent's store (``RendezvousInfo.store``) is ``AgentStore``: a client of that round's
  store under the ``mingle/agent/`` prefix, which tells the leader when the agent enters
  torch's exit barrier, before it counts itself there.
* A TCPStore call against a frozen server blocks for as long as the server stays frozen,
  whatever its timeout. When the node loses the leader, ``cut`` shuts down this process's
  sockets to that leader's stores, so a call blocked in them (ours or the agent's) fails at
  once instead, and so does a connect that was under way at that moment (``_Flights``); the
  node's ``EndedStores`` refuses the stores of its ended rounds to any connect that starts later.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import logging
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from torch.distributed import DistError, DistNetworkError, DistStoreError, PrefixStore, Store, TCPStore

from torch_mingle import _faults, _world
from torch_mingle._errors import StateError
from torch_mingle._jobs import Job, OpenExitBarrier, OpenStore, ReleaseStores
from torch_mingle._wire import parse_ip
from torch_mingle._world import RANK_KEYS, ROLE_INFO_PREFIX
from torch_mingle.errors import MingleClosedError, MingleStateError

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

AGENT_PREFIX = "mingle/agent/"
RANKS_WAIT_SLICE_S = 0.25
CLIENT_TIMEOUT_S = 300.0
#: What a store connect allows, past its own bound, for torch's reverse lookup of the store's
#: address. torch's client resolves the address back to a name before it connects, and as an
#: IPv4-mapped IPv6 address, which /etc/hosts does not hold: the query goes to the resolver, and
#: one that drops it adds its timeout (glibc: 5 s a try, 2 tries with one nameserver,
#: resolv.conf(5)). Seen on loopback, about 1 connect in 60 on a host whose resolver drops
#: queries now and then (docs/networks.md#what-discovery-needs). Only a port that accepted a
#: connection of ours within the bound gets it (``_accepts``): a refused or unanswered port
#: fails within the bound, as before.
RESOLVER_ALLOWANCE_S = 10.0
#: The accept queue of the leader's listeners (control port, round stores). Every node, and
#: then every worker, connects at the same moment; a queue shorter than that drops SYNs and
#: the clients wait out SYN retries (1 s, 3 s, ...) past their connect timeout. The kernel
#: caps it at ``net.core.somaxconn`` (see docs/networks.md#limits).
LISTEN_BACKLOG = 65535


def ip_family(ip: str) -> int:
    """AF_INET6 or AF_INET for an address literal (a wildcard, or IPv6 with ``%scope``, included)."""
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def sockaddr(ip: str, port: int) -> tuple[str, int] | tuple[str, int, int, int]:
    """A connect/bind address for ``ip`` (IPv6 with ``%scope`` resolved) and ``port``."""
    if ":" not in ip:
        return (ip, port)
    info: tuple[Any, ...] = socket.getaddrinfo(ip, port, socket.AF_INET6, socket.SOCK_STREAM)[0][4]
    return (str(info[0]), int(info[1]), int(info[2]), int(info[3]))


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
        listener.listen(LISTEN_BACKLOG)
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


def open_client(
    ip: str, port: int, connect_timeout_s: float, *, ahead: bool = False, ended: EndedStores | None = None
) -> TCPStore:
    """A client of the round store at ``ip:port``; raises torch's ``DistError`` if it cannot connect.

    The connect is bounded by ``connect_timeout_s`` (and ``PROBE_AFTER_S``) for a port that
    refuses or does not answer (and by ``RESOLVER_ALLOWANCE_S`` more for torch's name lookup
    once it has), and by the node for a server that accepted and froze: its cut (``cut``)
    shuts down the socket, also one this very connect opens after the cut began (the connect
    is registered first, see ``_Flights``). ``ahead``: opened while the join waits (its own
    failpoint). ``ended``: the node's stores of ended rounds, refused.
    """
    try:
        _faults.hit("store.connect_ahead" if ahead else "store.connect")
    except _faults.FailpointError as exc:
        raise DistNetworkError(f"{exc}: the client socket has timed out") from None
    flight = _flights.begin(ip, port, ended)
    if flight.refused:
        # Its leader was lost (frozen, maybe): a connect would complete in its kernel and
        # then block in torch for as long as it stays frozen.
        raise DistNetworkError(f"the store at {ip}:{port} belongs to a lost leader")
    allowed = connect_timeout_s + RESOLVER_ALLOWANCE_S
    outcome: list[TCPStore | BaseException] = []

    def connect() -> None:
        try:
            # The port first, by a connect of our own: one that refuses fails here at once.
            # torch's client would try it again until ``allowed`` (and back off past it), on a
            # thread its caller no longer waits for.
            _accepts(ip, port, connect_timeout_s)
            if not flight.was_cut:
                outcome.append(TCPStore(ip, port, None, False, timeout=timedelta(seconds=allowed)))
        except DistNetworkError as exc:
            refused.append(exc)
        except BaseException as exc:  # handed to the caller, raised there
            outcome.append(exc)
        finally:
            _flights.end(flight)

    # On a thread of its own: torch's client tries again, until its bound, a connection that a
    # cut shut down, and its caller must not wait for that (``_Flight.over``).
    refused: list[DistNetworkError] = []
    threading.Thread(target=connect, name=CONNECT_THREAD, daemon=True).start()
    if not flight.over.wait(PROBE_AFTER_S):
        # Not connected at once: the port does not answer (our first connect fails within the
        # bound), or torch's client waits on its name lookup (a second connect of ours gets
        # through, and it has its allowance), or the port went away between our connect and
        # torch's, which torch's would try again until ``allowed``: the second connect fails
        # within the bound and ends the wait (torch's try ends at its own bound on its thread,
        # its client unused). On a thread too, so that a cut still ends the wait at once.
        def probe() -> None:
            try:
                _accepts(ip, port, connect_timeout_s)
            except DistNetworkError as exc:
                refused.append(exc)
                flight.over.set()

        threading.Thread(target=probe, name="mingle-store-probe", daemon=True).start()
        if not flight.over.wait(connect_timeout_s + RESOLVER_ALLOWANCE_S + STRAGGLER_S):
            raise DistNetworkError(f"the connect to the store at {ip}:{port} did not return")
    if flight.was_cut:
        raise DistNetworkError(f"the store at {ip}:{port} belongs to a lost leader (cut while connecting)")
    if not outcome:
        raise refused[0]  # the port refused or did not answer (``over`` is set by nothing else)
    result = outcome[0]
    if isinstance(result, BaseException):
        raise refused[0] if refused else result
    result.set_timeout(timedelta(seconds=CLIENT_TIMEOUT_S))
    return result


def _accepts(ip: str, port: int, timeout_s: float) -> None:
    """A TCP connect of our own to ``ip:port`` within ``timeout_s``, closed at once: it makes no
    name lookup (torch's client does, ``RESOLVER_ALLOWANCE_S``), so a port that refuses or does
    not answer fails within the bound. Raises ``DistNetworkError`` saying which."""
    try:
        with socket.create_connection((ip, port), timeout=timeout_s):
            pass
    except TimeoutError:
        raise DistNetworkError(
            f"the store at {ip}:{port} did not accept a connection within {timeout_s:g}s"
        ) from None
    except OSError as exc:
        raise DistNetworkError(f"the store at {ip}:{port} cannot be reached: {exc.strerror or exc}") from None


class StoreKeeper:
    """The leader's round stores. Runs the leader's store jobs on the shell's worker thread only."""

    def __init__(self, bind_ip: str, connect_ip: str) -> None:
        self.bind_ip = bind_ip
        self.connect_ip = connect_ip
        self._stores: dict[int, TCPStore] = {}

    def run(self, job: Job) -> int | None:
        if isinstance(job, OpenStore):
            _faults.hit("worker.open_store")
            store = open_server(self.bind_ip, self.connect_ip)
            self._stores[int(store.port)] = store
            return int(store.port)
        if isinstance(job, OpenExitBarrier):
            server = self._stores.get(job.port)
            if server is not None and EXIT_BARRIER_KEYS is not None:
                PrefixStore(AGENT_PREFIX, server).set(EXIT_BARRIER_KEYS[1], "opened by the leader")
            return None
        if isinstance(job, ReleaseStores):
            for port in job.ports:
                self._stores.pop(port, None)  # the last reference: the server stops
            return None
        raise TypeError(f"not a store job: {job!r}")

    def close(self) -> None:
        self._stores.clear()


class AgentStore(Store):
    """The agent's store for one round: a prefix of the round's store that reports the exit barrier.

    torch's agent enters its exit barrier with ``add(<terminal state>/num_members, 1)``; just
    before that add, ``on_barrier()`` tells the leader (and waits for its acknowledgement),
    so the leader knows which members arrived and never counts one twice.

    Right after ``next_rendezvous()`` returns, torch's agent writes its role info to this store
    and reads every member's (rank 0), then the ranks rank 0 assigned (every agent), each read
    bounded only by the store's timeout (300 s). A member lost in that window (it died, or its
    own ``next_rendezvous`` joined again) never writes. So those reads wait in slices of
    ``RANKS_WAIT_SLICE_S`` and, only once the node knows that the round broke (``round_broke``:
    a member or the leader lost or gone, a newer round, a failed job; never because a snapshot
    is late), answer with stand-ins: this agent's own role info, and ranks in a world of the
    round's size (``world_size`` nodes of this agent's worker count). torch's agent cannot
    re-join from there (an exception in its rank exchange ends it), so it starts workers in the
    broken round's world, which they cannot complete without the lost member; they never train,
    and the agent's next poll of ``num_nodes_waiting()`` (> 0 already) restarts them for the
    next round. Whatever torch computes, ``_checked`` refuses ranks whose world is smaller than
    the round's: a worker never starts at a world size other than its round's.

    When the job failed (a member's data path check), the node cuts the agent loose from
    the store, where torch's agent may wait for keys that the failed members never write;
    the store error it then gets says why the job failed (``failed()``), not "connection reset".
    """

    def __init__(
        self,
        client: Store,
        on_barrier: Callable[[], None],
        failed: Callable[[], str] = lambda: "",
        round_broke: Callable[[], bool] = lambda: False,
        world_size: int = 1,
        wait_broken: Callable[[float], bool] = lambda timeout_s: False,
        heartbeat_timeout_s: float = 0.0,
    ) -> None:
        super().__init__()
        self._inner = PrefixStore(AGENT_PREFIX, client)
        self._on_barrier = on_barrier
        self._failed = failed
        self._round_broke = round_broke
        self._world_size = world_size
        self._wait_broken = wait_broken
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._counter = EXIT_BARRIER_KEYS[0] if EXIT_BARRIER_KEYS is not None else None
        self._own_role: bytes | None = None

    def _guard(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except (DistError, RuntimeError) as exc:
            why = self._failed()
            if why:
                raise MingleClosedError(f"the job failed: {why}") from exc
            raise

    def set(self, key: str, value: Any) -> None:
        if key.startswith(ROLE_INFO_PREFIX):
            try:
                _faults.hit("agent.lost_before_role_info")
            except _faults.FailpointError:
                os.kill(os.getpid(), signal.SIGKILL)  # a member lost in the window (a test)
            self._own_role = value.encode() if isinstance(value, str) else bytes(value)
        self._unless_round_over(key, lambda: self._guard(lambda: self._inner.set(key, value)), lambda: None)

    def get(self, key: str) -> bytes:
        if key.startswith(RANK_KEYS):
            return self._ranks_read([key], lambda: [bytes(self._inner.get(key))])[0]
        return bytes(self._guard(lambda: self._inner.get(key)))

    def add(self, key: str, value: int) -> int:
        if key == self._counter and value > 0:
            self._on_barrier()
        return int(self._guard(lambda: self._inner.add(key, value)))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return bytes(self._guard(lambda: self._inner.compare_set(key, expected, desired)))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self._guard(lambda: self._inner.wait(keys))
        else:
            self._guard(lambda: self._inner.wait(keys, timeout))

    def check(self, keys: list[str]) -> bool:
        return bool(self._guard(lambda: self._inner.check(keys)))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        if keys and all(k.startswith(RANK_KEYS) for k in keys):
            return self._ranks_read(keys, lambda: list(self._inner.multi_get(keys)))
        return list(self._guard(lambda: self._inner.multi_get(keys)))

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        def write() -> None:
            self._guard(lambda: self._inner.multi_set(keys, values))  # type: ignore[attr-defined]  # missing from torch's stubs

        self._unless_round_over(keys[0] if keys else "", write, lambda: None)

    # ------------------------------------------------------------ ranks

    def _ranks_read(self, keys: list[str], read: Callable[[], list[bytes]]) -> list[bytes]:
        """Read torch's rank keys once they are all there, or stand in for them once the round
        broke (see the class doc): never a wait that only the store's 300 s timeout ends."""
        while True:
            if self._round_broke():
                log.warning(
                    "the round broke before every member took its rank (%s): its workers start in "
                    "the round's world of %d nodes, which they cannot complete, only to be restarted "
                    "for the next round",
                    keys[0],
                    self._world_size,
                )
                return [self._checked(k, self._stand_in(k)) for k in keys]
            try:
                self._inner.wait(keys, timedelta(seconds=RANKS_WAIT_SLICE_S))
            except DistStoreError:
                continue  # not there yet: look at the round again
            except (DistError, RuntimeError):
                if self._broke_after_error():
                    continue  # cut with the round's lost leader
                raise
            return [self._checked(k, v) for k, v in zip(keys, self._guard(read), strict=True)]

    def _unless_round_over(self, key: str, call: Callable[[], None], instead: Callable[[], None]) -> None:
        """``call``; for a rank key whose store failed because the round broke: ``instead``."""
        try:
            call()
        except (DistError, RuntimeError):
            if not (key.startswith(RANK_KEYS) and self._broke_after_error()):
                raise
            instead()

    def _broke_after_error(self) -> bool:
        """A call of the rank exchange failed on the store: whether the round broke, as the node
        says within ``_world.store_error_wait_s`` (a reset comes before the node's word)."""
        wait_s = _world.store_error_wait_s(self._heartbeat_timeout_s)
        return self._round_broke() or self._wait_broken(wait_s)

    def _stand_in(self, key: str) -> bytes:
        return _world.stand_in(key, self._own_role, self._world_size)

    def _checked(self, key: str, value: bytes) -> bytes:
        try:
            return _world.checked(key, value, self._own_role, self._world_size)
        except StateError as exc:
            raise MingleStateError(str(exc)) from exc

    def delete_key(self, key: str) -> bool:
        return bool(self._guard(lambda: self._inner.delete_key(key)))

    def num_keys(self) -> int:
        return int(self._guard(self._inner.num_keys))

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)


#: Nodes of one process that lose the same leader within this long share one scan: it cut
#: every connection of the process to that store (a torchrun agent holds one node; the
#: benchmarks and tests hold up to 64, and 64 scans of 1,000 descriptors starved them).
ABORT_COALESCE_S = 0.5
_last_aborts: dict[tuple[str, tuple[int, ...]], float] = {}
_abort_lock = threading.Lock()


def abort_connections_to(ip: str, ports: Sequence[int]) -> int:
    """Shut down this process's TCP connections to ``ip`` on ``ports``; returns how many.

    A thread blocked in a TCPStore call on such a connection (a frozen leader's store) then
    returns with an error at once. Linux only: elsewhere nothing is done.
    """
    key = (ip, tuple(sorted(ports)))
    with _abort_lock:
        now = time.monotonic()
        if now - _last_aborts.get(key, float("-inf")) < ABORT_COALESCE_S:
            return 0  # another node of this process just cut them all
        _last_aborts[key] = now
        if len(_last_aborts) > 64:
            _last_aborts.pop(next(iter(_last_aborts)))
    return _abort_now(ip, ports)


class EndedStores:
    """One node's stores of ended rounds whose leader was lost: ``open_client`` refuses them.

    The cut (``abort_connections_to``) frees what is blocked at that moment; a connect that
    starts later (a retry, a connect queued behind it) would block on the frozen store again.
    No later round uses an ended round's store, so an entry only has to outlast those, and is
    per node: another node of the process (benchmarks, tests) may still be in that round.
    """

    TTL_S = 30.0
    MAX_ENTRIES = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the loop adds, the agent's thread and the connector ask
        self._cut_at: dict[tuple[str, int], float] = {}  # (address, port) -> monotonic, oldest first

    def add(self, ip: str, ports: Sequence[int]) -> None:
        now = time.monotonic()
        with contextlib.suppress(ValueError), self._lock:
            target = str(_plain(ip))
            for port in ports:
                self._cut_at.pop((target, port), None)
                self._cut_at[(target, port)] = now
            while len(self._cut_at) > self.MAX_ENTRIES or (
                self._cut_at and now - next(iter(self._cut_at.values())) > self.TTL_S
            ):
                self._cut_at.pop(next(iter(self._cut_at)))

    def holds(self, ip: str, port: int) -> bool:
        try:
            key = (str(_plain(ip)), port)
        except ValueError:
            return False
        with self._lock:
            cut_at = self._cut_at.get(key)
        return cut_at is not None and time.monotonic() - cut_at <= self.TTL_S


#: How often a cut looks again for sockets that connects under way opened, and for how long.
CUT_AGAIN_S = 0.02
CUT_FOR_AT_MOST_S = 60.0
#: The thread a store connect runs on (``open_client``).
CONNECT_THREAD = "mingle-store-connect"
#: How long past its own bounds a caller waits for a store connect that never returns.
STRAGGLER_S = 5.0
#: How long a store connect may take before the caller checks again, by a connect of its own,
#: that the port accepts (``_accepts``): torch's connect on loopback takes about a millisecond.
#: The first check, on the connect's own thread before torch's client, costs 0.03 ms; one on
#: a thread of its own with every connect cost a 4-node rendezvous 5 ms (docs/benchmarks.md).
PROBE_AFTER_S = 0.05


@dataclass(eq=False)
class _Flight:
    """One connect to a TCPStore under way (``_Flights``)."""

    token: int
    refused: bool
    #: A cut found it under way: the store belongs to a lost leader.
    was_cut: bool = False
    #: Set when it returned, when a cut found it under way, or when the port proved not to
    #: accept a connection (``open_client``'s own connect).
    over: threading.Event = field(default_factory=threading.Event)


class _Flights:
    """This process's connects to TCPStores under way, so that a cut misses none of them.

    A connect registers before it checks ``EndedStores``, and a cut marks the store ended
    before it looks at the registrations, both under one lock: either the connect sees the mark
    and does not start, or the cut sees the connect and keeps cutting what it opens (a thread,
    ``mingle-cutter``, every ``CUT_AGAIN_S``) until it has returned. Without that, a connect
    that passed the check just before the cut, to a leader that froze, would complete in the
    frozen host's kernel after the cut's scan and block in torch for good.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Each connect under way (a token of its own) and the store it goes to.
        self._under_way: dict[int, tuple[str, int]] = {}
        self._flights: dict[int, _Flight] = {}
        self._tokens = itertools.count(1)

    def begin(self, ip: str, port: int, ended: EndedStores | None) -> _Flight:
        """Register a connect to ``ip:port`` (until ``end``); refused if it must not start."""
        key = _key(ip, port)
        with self._lock:
            if ended is not None and ended.holds(ip, port):
                return _Flight(0, refused=True)
            flight = _Flight(next(self._tokens), refused=False)
            self._under_way[flight.token] = key
            self._flights[flight.token] = flight
        return flight

    def end(self, flight: _Flight) -> None:
        """The connect returned: no cut looks for what it opens any more."""
        with self._lock:
            self._under_way.pop(flight.token, None)
            self._flights.pop(flight.token, None)
        flight.over.set()

    def cut(self, ip: str, ports: Sequence[int], ended: EndedStores | None) -> int:
        with self._lock:
            if ended is not None:
                ended.add(ip, ports)  # first: a connect that starts from now on is refused
            keys = {_key(ip, p) for p in ports}
            # Those under way now; one that starts later (to a store not ended) is not cut.
            pending = {token for token, key in self._under_way.items() if key in keys}
            for token in pending:
                flight = self._flights[token]
                flight.was_cut = True
                flight.over.set()  # its caller goes on now; its thread ends past its bound (back-off)
        count = abort_connections_to(ip, ports)
        if pending:
            threading.Thread(
                target=self._keep_cutting, args=(ip, tuple(ports), pending), name="mingle-cutter", daemon=True
            ).start()
        return count

    def _keep_cutting(self, ip: str, ports: tuple[int, ...], pending: set[int]) -> None:
        deadline = time.monotonic() + CUT_FOR_AT_MOST_S
        while time.monotonic() < deadline:
            with self._lock:
                if pending.isdisjoint(self._under_way):
                    return
            _abort_now(ip, ports)
            time.sleep(CUT_AGAIN_S)
        log.error("connects to %s:%s still under way %gs after their cut", ip, ports, CUT_FOR_AT_MOST_S)

    def under_way(self) -> int:
        with self._lock:
            return len(self._under_way)


_flights = _Flights()


def cut(ip: str, ports: Sequence[int], *, ended: EndedStores | None = None) -> int:
    """Cut this process's connections to the stores at ``ip:ports`` (a lost leader's), also those
    that connects under way open after this call, until they return (``_Flights``); with
    ``ended``, the node refuses those stores to any connect that starts later. Returns how
    many connections were cut at once."""
    return _flights.cut(ip, ports, ended)


def _key(ip: str, port: int) -> tuple[str, int]:
    try:
        return (str(_plain(ip)), port)
    except ValueError:
        return (ip, port)


def _abort_now(ip: str, ports: Sequence[int]) -> int:
    try:
        target = _plain(ip)
        fds = os.listdir("/proc/self/fd")
    except (ValueError, OSError):
        return 0
    wanted = set(ports)
    done = 0
    for name in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                continue
            dup = os.dup(int(name))
        except OSError:
            continue  # gone meanwhile
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue  # the loop's own wake-up pair is a Unix socket, and so may others be
                peer = sock.getpeername()
                if peer[1] not in wanted or _plain(str(peer[0])) != target:
                    continue
                sock.shutdown(socket.SHUT_RDWR)
                done += 1
            except (OSError, ValueError, IndexError, TypeError):
                continue  # closed meanwhile, or not a peer we can read: not ours to cut
    return done


def _plain(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    addr = parse_ip(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr
