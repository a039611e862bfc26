"""Real networks, one agent per namespace: several interfaces, IPv6 only, multicast dropped."""

from __future__ import annotations

import ipaddress

import pytest

from tests.helpers import dump, train_on_hosts

pytestmark = pytest.mark.netns


def test_a_node_with_a_second_empty_network_uses_the_one_its_peers_are_on(segment, tmp_path):
    segment.create_bridge("br1")  # a network with nobody else on it
    lonely = segment.add_host("198.18.1.11", bridge="br1")  # its eth0 (first by name) leads nowhere
    segment.attach(lonely, "198.18.0.11", bridge="br0", dev="eth1")
    others = [segment.add_host(f"198.18.0.{i}") for i in (12, 13)]
    # No interface is given anywhere: inside these namespaces there is nothing but our bridges.
    agents, reports = train_on_hosts([lonely, *others], tmp_path, {}, steps=4)
    masters = {r["env"]["MASTER_ADDR"] for r in reports}
    assert len(masters) == 1
    assert ipaddress.ip_address(masters.pop()) in ipaddress.ip_network("198.18.0.0/24"), dump(agents)
    ifnames = {r["rank"]: r["env"]["GLOO_SOCKET_IFNAME"] for r in reports}
    by_host = {a.name: a for a in agents}
    lonely_rank = next(r["rank"] for r in reports if r["env"]["GLOO_SOCKET_IFNAME"] == "eth1")
    assert ifnames[lonely_rank] == "eth1" and list(ifnames.values()).count("eth0") == 2
    assert "interface eth1 (198.18.0.11) chosen" in by_host[lonely.name].output(), dump(agents)


def test_ipv6_only_hosts_train_together(segment, tmp_path):
    hosts = [segment.add_host(f"fd00::{i}", prefix=64, ipv6=True) for i in (11, 12, 13)]
    agents, reports = train_on_hosts(hosts, tmp_path, {"group": "ff12::7777", "interface": "eth0"}, steps=4)
    masters = {r["env"]["MASTER_ADDR"] for r in reports}
    assert len(masters) == 1
    assert masters.pop() in {h.ip for h in hosts}, dump(agents)
