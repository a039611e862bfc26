"""OS errors on the discovery sockets become messages that name the cause and the fix."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers import dump, finish_all, start_agent, torchrun_cmd, unique_job

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


def test_a_resolver_that_drops_queries_costs_the_join_time_not_a_failed_try(segment, tmp_path):
    """torch's store client resolves the store's address back to a name before it connects (an
    IPv4-mapped one, which /etc/hosts does not hold), so every connect waits for the resolver.
    Here each host's resolver drops every query, 2 s a try: longer than keep_alive_timeout
    (1.4 s), which once bounded the first try at the round's store. The join waits it out: no
    try fails, no trace of torch's, nothing above INFO, and the job trains."""
    hosts = [segment.add_host(f"198.18.0.{31 + i}") for i in range(2)]
    for host in hosts:
        segment.silent_resolver(host, timeout_s=2)
    secret = tmp_path / "secret"
    secret.write_text("a-secret-for-the-slow-resolver-0123456789")
    secret.chmod(0o600)
    cmd = torchrun_cmd(
        job=unique_job("resolver"), nnodes="2", nproc=1, conf={"interface": "eth0", "secret_file": secret},
        script_args=["--steps", "3", "--report", str(tmp_path / "report")],
    )  # fmt: skip
    agents = [start_agent(h.name, cmd, tmp_path, netns=h.name) for h in hosts]
    assert finish_all(agents, timeout=180) == [0, 0], dump(agents)
    for agent in agents:
        out = agent.output()
        joined = [float(s) for s in re.findall(r"joined round 1 as rank \d of 2 .* in (\d+\.\d+)s", out)]
        assert len(joined) == 1, out
        assert joined[0] >= 2.0, f"the join did not wait for the resolver: {out}"  # it was in the way
        assert "trying again" not in out, out
        assert not re.search(r"^\[E\d+ |Traceback|mingle (WARNING|ERROR)", out, re.MULTILINE), out
