"""One torchrun agent per network namespace: nobody knows rank 0's IP, not even the test."""

from __future__ import annotations

import pytest

from tests.helpers import (
    agent_env,
    leader_of,
    train_on_hosts,
)

pytestmark = pytest.mark.netns


def test_three_hosts_find_each_other_and_train(segment, tmp_path):
    hosts = [segment.add_host(f"198.18.0.{i}") for i in (11, 12, 13)]
    # The interface is pinned to the namespace's own veth; no address is given anywhere.
    agents, reports = train_on_hosts(hosts, tmp_path, {"interface": "eth0"}, steps=6, prefix="netns")
    leader = next(h for h in hosts if h.name == leader_of(agents).name)
    assert {r["env"]["MASTER_ADDR"] for r in reports} == {leader.ip}
    assert {r["env"]["GLOO_SOCKET_IFNAME"] for r in reports} == {"eth0"}


def test_ranks_follow_each_hosts_slurm_node_id_around_the_leader(segment, tmp_path):
    hosts = [segment.add_host(f"198.18.0.{i}") for i in (21, 22, 23)]
    node_ids = {hosts[0].name: "2", hosts[1].name: "0", hosts[2].name: "1"}  # not the IP order
    agents, reports = train_on_hosts(
        hosts, tmp_path, {"interface": "eth0", "rank_order": "env:SLURM_NODEID"}, steps=3, prefix="order",
        env_of=lambda h: agent_env(SLURM_NODEID=node_ids[h.name]),
    )  # fmt: skip
    ring = [r["env"]["SLURM_NODEID"] for r in sorted(reports, key=lambda r: r["rank"])]
    leader = leader_of(agents).name
    assert ring[0] == node_ids[leader]  # rank 0 is the leader, the store's host
    at = ["0", "1", "2"].index(ring[0])
    assert ring == (["0", "1", "2"] * 2)[at : at + 3]  # then the scheduler's order, around
