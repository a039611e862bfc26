"""The data path, checked before a round's workers start.

A wrong interface or a firewall between two nodes otherwise shows only after the round
formed, as a gloo or NCCL process group that hangs. Every node therefore listens on a TCP
port of its own (``ProbeListener``, told to the leader with each join and to every member in
the round), and before ``next_rendezvous`` returns it opens a connection to its peers on the
address each advertised, the one its workers will use: to every peer in small rounds, in
large ones to a bounded number (``_agent.peers_to_probe``: ring neighbours first, then peers at
power-of-two distances). Connects run at once, non-blocking, under one deadline.

The listener never accepts on its own: the kernel completes the handshake, which is what is
checked, and each join first drains what the previous round's probes left in the queue.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import time
from collections.abc import Sequence
from typing import Any

from torch_mingle._record import record
from torch_mingle._wire import parse_ip
from torch_mingle.errors import README_NETWORKS, MingleConnectionError

LISTEN_BACKLOG = 1024


class MingleDataPathError(MingleConnectionError):
    """Two nodes of a round cannot open a TCP connection on their workers' addresses."""


@record
class Unreachable:
    rank: int
    ip: str
    port: int
    why: str


class ProbeListener:
    """This node's probe port: a listening TCP socket on every address of ``family``."""

    def __init__(self, family: int) -> None:
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if family == socket.AF_INET6:
                self._sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            self._sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))  # noqa: S104 - every address: peers probe the one they know
            self._sock.listen(LISTEN_BACKLOG)
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]

    def drain(self) -> int:
        """Close what earlier probes left in the accept queue; returns how many."""
        drained = 0
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return drained
            except OSError:
                return drained  # closed, or out of descriptors: the queue is bounded anyway
            conn.close()
            drained += 1

    def close(self) -> None:
        self._sock.close()


#: Errors of this host, not of the path to the peer: logged, never blamed on the pair.
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL})


#: Every this long, each peer that has not answered gets one more connect (a new SYN from a new
#: port) beside those still waiting. One connect sends its SYN 5 times in 5 s where the kernel
#: backs off linearly first (``net.ipv4.tcp_syn_linear_timeouts``, Linux 6.x), 3 times where it
#: doubles at once; one more connect each second makes that 15 (11).
RETRY_S = 1.0
#: The connects kept waiting per peer: beyond, the oldest (whose SYNs have backed off the most)
#: makes room for the new one, so that a long ``data_path_timeout`` holds few descriptors.
CONNECTS_PER_PEER = 5
#: An ICMP unreachable, which is also what a neighbour lookup lost to packet loss gives (as well
#: as a rejecting firewall or router), and a refusal, which a firewall that rejects with a TCP
#: reset gives as well as a peer that is gone (the round then breaks, and the node joins again:
#: ``handler._check_data_path``): that connect is dropped, the next one tried, and the peer
#: fails at the deadline with this error. A rule lifted as the round forms (a partition that
#: heals) costs a retry, not the job. Any other error of a connect fails it at once.
TRANSIENT_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ECONNREFUSED})

Target = tuple[int, str, int]


