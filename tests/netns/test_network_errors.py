"""OS errors on the discovery sockets become messages that name the cause and the fix."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, dump, finish_all, start_agent, torchrun_cmd, unique_job, write_secret

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
    (1.4 s), which bounds a try at the round's store. The join waits it out (the port accepted,
    so torch's lookup gets ``RESOLVER_ALLOWANCE_S``): no try fails, no trace of torch's,
    nothing above INFO, and the job trains."""
    hosts = [segment.add_host(f"198.18.0.{31 + i}") for i in range(2)]
    for host in hosts:
        segment.silent_resolver(host, timeout_s=2)
    secret = write_secret(tmp_path, "secret", "a-secret-for-the-slow-resolver-0123456789")
    cmd = torchrun_cmd(
        job=unique_job("resolver"), nnodes="2", nproc=1, conf={"interface": "eth0", "secret_file": secret},
        script_args=["--steps", "3", "--report", str(tmp_path / "report")],
    )  # fmt: skip
    agents = [start_agent(h.name, cmd, tmp_path, netns=h.name) for h in hosts]
    assert finish_all(agents, timeout=180) == [0, 0], dump(agents)
    joined = []
    for agent in agents:
        out = agent.output()
        joined += [float(s) for s in re.findall(r"joined round \d+ as rank \d of 2 .* in (\d+\.\d+)s", out)]
        assert "trying again" not in out, out
        assert not re.search(r"^\[E\d+ |Traceback|mingle (WARNING|ERROR)", out, re.MULTILINE), out
    assert len(joined) == 2, dump(agents)
    assert max(joined) >= 2.0, f"no join waited for the resolver: {joined}"  # it was in the way


def test_doctor_names_a_resolver_that_every_store_connect_waits_for(segment):
    """doctor makes the reverse lookup torch's store client makes before every connect: on a
    host whose resolver drops queries it warns, with the fix; on one whose resolver fails at
    once (no route to it, so every query errors out) it only says how long the lookups took."""
    slow, fast = segment.add_host("198.18.0.41"), segment.add_host("198.18.0.42")
    segment.silent_resolver(slow, timeout_s=3)
    cmd = [sys.executable, "-m", "torch_mingle", "doctor", "--seconds", "1", "--interface", "eth0"]
    outs = {}
    for host in (slow, fast):
        done = subprocess.run(
            ["ip", "netns", "exec", host.name, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        outs[host.name] = (done.returncode, done.stdout + done.stderr)
    code, out = outs[slow.name]
    assert code == 0, out  # a warning: the job still forms, more slowly
    assert "WARNING: 3 of 3 reverse lookups of ::ffff:198.18.0.41 had no answer within 1.5s" in out, out
    assert "options timeout:1 attempts:1" in out, out
    code, out = outs[fast.name]
    assert "WARNING" not in out, out
    assert "resolver: the slowest of 3 reverse lookups of ::ffff:198.18.0.42 took" in out, out
