"""Real networks, one agent per namespace: several interfaces, IPv6 only, multicast dropped."""

from __future__ import annotations

import ipaddress

import pytest

from tests.helpers import (
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    start_agent,
    torchrun_cmd,
    unique_job,
)

pytestmark = pytest.mark.netns


def _train(hosts, tmp_path, conf, *, job=None):
    cmd = torchrun_cmd(
        job=job or unique_job("net"), nnodes=str(len(hosts)), nproc=1, conf={"join_timeout": 120, **conf},
        script_args=["--steps", "4", "--report", str(tmp_path / "report")],
    )  # fmt: skip
    agents = [start_agent(h.name, cmd, tmp_path, netns=h.name) for h in hosts]
    codes = finish_all(agents)
    assert codes == [0] * len(hosts), dump(agents)
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, len(hosts), 4, agents)
    return agents, reports


def test_a_node_with_a_second_empty_network_uses_the_one_its_peers_are_on(segment, tmp_path):
    segment.create_bridge("br1")  # a network with nobody else on it
    lonely = segment.add_host("198.18.1.11", bridge="br1")  # its eth0 (first by name) leads nowhere
    segment.attach(lonely, "198.18.0.11", bridge="br0", dev="eth1")
    others = [segment.add_host(f"198.18.0.{i}") for i in (12, 13)]
    # No interface is given anywhere: inside these namespaces there is nothing but our bridges.
    agents, reports = _train([lonely, *others], tmp_path, {})
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
    agents, reports = _train(hosts, tmp_path, {"group": "ff12::7777", "interface": "eth0"})
    masters = {r["env"]["MASTER_ADDR"] for r in reports}
    assert len(masters) == 1
    assert masters.pop() in {h.ip for h in hosts}, dump(agents)
