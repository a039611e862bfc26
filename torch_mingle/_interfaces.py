"""Network interfaces: listing them (netifaces, via multicast-expert) and choosing one.

All interface code lives here because netifaces is unmaintained: if it has to be
replaced, this is the only module that changes.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import sys

from torch_mingle._record import record
from torch_mingle._wire import parse_ip
from torch_mingle.errors import README_INSTALL, README_NETWORKS, MingleConfigError

try:
    import multicast_expert
except ModuleNotFoundError as exc:  # installed with --no-deps, or netifaces removed since
    if exc.name != "netifaces":
        raise
    raise ModuleNotFoundError(
        "torch_mingle needs the netifaces module (through multicast-expert) and it is not installed. "
        "Install netifaces-plus (binary wheels of the same module, no compiler needed: "
        "pip install netifaces-plus) or netifaces (pip install netifaces; builds from source "
        f"with a C compiler); see {README_INSTALL}",
        name="netifaces",
    ) from exc
from multicast_expert import IfaceInfo

log = logging.getLogger(__name__)

_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFF_RUNNING = 0x40
_IFF_MULTICAST = 0x1000


@record
class Interface:
    """One interface as torch_mingle uses it: a name, its addresses of one family, its flags."""

    name: str
    index: int
    family: int
    addresses: tuple[str, ...]
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    up: bool
    loopback: bool
    multicast: bool
    info: IfaceInfo

    @property
    def address(self) -> str:
        """The address this node advertises on the interface (global before link-local)."""
        return _preferred(self.addresses)

    def holds_network_of(self, ip: str) -> bool:
        """True if ``ip`` is on one of this interface's subnets (a peer on the same segment)."""
        try:
            addr = parse_ip(ip)
        except ValueError:
            return False
        return any(addr in net for net in self.networks)

    def flags(self) -> list[str]:
        """The flags that matter here, of ``up``, ``loopback`` and ``multicast``."""
        return [
            f for f, on in (("up", self.up), ("loopback", self.loopback), ("multicast", self.multicast)) if on
        ]

    def describe(self) -> str:
        flags = ",".join(self.flags())
        return f"{self.name} ({', '.join(self.addresses) or 'no address'}; {flags or 'down'})"


def family_of(address: str) -> int:
    ip = parse_ip(address)
    return socket.AF_INET6 if ip.version == 6 else socket.AF_INET


def _preferred(addresses: tuple[str, ...]) -> str:
    def rank(addr: str) -> tuple[int, str]:
        ip = parse_ip(addr)
        return (1 if ip.is_link_local else 0, addr)

    return min(addresses, key=rank)


def _flags(name: str) -> int | None:
    if not sys.platform.startswith("linux"):
        return None
    import fcntl  # noqa: PLC0415 - Linux only

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            res = fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, struct.pack("16sH", name.encode()[:15], 0))
    except OSError:
        return None
    flags: int = struct.unpack("16sH", res[:18])[1]
    return flags


def _addresses(info: IfaceInfo, family: int) -> tuple[str, ...]:
    if family == socket.AF_INET:
        return tuple(str(a.ip) for a in info.ip4_addrs)
    out = []
    for a in info.ip6_addrs:
        ip = a.ip
        text = str(ip).split("%", 1)[0]
        out.append(f"{text}%{info.machine_name}" if ip.is_link_local else text)
    return tuple(out)


def _networks(info: IfaceInfo, family: int) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    addrs = info.ip4_addrs if family == socket.AF_INET else info.ip6_addrs
    return tuple(a.network for a in addrs)


def list_interfaces(family: int) -> list[Interface]:
    """Every interface on this node, with its addresses of ``family``, sorted by name."""
    result = []
    for info in multicast_expert.scan_interfaces():
        flags = _flags(info.machine_name)
        loopback = info.is_localhost() if flags is None else bool(flags & _IFF_LOOPBACK)
        result.append(
            Interface(
                name=info.machine_name,
                index=info.index,
                family=family,
                addresses=_addresses(info, family),
                networks=_networks(info, family),
                up=True if flags is None else bool(flags & _IFF_UP),
                loopback=loopback,
                multicast=True if flags is None else bool(flags & _IFF_MULTICAST) or loopback,
                info=info,
            )
        )
    return sorted(result, key=lambda i: i.name)


def _matches(iface: Interface, spec: str) -> bool:
    if iface.name == spec:
        return True
    try:
        wanted = parse_ip(spec)
    except ValueError:
        return False
    return any(parse_ip(a) == wanted for a in iface.addresses)


def _listing(ifaces: list[Interface]) -> str:
    return "; ".join(i.describe() for i in ifaces) or "none"


def _usable(iface: Interface) -> bool:
    return iface.up and iface.multicast and bool(iface.addresses)


