"""Datagram transports: real multicast sockets, and an in-memory network for simulations.

``McastTransport`` wraps multicast-expert's sockets pinned to one interface: the receive
socket joins the group on that interface only, and the send socket sets the outgoing
interface and the TTL, so discovery never leaks onto another network. Unicast replies
reach a node at its send socket's address (the source address of its datagrams).

``InMemoryNetwork`` delivers datagrams between simulated nodes on a fake clock; a seeded
RNG drops, duplicates and delays them, and partitions cut it in pieces.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import ipaddress
import logging
import random
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from multicast_expert import McastRxSocket, McastTxSocket, MulticastExpertError

from torch_mingle._interfaces import Interface
from torch_mingle._protocol import Dest
from torch_mingle.errors import README_NETWORKS, MingleNetworkError

log = logging.getLogger(__name__)

RCVBUF_BYTES = 4 * 1024 * 1024
MAX_DATAGRAM_READ = 2048
MAX_READS_PER_WAKE = 512


def network_advice(
    exc: OSError, *, action: str, iface: Interface, group: str, port: int
) -> MingleNetworkError:
    """Turn an OS error on a discovery socket into an error that names the cause and the fix."""
    where = f"{action} on interface {iface.name} ({iface.address}) for group {group} port {port}"
    code = exc.errno
    if code == errno.ENOBUFS:
        hint = (
            "the kernel's limit of multicast group memberships is reached; raise it with "
            "`sysctl -w net.ipv4.igmp_max_memberships=1024` (IPv6: net.ipv6.mld_max_msf)"
        )
    elif code == errno.EADDRINUSE:
        hint = (
            f"UDP port {port} is held by a program that did not set SO_REUSEADDR; "
            "pick another port for every node: --rdzv_conf port=<free port>"
        )
    elif code in (errno.ENODEV, errno.ENXIO):
        hint = f"interface {iface.name} disappeared or is down; check `ip link` and --rdzv_conf interface"
    elif code == errno.EADDRNOTAVAIL:
        hint = f"address {iface.address} is not (or no longer) on {iface.name}; check `ip addr`"
    elif code in (errno.EPERM, errno.EACCES):
        hint = "a firewall or security policy blocks multicast here (iptables/nftables, seccomp)"
    elif code in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        hint = f"no route for {group} through {iface.name}; pick the interface the peers are on"
    else:
        hint = f"see {README_NETWORKS}"
    return MingleNetworkError(f"{where} failed: {exc.strerror or exc} (errno {code}); {hint}")


class McastTransport:
    """Multicast (and unicast reply) sockets on one interface; optionally subnet broadcast too."""

    def __init__(
        self, iface: Interface, group: str, port: int, ttl: int = 1, *, broadcast: bool = False
    ) -> None:
        self.iface = iface
        self.group = group
        self.port = port
        self.ttl = ttl
        self.broadcast_addr = _broadcast_address(iface) if broadcast else None
        self._rx: McastRxSocket | None = None
        self._tx: McastTxSocket | None = None
        self.send_errors = 0
        self._send_error_logged = False

    def open(self) -> McastTransport:
        family = self.iface.family
        try:
            rx = McastRxSocket(family, [self.group], self.port, iface=self.iface.info, timeout=0)
            rx.__enter__()
        except OSError as exc:
            raise network_advice(
                exc, action="joining the multicast group", iface=self.iface, group=self.group, port=self.port
            ) from exc
        except MulticastExpertError as exc:
            raise MingleNetworkError(f"cannot listen on {self.iface.describe()}: {exc}") from exc
        try:
            tx = McastTxSocket(
                family, [self.group], iface=self.iface.info, ttl=self.ttl, enable_external_loopback=True
            )
            tx.__enter__()
        except OSError as exc:
            rx.__exit__(None, None, None)
            raise network_advice(
                exc, action="opening the send socket", iface=self.iface, group=self.group, port=self.port
            ) from exc
        except MulticastExpertError as exc:
            rx.__exit__(None, None, None)
            raise MingleNetworkError(f"cannot send on {self.iface.describe()}: {exc}") from exc
        if self.broadcast_addr is not None:
            tx.socket.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        for sock in [*rx.sockets, tx.socket]:
            sock.setblocking(False)
            # A smaller buffer still works; floods just drop earlier.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        self._rx, self._tx = rx, tx
        return self

    @property
    def local_address(self) -> tuple[str, int]:
        if self._tx is None:
            raise RuntimeError("transport is not open")
        name = self._tx.getsockname()
        return (name[0], name[1])

    def sockets(self) -> list[socket.socket]:
        if self._rx is None or self._tx is None:
            return []
        return [*self._rx.sockets, self._tx.socket]

    def receive(self, ready: Iterable[socket.socket]) -> list[tuple[bytes, Dest]]:
        """Drain the ready sockets without blocking (bounded, so timers still run under a flood)."""
        out: list[tuple[bytes, Dest]] = []
        for sock in ready:
            for _ in range(MAX_READS_PER_WAKE):
                try:
                    data, addr = sock.recvfrom(MAX_DATAGRAM_READ)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    log.debug("receive error on %s: %s", self.iface.name, exc)
                    break
                out.append((data, tuple(addr)))
        return out

    def send(self, data: bytes, dest: Dest) -> None:
        """``dest`` None: the group (and the subnet broadcast address, with the fallback)."""
        if dest is None:
            self._sendto(data, (self.group, self.port))
            if self.broadcast_addr is not None:
                self._sendto(data, (self.broadcast_addr, self.port))
        else:
            self._sendto(data, dest)

    def _sendto(self, data: bytes, dest: tuple[object, ...]) -> None:
        if self._tx is None:
            return
        try:
            self._tx.socket.sendto(data, dest)
        except (BlockingIOError, InterruptedError):
            self.send_errors += 1  # send buffer full: the protocol retries on its own
        except OSError as exc:
            self.send_errors += 1
            if not self._send_error_logged:
                self._send_error_logged = True
                log.warning(
                    "%s",
                    network_advice(exc, action="sending", iface=self.iface, group=self.group, port=self.port),
                )

    def close(self) -> None:
        for sock in (self._rx, self._tx):
            if sock is not None:
                sock.__exit__(None, None, None)
        self._rx = self._tx = None


def _broadcast_address(iface: Interface) -> str | None:
    """The subnet broadcast address of the interface's first IPv4 network (none for IPv6 or /31+)."""
    for net in iface.networks:
        if isinstance(net, ipaddress.IPv4Network) and net.prefixlen <= 30:
            return str(net.broadcast_address)
    return None


