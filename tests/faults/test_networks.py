"""Networks that misbehave, one agent per namespace: link-local IPv6 only, duplicate paths, lost packets."""

from __future__ import annotations

import ast
import ipaddress
import re

import pytest

from tests.helpers import (
    agent_env,
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    start_agent,
    torchrun_cmd,
    train_on_hosts,
    unique_job,
    wait_until,
)
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
    duplicates = 0
    for a in agents:
        assert "(replayed)" not in a.output(), dump(agents)
        # The debug counters of each round: every datagram dropped was a copy, none a replay
        # or anything else. (A node may join before a second copy of anything reaches it: a
        # count of none on one node is no failure, a count of none on all three is.)
        counted = re.findall(r"discovery counters: .*; dropped (\{[^}]*\}|none);", a.output())
        assert counted, dump(agents)
        for dropped in counted:
            kinds = {} if dropped == "none" else ast.literal_eval(dropped)
            assert set(kinds) <= {"duplicate"}, dump(agents)
            duplicates += kinds.get("duplicate", 0)
    assert duplicates > 0, dump(agents)


def test_a_job_forms_under_random_packet_loss(segment, tmp_path):
    reason = nftables_available()
    if reason is not None:
        pytest.skip(reason)
    hosts = [segment.add_host(f"198.18.0.{i}") for i in (11, 12, 13)]
    for h in hosts:
        segment.loss(h, 20)  # a fifth of all packets, datagrams and TCP alike, never arrive
    # TCP retransmits what is lost, so heartbeats arrive late, not never: give them room.
    conf = {"interface": "eth0", "join_timeout": 120, "keep_alive_interval": 1, "keep_alive_max_attempt": 10}
    cmd = torchrun_cmd(
        job=unique_job("loss"), nnodes="3", nproc=1, conf=conf, extra=["--max-restarts=3"],
        script_args=["--steps", "10", "--report", str(tmp_path / "report")],
    )  # fmt: skip
    agents = [start_agent(h.name, cmd, tmp_path, netns=h.name) for h in hosts]
    try:
        # The rendezvous (discovery, election, joins, the round) happens under the loss...
        wait_until(lambda: all("joined round " in a.output() for a in agents), 120,
                   "the round to form under loss", 0.1, agents)  # fmt: skip
    finally:
        # ...the training does not: gloo has no heartbeat of its own, and 20 % loss makes TCP
        # back off for tens of seconds, which would test gloo, not mingle.
        for h in hosts:
            segment.no_loss(h)
    assert finish_all(agents) == [0, 0, 0], dump(agents)
    assert_trained_together(final_reports(tmp_path / "report"), 3, 10, agents)
