"""Nodes renew their group membership, so a switch that snoops IGMP without a querier keeps
forwarding discovery datagrams to them (it forgets a port some time after its last report).

A Linux bridge without a querier floods multicast anyway (see ../shared notes), so what is
checked is the bridge's own snooping table: the group stays learned on the node's port past
the membership interval only while the node keeps reporting.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, random_port, unique_job

pytestmark = pytest.mark.netns

GROUP = "239.255.77.77"
MEMBERSHIP_INTERVAL_S = 3  # the bridge forgets a port this long after the port's last report

_NODE = """
import sys, time
from torch_mingle.config import MingleConfig
from torch_mingle.handler import MingleRendezvousHandler
h = MingleRendezvousHandler(MingleConfig(run_id=sys.argv[1], min_nodes=2, max_nodes=2, interface="eth0",
                                         port=int(sys.argv[2]), membership_refresh=float(sys.argv[3])))
print("ready", flush=True)
sys.stdin.read()  # until the test closes our stdin
h.shutdown()
"""


def _learned(segment, port: str) -> bool:
    out = subprocess.run(
        ["ip", "netns", "exec", segment.bridge_ns, "bridge", "mdb", "show", "dev", "br2"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    return any(f"port {port} " in line and f"grp {GROUP}" in line for line in out.splitlines())


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("refresh_s", "kept"), [(1.0, True), (3600.0, False)], ids=["renewed", "not"])
def test_the_group_stays_learned_on_the_nodes_port_only_while_it_reports(segment, refresh_s, kept):
    segment.create_bridge("br2", mcast_snooping=True)
    subprocess.run(
        ["ip", "-n", segment.bridge_ns, "link", "set", "br2", "type", "bridge",
         "mcast_membership_interval", str(MEMBERSHIP_INTERVAL_S * 100)],  # centiseconds
        check=True, timeout=30,
    )  # fmt: skip
    host = segment.add_host("198.18.2.11", bridge="br2")
    port = segment.port_of(host)
    node = subprocess.Popen(
        ["ip", "netns", "exec", host.name, sys.executable, "-c", _NODE, unique_job("igmp"),
         str(random_port()), str(refresh_s)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert node.stdout is not None
        assert node.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while not _learned(segment, port):  # the reports sent on joining
            assert time.monotonic() < deadline, "the bridge never learned the group on the node's port"
            time.sleep(0.1)
        # Three membership intervals: the reports that joining sent (two, 1 s apart) run out.
        end = time.monotonic() + 3 * MEMBERSHIP_INTERVAL_S
        while time.monotonic() < end:
            if kept:
                assert _learned(segment, port), "the bridge forgot the group: no fresh report came"
            elif not _learned(segment, port):
                break
            time.sleep(0.2)
        else:
            assert kept, "the group stayed learned without renewals: this test cannot tell them apart"
    finally:
        node.kill()
        node.wait(timeout=30)