def _refuse_other_family(spec: str, family: int) -> None:
    """``interface=`` is an address of the other family than the group's: say that, not 'no such
    interface' (``interface=127.0.0.1`` with an IPv6 group is on ``lo``, which has ``::1``)."""
    try:
        version = ipaddress.ip_address(spec.split("%", 1)[0]).version
    except ValueError:
        return
    ours = 6 if family == socket.AF_INET6 else 4
    if version == ours:
        return
    other = socket.AF_INET6 if ours == 4 else socket.AF_INET
    holders = [i.name for i in list_interfaces(other) if _matches(i, spec)]
    on = f" (it is on {holders[0]})" if holders else ""
    name = f"interface={holders[0]}" if holders else "the interface's name"
    raise MingleConfigError(
        f"rdzv_conf interface={spec!r} is an IPv{version} address{on}, but the group is IPv{ours}: "
        f"fix: --rdzv_conf {name} (a name fits both families), an IPv{ours} address of it, or an "
        f"IPv{version} group"
    )


def _default_route_interface(family: int) -> str | None:
    try:
        import netifaces  # noqa: PLC0415

        gateways = netifaces.gateways()
        name: str = gateways["default"][
            netifaces.AF_INET6 if family == socket.AF_INET6 else netifaces.AF_INET
        ][1]
    except (KeyError, OSError, IndexError, TypeError):
        return None
    return name


def choose_interface(
    spec: str | None, family: int, *, local_addr: str | None = None
) -> tuple[Interface, str]:
    """Resolve ``interface=`` (a name or an address) or pick one; returns it and why it was chosen."""
    ifaces = list_interfaces(family)
    fam = "IPv6" if family == socket.AF_INET6 else "IPv4"
    if spec is not None:
        found = [i for i in ifaces if _matches(i, spec)]
        if not found:
            _refuse_other_family(spec, family)
            raise MingleConfigError(
                f"rdzv_conf interface={spec!r} matches no interface on this node; interfaces here: "
                f"{_listing(ifaces)}; fix: --rdzv_conf interface=<one of these names or addresses>"
            )
        iface = found[0]
        if not iface.up:
            raise MingleConfigError(
                f"rdzv_conf interface={spec!r}: {iface.name} is down; bring it up or pick another"
            )
        if not iface.addresses:
            raise MingleConfigError(
                f"rdzv_conf interface={spec!r}: {iface.name} has no {fam} address, but the group is {fam}; "
                f"give it an address or pick a group of the other family (see {README_NETWORKS})"
            )
        if not iface.multicast:
            raise MingleConfigError(
                f"rdzv_conf interface={spec!r}: {iface.name} does not support multicast (no MULTICAST flag); "
                f"pick another interface (see {README_NETWORKS})"
            )
        return iface, "pinned by the interface key, rdzv_conf or $TORCH_MINGLE_INTERFACE"
    if local_addr:
        for i in ifaces:
            if _usable(i) and _matches(i, local_addr):
                return i, f"holds --local-addr {local_addr}"
    usable = [i for i in ifaces if _usable(i)]
    gateway = _default_route_interface(family)
    for i in usable:
        if i.name == gateway and not i.loopback:
            return i, f"carries the default {fam} route"
    external = [i for i in usable if not i.loopback]
    if external:
        return external[0], f"first multicast-capable {fam} interface by name (no default route)"
    loop = [i for i in usable if i.loopback]
    if loop:
        return loop[0], f"loopback: no other {fam} interface is up"
    raise MingleConfigError(
        f"no interface on this node can carry {fam} multicast; interfaces here: {_listing(ifaces)}; "
        f"fix: --rdzv_conf interface=<name> (see {README_NETWORKS})"
    )


def discovery_interfaces(
    spec: str | None, family: int, *, local_addr: str | None = None
) -> tuple[list[Interface], str]:
    """The interfaces to discover on, and why.

    ``interface=`` (or ``--local-addr``) pins one. Otherwise every up, multicast-capable
    interface with an address listens and asks at once, and the node settles on the one
    where its job's peers answer: with several networks nobody has to know which one the
    peers are on. Loopback is used only when nothing else is up.
    """
    if spec is not None or local_addr:
        iface, why = choose_interface(spec, family, local_addr=local_addr)
        return [iface], why
    ifaces = list_interfaces(family)
    fam = "IPv6" if family == socket.AF_INET6 else "IPv4"
    external = [i for i in ifaces if _usable(i) and not i.loopback]
    if external:
        if len(external) == 1:
            return external, f"the only multicast-capable {fam} interface"
        names = ", ".join(i.name for i in external)
        return external, f"listening on every multicast-capable {fam} interface ({names}) for the peers"
    iface, why = choose_interface(None, family)
    return [iface], why


def interface_for(ip: str, ifaces: list[Interface]) -> Interface | None:
    """The interface whose subnet holds ``ip``, if any."""
    return next((i for i in ifaces if i.holds_network_of(ip)), None)
