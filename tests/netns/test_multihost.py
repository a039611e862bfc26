"""One torchrun agent per network namespace: nobody knows rank 0's IP, not even the test."""

from __future__ import annotations

import re

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


def test_three_hosts_find_each_other_and_train(segment, tmp_path):
    hosts = [segment.add_host(f"198.18.0.{i}") for i in (11, 12, 13)]
    cmd = torchrun_cmd(
        job=unique_job("netns"), nnodes="3", nproc=1,
        # The interface is pinned to the namespace's own veth; no address is given anywhere.
        conf={"interface": "eth0", "join_timeout": 120},
        script_args=["--steps", "6", "--report", str(tmp_path / "report")],
    )  # fmt: skip
    agents = [start_agent(h.name, cmd, tmp_path, netns=h.name) for h in hosts]
    codes = finish_all(agents)
    assert codes == [0, 0, 0], dump(agents)
    leaders = [h for h, a in zip(hosts, agents, strict=True) if re.search(r"this node leads job", a.output())]
    assert len(leaders) == 1, dump(agents)
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 3, 6, agents)
    assert {r["env"]["MASTER_ADDR"] for r in reports} == {leaders[0].ip}
    assert {r["env"]["GLOO_SOCKET_IFNAME"] for r in reports} == {"eth0"}
