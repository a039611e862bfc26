"""Network namespaces as hosts, for tests and the stress script.

Each "node" gets its own namespace, address (198.18.0.0/15) and veth on a bridge that lives
in a namespace of its own: nothing has an uplink, and ``destroy()`` deletes every namespace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


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
    ip: str
    dev: str = "eth0"


@dataclass
class Segment:
    """A bridge in its own namespace and hosts attached to it by veth pairs."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    hosts: list[Host] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)

    @property
    def bridge_ns(self) -> str:
        return f"mglb-{self.tag}"

    def create_bridge(self, *, mcast_snooping: bool = True) -> None:
        self._netns_add(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge",
            "mcast_snooping", "1" if mcast_snooping else "0")  # fmt: skip
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")

    def add_host(self, ip: str, prefix: int = 24) -> Host:
        index = len(self.hosts) + 1
        ns = f"mgl-{self.tag}-{index}"
        self._netns_add(ns)
        peer = f"v{self.tag}{index}"
        _ip("link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", peer, "netns", self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "set", peer, "master", "br0")
        _ip("-n", self.bridge_ns, "link", "set", peer, "up")
        _ip("-n", ns, "addr", "add", f"{ip}/{prefix}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        host = Host(name=ns, ip=ip)
        self.hosts.append(host)
        return host

    def port_of(self, host: Host) -> str:
        return f"v{self.tag}{self.hosts.index(host) + 1}"

    def link(self, host: Host, up: bool) -> None:
        """Cut or restore a host's cable (its port on the bridge)."""
        _ip("-n", self.bridge_ns, "link", "set", self.port_of(host), "up" if up else "down")

    def _netns_add(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)

    def destroy(self) -> None:
        for ns in reversed(self.namespaces):
            _ip("netns", "del", ns, check=False)
        self.namespaces.clear()
