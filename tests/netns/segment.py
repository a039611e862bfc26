"""Network namespaces as hosts, for tests and the stress script.

Each "node" gets its own namespace, address (198.18.0.0/15) and veth on a bridge that lives
in a namespace of its own: nothing has an uplink, and ``destroy()`` deletes every namespace.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

#: What ``ip netns exec <ns>`` mounts over ``/etc`` (``hosts``, ``resolv.conf``) for that namespace.
NETNS_ETC = Path("/etc/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _sysctl(ns: str, setting: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", setting], check=True, timeout=30)


def nftables_available() -> str | None:
    """None if ``nft`` can be used (installing it from the distribution if needed), else why not."""
    if shutil.which("nft") is None and os.geteuid() == 0 and shutil.which("apt-get") is not None:
        for cmd in (["apt-get", "install", "-y", "-q", "nftables"], ["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "nftables"]):  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, check=False, timeout=300,
                                  env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})  # fmt: skip
            if done.returncode == 0 and shutil.which("nft") is not None:
                break
    if shutil.which("nft") is None:
        return "random packet loss needs nftables (`apt-get install nftables`), which is not installed"
    return None


def netns_available() -> str | None:
    """None if namespaces can be used here, else the reason to skip."""
    if os.geteuid() != 0:
        return "netns tests need root (CI runs them as root)"
    if shutil.which("ip") is None:
        return "netns tests need iproute2's `ip`"
    probe = f"mglprobe-{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create network namespaces here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    name: str  # namespace
    ip: str  # address of its first interface
    dev: str = "eth0"
    ports: dict[str, str] = field(default_factory=dict)  # device -> its bridge port


@dataclass
class Segment:
    """Bridges in a namespace of their own, and hosts attached to them by veth pairs."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    hosts: list[Host] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    bridges: list[str] = field(default_factory=list)
    #: Processes the segment runs in its hosts (``silent_resolver``), killed by ``destroy()``.
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def bridge_ns(self) -> str:
        return f"mglb-{self.tag}"

    def create_bridge(self, name: str = "br0", *, mcast_snooping: bool = True) -> None:
        if self.bridge_ns not in self.namespaces:
            self._netns_add(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", name, "type", "bridge",
            "mcast_snooping", "1" if mcast_snooping else "0")  # fmt: skip
        _ip("-n", self.bridge_ns, "link", "set", name, "up")
        self.bridges.append(name)

    def add_host(self, ip: str, prefix: int = 24, *, bridge: str = "br0", ipv6: bool = False) -> Host:
        index = len(self.hosts) + 1
        host = Host(name=f"mgl-{self.tag}-{index}", ip=ip)
        self._netns_add(host.name)
        _ip("-n", host.name, "link", "set", "lo", "up")
        self.hosts.append(host)
        self.attach(host, ip, prefix, bridge=bridge, dev="eth0", ipv6=ipv6)
        return host

    def attach(
        self, host: Host, ip: str, prefix: int = 24, *, bridge: str, dev: str, ipv6: bool = False
    ) -> None:
        """Give ``host`` one more interface ``dev`` with address ``ip``, cabled to ``bridge``.

        A link-local ``ip`` (``fe80::...``) makes it the interface's only IPv6 address: the
        kernel generates none of its own.
        """
        port = f"v{self.tag}{self.hosts.index(host) + 1}{len(host.ports)}"
        _ip("link", "add", port, "type", "veth", "peer", "name", dev, "netns", host.name)
        _ip("link", "set", port, "netns", self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "set", port, "master", bridge)
        _ip("-n", self.bridge_ns, "link", "set", port, "up")
        if ip.startswith("fe80:"):
            _sysctl(host.name, f"net.ipv6.conf.{dev}.addr_gen_mode=1")
        # nodad: an IPv6 address is usable at once instead of after duplicate address detection.
        extra = ["nodad"] if ipv6 else []
        _ip("-n", host.name, *(["-6"] if ipv6 else []), "addr", "add", f"{ip}/{prefix}", "dev", dev, *extra)
        _ip("-n", host.name, "link", "set", dev, "up")
        host.ports[dev] = port

    def port_of(self, host: Host, dev: str = "eth0") -> str:
        return host.ports[dev]

    def link(self, host: Host, up: bool, dev: str = "eth0") -> None:
        """Cut or restore a host's cable (its port on the bridge)."""
        _ip("-n", self.bridge_ns, "link", "set", self.port_of(host, dev), "up" if up else "down")

    def drop_multicast(self, *, broadcast: bool = False) -> None:
        """Make every bridge drop multicast (and ``broadcast`` too) while unicast still passes.

        Needs bridges made with ``mcast_snooping=False``; flooding of multicast is then turned
        off on every port.
        """
        kinds = ["mcast_flood", "off", *(["bcast_flood", "off"] if broadcast else [])]
        for host in self.hosts:
            for port in host.ports.values():
                flood_off = ["bridge", "link", "set", "dev", port, *kinds]
                subprocess.run(["ip", "netns", "exec", self.bridge_ns, *flood_off], check=True, timeout=30)

    def split(self, side: list[Host], bridge: str = "split0") -> None:
        """Partition the segment: ``side``'s cables move to a bridge of their own (``heal`` undoes it)."""
        if bridge not in self.bridges:
            self.create_bridge(bridge)
        for host in side:
            _ip("-n", self.bridge_ns, "link", "set", self.port_of(host), "master", bridge)

    def heal(self, side: list[Host], bridge: str = "br0") -> None:
        for host in side:
            _ip("-n", self.bridge_ns, "link", "set", self.port_of(host), "master", bridge)

    def loss(self, host: Host, percent: int, *, link: str | None = None) -> None:
        """Drop ``percent`` % of the packets that reach ``host``, at random (nftables, in its
        namespace); with ``link`` (a device, ``eth0``), of those it sends and receives on that link."""
        drop = f"numgen random mod 100 < {percent} drop;"
        if link is None:
            chains = f" chain i {{ type filter hook input priority 0; {drop} }}\n"
        else:
            chains = (
                f' chain i {{ type filter hook input priority 0; iifname "{link}" {drop} }}\n'
                f' chain o {{ type filter hook output priority 0; oifname "{link}" {drop} }}\n'
            )
        rules = "table inet mgl_loss {\n" + chains + "}\n"
        self.no_loss(host)
        subprocess.run(["ip", "netns", "exec", host.name, "nft", "-f", "-"], input=rules, text=True,
                       check=True, timeout=30)  # fmt: skip

    def no_loss(self, host: Host) -> None:
        subprocess.run(["ip", "netns", "exec", host.name, "nft", "delete", "table", "inet", "mgl_loss"],
                       capture_output=True, check=False, timeout=30)  # fmt: skip

    def reset_split(self, sides: list[list[Host]]) -> None:
        """Partition the segment with resets, as a firewall that rejects does (or a NAT that lost
        its flows): in each host's namespace every TCP segment from another side is answered with
        a reset and its datagrams are dropped; ``heal_resets`` undoes it."""
        for i, side in enumerate(sides):
            far = ", ".join(h.ip for j, other in enumerate(sides) if j != i for h in other)
            rules = (
                "table inet mgl_cut {\n chain i { type filter hook input priority 0;\n"
                f"  ip saddr {{ {far} }} tcp flags rst accept\n"  # the far side's answers get through
                f"  ip saddr {{ {far} }} meta l4proto tcp reject with tcp reset\n"
                f"  ip saddr {{ {far} }} drop\n }}\n}}\n"
            )
            for host in side:
                subprocess.run(["ip", "netns", "exec", host.name, "nft", "-f", "-"], input=rules, text=True,
                               check=True, timeout=30)  # fmt: skip

    def heal_resets(self) -> None:
        for host in self.hosts:
            subprocess.run(["ip", "netns", "exec", host.name, "nft", "delete", "table", "inet", "mgl_cut"],
                           capture_output=True, check=False, timeout=30)  # fmt: skip

    def name_hosts(self, names: dict[str, Host]) -> None:
        """Give every host an ``/etc/hosts`` of its own that maps ``names`` to hosts' addresses
        (``ip netns exec`` mounts ``/etc/netns/<namespace>/hosts`` over ``/etc/hosts``)."""
        lines = "127.0.0.1 localhost\n" + "".join(f"{h.ip} {name}\n" for name, h in names.items())
        for host in self.hosts:
            etc = NETNS_ETC / host.name
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(lines)

    def silent_resolver(self, host: Host, timeout_s: int) -> None:
        """Give ``host`` a resolver that drops every query: a socket on 127.0.0.53:53 in its
        namespace reads them and never answers, and its ``resolv.conf`` (mounted by ``ip netns
        exec``) waits ``timeout_s`` for one try. As a DNS server that is down or filtered does."""
        etc = NETNS_ETC / host.name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text(f"nameserver 127.0.0.53\noptions timeout:{timeout_s} attempts:1\n")
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "s.bind(('127.0.0.53', 53))\n"
            "print('bound', flush=True)\n"
            "while True:\n"
            "    s.recv(4096)\n"
        )
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.name, sys.executable, "-c", code],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.processes.append(proc)
        assert proc.stdout is not None  # piped above
        ready, _, _ = select.select([proc.stdout], [], [], 30.0)  # a failed bind ends it (EOF)
        if not ready or proc.stdout.readline().strip() != "bound":
            raise RuntimeError(f"the silent resolver of {host.name} did not start (exit {proc.poll()})")

    def _netns_add(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)

    def destroy(self) -> None:
        try:
            for proc in self.processes:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
                if proc.stdout is not None:
                    proc.stdout.close()
        finally:
            self.processes.clear()
            self._delete_namespaces()

    def _delete_namespaces(self) -> None:
        for ns in reversed(self.namespaces):
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        self.namespaces.clear()