# --------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class Route:
    """What the network does with one datagram: deliver after each delay (none: dropped)."""

    delays: tuple[float, ...]


RouteHook = Callable[[object, object, bytes, random.Random], Route | None]


class InMemoryNetwork:
    """A simulated segment on a fake clock.

    ``drop``, ``duplicate`` and the latency range apply to every datagram, drawn from a
    seeded RNG; ``route_hook(src, dst, data, rng)`` may override the route of any one.
    ``partition(groups)`` lets datagrams through only inside a group.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        latency_s: tuple[float, float] = (0.0002, 0.002),
        drop: float = 0.0,
        duplicate: float = 0.0,
        route_hook: RouteHook | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.latency_s = latency_s
        self.drop = drop
        self.duplicate = duplicate
        self.route_hook = route_hook
        self.members: dict[object, None] = {}  # insertion-ordered set
        self._queue: list[tuple[float, int, object, bytes, object]] = []
        self._seq = 0
        self._side: dict[object, int] = {}
        self.datagrams_sent = 0
        self.deliveries = 0

    def attach(self, addr: object) -> None:
        self.members[addr] = None

    def detach(self, addr: object) -> None:
        self.members.pop(addr, None)

    def partition(self, *groups: Iterable[object]) -> None:
        self._side = {addr: n for n, group in enumerate(groups) for addr in group}

    def heal(self) -> None:
        self._side = {}

    def _route(self, src: object, dst: object, data: bytes) -> Route:
        if self._side and self._side.get(src, -1) != self._side.get(dst, -2):
            return Route(delays=())
        if self.route_hook is not None:
            hooked = self.route_hook(src, dst, data, self.rng)
            if hooked is not None:
                return hooked
        if self.rng.random() < self.drop:
            return Route(delays=())
        low, high = self.latency_s
        delays = [self.rng.uniform(low, high)]
        if self.rng.random() < self.duplicate:
            delays.append(self.rng.uniform(low, high) * 2)
        return Route(delays=tuple(delays))

    def send(self, src: object, data: bytes, dest: Dest, now: float) -> None:
        self.datagrams_sent += 1
        targets = [m for m in self.members if m != src] if dest is None else [dest]
        for dst in targets:
            if dst not in self.members:
                continue
            for delay in self._route(src, dst, data).delays:
                self._seq += 1
                heapq.heappush(self._queue, (now + delay, self._seq, dst, data, src))

    def next_delivery(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def pop_due(self, now: float) -> list[tuple[object, bytes, object]]:
        """Datagrams due at ``now``: (destination, data, source)."""
        out = []
        while self._queue and self._queue[0][0] <= now:
            _, _, dst, data, src = heapq.heappop(self._queue)
            self.deliveries += 1
            out.append((dst, data, src))
        return out