def probe(
    targets: Sequence[Target], timeout_s: float, scope: str | None = None, retry_s: float = RETRY_S
) -> tuple[list[Unreachable], list[Unreachable]]:
    """Open a TCP connection to each ``(rank, ip, port)``, all at once, under one deadline.

    A peer passes as soon as one connect to it completes. Each ``retry_s`` a peer that has not
    answered gets one more connect, the earlier ones still waiting, until the deadline: a lossy
    path passes, a missing one still fails. A connect refused or met by an ICMP unreachable
    (``TRANSIENT_ERRNOS``) is dropped and the next tried (a rule lifted as the round forms
    costs a retry, not the job); any other error fails the peer at once.

    Returns the pairs that failed, and the probes this host could not make (out of
    descriptors, an address it cannot parse): those say nothing about the path. A peer with
    connects out, or with a failure already seen, is never moved to the second list by a
    local error on a later connect.
    ``scope``: this node's interface, for a peer's link-local IPv6 address.
    """
    if retry_s <= 0:
        raise ValueError(f"retry_s must be > 0, got {retry_s}")
    failed: list[Unreachable] = []
    local: list[Unreachable] = []
    started = time.monotonic()
    deadline = started + timeout_s
    try:
        sel = selectors.DefaultSelector()
    except OSError as exc:  # out of descriptors: this host's problem, not the paths'
        return [], [Unreachable(*target, f"cannot probe: {exc}") for target in dict.fromkeys(targets)]
    addrs: dict[Target, tuple[socket.AddressFamily, tuple[Any, ...]]] = {}
    waiting: dict[Target, list[socket.socket]] = {}  # the peers not settled, and their connects
    why: dict[Target, str] = {}  # a waiting peer's last failure (an ICMP unreachable)

    def settle(target: Target, into: list[Unreachable] | None, reason: str = "") -> None:
        for sock in waiting.pop(target):
            sel.unregister(sock)
            sock.close()
        if into is not None:
            into.append(Unreachable(*target, reason))

    def drop(target: Target, sock: socket.socket) -> None:
        waiting[target].remove(sock)
        sel.unregister(sock)
        sock.close()

    def local_error(target: Target, reason: str) -> None:
        """This host could not make one more connect: the ones out still count; a failure seen
        before still stands."""
        if waiting[target]:
            return
        if target in why:
            settle(target, failed, why[target])
        else:
            settle(target, local, reason)

    def connect(target: Target) -> None:
        family, addr = addrs[target]
        if len(waiting[target]) >= CONNECTS_PER_PEER:
            drop(target, waiting[target][0])
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            local_error(target, str(exc))
            return
        try:
            sock.setblocking(False)
            err = sock.connect_ex(addr)
        except OSError as exc:
            err = exc.errno or errno.EINVAL
        if err in (0, errno.EINPROGRESS):
            try:
                sel.register(sock, selectors.EVENT_WRITE, target)
            except OSError as exc:
                sock.close()
                local_error(target, str(exc))
                return
            waiting[target].append(sock)
            return
        sock.close()
        if err in LOCAL_ERRNOS:
            local_error(target, os.strerror(err))
        elif err in TRANSIENT_ERRNOS:
            why[target] = os.strerror(err)  # tried again at the next wave
        else:
            settle(target, failed, os.strerror(err))

    try:
        for target in dict.fromkeys(targets):  # each once, in order
            try:
                addrs[target] = _address(target[1], target[2], scope)
            except (OSError, ValueError) as exc:
                local.append(Unreachable(*target, f"cannot use the address: {exc}"))
                continue
            waiting[target] = []
            connect(target)
        next_try = started + retry_s
        while waiting:
            left = max(0.0, deadline - time.monotonic())
            for key, _ in sel.select(min(left, max(0.0, next_try - time.monotonic()))):
                target, sock = key.data, key.fileobj
                assert isinstance(sock, socket.socket)  # noqa: S101 - only sockets are registered
                if target not in waiting:
                    continue  # settled by an earlier event of this batch
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err == 0:
                    settle(target, None)
                elif err in TRANSIENT_ERRNOS:
                    why[target] = os.strerror(err)
                    drop(target, sock)
                else:
                    settle(target, failed, os.strerror(err))
            if left == 0.0:
                break  # one last look at the deadline (a thread that ran late still sees what came)
            now = time.monotonic()
            if now >= next_try:
                next_try = max(next_try + retry_s, now)  # after a stall: one wave, not a burst
                if now < deadline:
                    for target in list(waiting):
                        connect(target)
        for target in list(waiting):
            settle(target, failed, why.get(target, f"no answer within {timeout_s:g} s"))
    finally:
        for target in list(waiting):
            settle(target, None)
        sel.close()
    return sorted(failed, key=lambda u: u.rank), local


def _address(ip: str, port: int, scope: str | None) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """The peer's address to connect to. A link-local IPv6 address gets this node's own
    interface as its scope: the scope the peer advertised is the name of *its* interface."""
    addr = parse_ip(ip)
    if addr.version == 4:
        return socket.AF_INET, (str(addr), port)
    text = f"{addr}%{scope}" if addr.is_link_local and scope else str(addr)
    info = socket.getaddrinfo(text, port, socket.AF_INET6, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    return socket.AF_INET6, tuple(info[0][4])


def failure_message(
    me: tuple[int, str], interface: str, failed: Sequence[Unreachable], checked: int, timeout_s: float
) -> str:
    """The error every node of the job reports: the pairs, the interface and what to do."""
    rank, ip = me
    pairs = "; ".join(f"rank {u.rank} at {u.ip} port {u.port}: {u.why}" for u in failed[:8])
    more = f" (and {len(failed) - 8} more)" if len(failed) > 8 else ""
    first = failed[0].ip
    return (
        f"data path check failed: rank {rank} ({ip} on interface {interface}) cannot open a TCP "
        f"connection to {len(failed)} of the {checked} peers it checked within {timeout_s:g} s: "
        f"{pairs}{more}. The workers' process group (gloo or NCCL) would hang on these pairs. "
        f"Check the route and any firewall between the hosts for TCP on {interface} "
        f"(e.g. `ip route get {first}` on this node, and the same towards {ip} on the peer), or pin "
        "the interface every node shares with --rdzv_conf interface=NAME (the workers use it too); "
        f"data_path_timeout=0 turns the check off. See {README_NETWORKS}"
    )
