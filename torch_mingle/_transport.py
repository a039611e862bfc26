"""The datagram transport: real multicast sockets (the simulated network is ``testing.net``).

``McastTransport`` wraps multicast-expert's sockets pinned to one interface: the receive
socket joins the group on that interface only, and the send socket sets the outgoing
interface and the TTL, so discovery never leaks onto another network. Unicast replies
reach a node at its send socket's address (the source address of its datagrams).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import socket
import struct
import sys
from collections.abc import Iterable

from multicast_expert import McastRxSocket, McastTxSocket, MulticastExpertError

from torch_mingle._claims import Dest
from torch_mingle._interfaces import Interface
from torch_mingle._wire import parse_ip
from torch_mingle.errors import README_NETWORKS, MingleNetworkError

log = logging.getLogger(__name__)

RCVBUF_BYTES = 4 * 1024 * 1024
MAX_DATAGRAM_READ = 2048
MAX_READS_PER_WAKE = 512
#: After a failed re-join of the group: try again this soon (the socket is out of the group).
RENEW_RETRY_S = 1.0


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

    def renew_membership(self) -> bool:
        """Leave the group and join it again on every receive socket: the kernel then sends a
        fresh IGMP (IPv4) or MLD (IPv6) report at once, so a switch that snoops without a
        querier keeps forwarding the group to this port. Datagrams that arrive between the
        two calls (microseconds) may be missed; the protocol repeats what matters.

        Linux only (the request layouts are Linux's). Returns False if a join failed: the
        caller tries again soon. When another socket on this host holds the same group on the
        same interface, the kernel's membership does not change and no report is sent; that
        socket's owner renews it or not (docs/networks.md#when-multicast-is-blocked).
        """
        if self._rx is None or not sys.platform.startswith("linux"):
            return True
        group = parse_ip(self.group).packed  # a scoped IPv6 group too
        if self.iface.family == socket.AF_INET:
            level, leave, join = socket.IPPROTO_IP, socket.IP_DROP_MEMBERSHIP, socket.IP_ADD_MEMBERSHIP
            # struct ip_mreqn: group, no local address (4 zero bytes), the interface by index
            mreq = group + bytes(4) + struct.pack("@i", self.iface.index)
        else:
            level, leave, join = socket.IPPROTO_IPV6, socket.IPV6_LEAVE_GROUP, socket.IPV6_JOIN_GROUP
            mreq = group + struct.pack("@I", self.iface.index)
        ok = True
        for sock in self._rx.sockets:
            with contextlib.suppress(OSError):  # not a member (any more): joining is what counts
                sock.setsockopt(level, leave, mreq)
            try:
                sock.setsockopt(level, join, mreq)
            except OSError as exc:
                ok = False
                log.error(  # noqa: TRY400 - the advice matters, the traceback does not
                    "%s; trying again in %gs",
                    network_advice(exc, action="joining the group again", iface=self.iface,
                                   group=self.group, port=self.port),
                    RENEW_RETRY_S,
                )  # fmt: skip
        return ok

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
