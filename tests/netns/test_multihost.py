"""One torchrun agent per network namespace: nobody knows rank 0's IP, not even the test."""

from __future__ import annotations

import pytest

from tests.helpers import leader_of, train_on_hosts

pytestmark = pytest.mark.netns


def test_three_hosts_find_each_other_and_train(segment, tmp_path):
    hosts = [segment.add_host(f"198.18.0.{i}") for i in (11, 12, 13)]
    # The interface is pinned to the namespace's own veth; no address is given anywhere.
    agents, reports = train_on_hosts(hosts, tmp_path, {"interface": "eth0"}, steps=6, prefix="netns")
    leader = next(h for h in hosts if h.name == leader_of(agents).name)
    assert {r["env"]["MASTER_ADDR"] for r in reports} == {leader.ip}
    assert {r["env"]["GLOO_SOCKET_IFNAME"] for r in reports} == {"eth0"}
