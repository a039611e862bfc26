"""The data path, checked before a round's workers start.

A wrong interface or a firewall between two nodes otherwise shows only after the round
formed, as a gloo or NCCL process group that hangs. Every node therefore listens on a TCP
port of its own (``ProbeListener``, told to the leader with each join and to every member in
the round), and before ``next_rendezvous`` returns it opens a connection to its peers on the
address each advertised, the one its workers will use: to every peer in small rounds, in
large ones to a bounded number (``peers_to_probe``: ring neighbours first, then peers at
power-of-two distances). Connects run at once, non-blocking, under one deadline.

The listener never accepts on its own: the kernel completes the handshake, which is what is
checked, and each check first drains what the previous round's probes left in the queue.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import itertools
import os
import selectors
import socket
import time
from collections.abc import Sequence
from typing import Any

from torch_mingle._record import record
from torch_mingle.errors import README_NETWORKS, MingleConnectionError

#: Peers each node probes in a large round (every peer when the round is at most this + 1).
MAX_PROBES = 16
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


def peers_to_probe(world: int, rank: int, limit: int = MAX_PROBES) -> list[int]:
    """The ranks ``rank`` probes: all others in a round of at most ``limit + 1``; else its ring
    neighbours, then peers at distances 2, 4, 8, ... on either side (then the nearest ones
    not probed yet), ``limit`` in all."""
    if world - 1 <= limit:
        return [r for r in range(world) if r != rank]
    powers = [1 << k for k in range(world.bit_length())]
    out: list[int] = []
    for distance in itertools.chain(powers, range(3, world)):
        for peer in ((rank + distance) % world, (rank - distance) % world):
            if peer != rank and peer not in out:
                out.append(peer)
                if len(out) == limit:
                    return out
    return out


#: Errors of this host, not of the path to the peer: logged, never blamed on the pair.
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL})


def probe(
    targets: Sequence[tuple[int, str, int]], timeout_s: float, scope: str | None = None
) -> tuple[list[Unreachable], list[Unreachable]]:
    """Open a TCP connection to each ``(rank, ip, port)`` at once, under one deadline.

    Returns the pairs that failed, and the probes this host could not make (out of
    descriptors, an address it cannot parse): those say nothing about the path.
    ``scope``: this node's interface, for a peer's link-local IPv6 address.
    """
    failed: list[Unreachable] = []
    local: list[Unreachable] = []
    sel = selectors.DefaultSelector()
    try:
        for rank, ip, port in targets:
            try:
                family, addr = _address(ip, port, scope)
            except (OSError, ValueError) as exc:
                local.append(Unreachable(rank, ip, port, f"cannot use the address: {exc}"))
                continue
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                local.append(Unreachable(rank, ip, port, str(exc)))
                continue
            sock.setblocking(False)
            try:
                err = sock.connect_ex(addr)
            except OSError as exc:
                err = exc.errno or errno.EINVAL
            if err not in (0, errno.EINPROGRESS):
                sock.close()
                (local if err in LOCAL_ERRNOS else failed).append(
                    Unreachable(rank, ip, port, os.strerror(err))
                )
                continue
            sel.register(sock, selectors.EVENT_WRITE, (rank, ip, port))
        deadline = time.monotonic() + timeout_s
        while sel.get_map():
            left = max(0.0, deadline - time.monotonic())
            for key, _ in sel.select(left):
                done = key.fileobj
                assert isinstance(done, socket.socket)  # noqa: S101 - only sockets are registered
                err = done.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    rank, ip, port = key.data
                    failed.append(Unreachable(rank, ip, port, os.strerror(err)))
                sel.unregister(done)
                done.close()
            if left == 0.0:
                break  # one last look at the deadline (a thread that ran late still sees what came)
        for key in list(sel.get_map().values()):
            rank, ip, port = key.data
            failed.append(Unreachable(rank, ip, port, f"no answer within {timeout_s:g} s"))
            sel.unregister(key.fileobj)
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
    finally:
        sel.close()
    return sorted(failed, key=lambda u: u.rank), local


def _address(ip: str, port: int, scope: str | None) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """The peer's address to connect to. A link-local IPv6 address gets this node's own
    interface as its scope: the scope the peer advertised is the name of *its* interface."""
    addr = ipaddress.ip_address(ip.partition("%")[0])
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
