"""OS errors on the discovery sockets become messages that name the cause and the fix."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import finish_all, start_agent, torchrun_cmd, unique_job

pytestmark = pytest.mark.netns


def test_the_kernels_membership_limit_is_named_with_the_sysctl_to_raise(segment, tmp_path):
    host = segment.add_host("198.18.0.21")
    # The limit is per network namespace: this changes nothing outside the test's own host.
    subprocess.run(
        ["ip", "netns", "exec", host.name, "sysctl", "-qw", "net.ipv4.igmp_max_memberships=0"],
        check=True,
        timeout=30,
    )
    cmd = torchrun_cmd(job=unique_job("enobufs"), nnodes="1", nproc=1, conf={"interface": "eth0"})
    agent = start_agent("enobufs", cmd, tmp_path, netns=host.name)
    codes = finish_all([agent], timeout=120)
    out = agent.output()
    assert codes != [0], out
    assert "MingleNetworkError" in out
    assert "joining the multicast group on interface eth0 (198.18.0.21)" in out
    assert "sysctl -w net.ipv4.igmp_max_memberships" in out
