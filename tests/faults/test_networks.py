"""Networks that misbehave, one agent per namespace: link-local IPv6 only, duplicate paths, lost packets."""

from __future__ import annotations

import ipaddress

import pytest

from tests.helpers import agent_env, dump, train_on_hosts
from tests.netns.segment import nftables_available

pytestmark = pytest.mark.netns


def test_hosts_with_only_link_local_ipv6_addresses_train_together(segment, tmp_path):
    # No global address anywhere: a scope is all that tells fe80::12 on eth0 from fe80::12 elsewhere.
    hosts = [segment.add_host(f"fe80::{i}", prefix=64, ipv6=True) for i in (11, 12, 13)]
    agents, reports = train_on_hosts(hosts, tmp_path, {"group": "ff12::7777", "interface": "eth0"}, steps=4)
    (master,) = {r["env"]["MASTER_ADDR"] for r in reports}
    assert ipaddress.ip_address(master.partition("%")[0]).is_link_local, master
    assert master.partition("%")[0] in {h.ip for h in hosts}, dump(agents)


def test_with_a_secret_the_copies_that_several_paths_deliver_are_duplicates_not_replays(segment, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("a-secret-for-the-duplicates-test\n")
    secret.chmod(0o600)
    hosts = [segment.add_host(f"198.18.0.{i}") for i in (11, 12, 13)]
    conf = {"interface": "eth0", "fallback": "broadcast", "secret_file": str(secret)}
    # Every datagram arrives twice: by multicast and by broadcast.
    agents, _ = train_on_hosts(hosts, tmp_path, conf, steps=4, env=agent_env(TORCH_MINGLE_LOG="debug"))
    for a in agents:
        out = a.output()
        assert "(replayed)" not in out, dump(agents)
        assert "'duplicate':" in out, dump(agents)  # counted, in the debug counters of each round


def test_a_job_forms_trains_and_survives_under_random_packet_loss(segment, tmp_path):
    reason = nftables_available()
    if reason is not None:
        pytest.skip(reason)
    hosts = [segment.add_host(f"198.18.0.{i}") for i in (11, 12, 13)]
    for h in hosts:
        segment.loss(h, 20)  # a fifth of all packets, datagrams and TCP alike, never arrive
    # TCP retransmits what is lost, so heartbeats arrive late, not never: give them room.
    conf = {"interface": "eth0", "keep_alive_interval": 1, "keep_alive_max_attempt": 10}
    train_on_hosts(hosts, tmp_path, conf, steps=20, extra=["--max-restarts=3"])
