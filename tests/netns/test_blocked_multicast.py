"""A network that drops multicast (broadcast and unicast still pass): doctor says so, fallbacks work."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from tests.helpers import (
    ROOT,
    agent_env,
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    start_agent,
    torchrun_cmd,
    train_on_hosts,
    unique_job,
)

pytestmark = pytest.mark.netns


@pytest.fixture
def blocked(segment):
    segment.create_bridge("br1", mcast_snooping=False)
    hosts = [segment.add_host(f"198.18.1.{i}", bridge="br1") for i in (11, 12, 13)]
    segment.drop_multicast()
    return hosts


def _doctors(hosts, job):
    cmd = [
        sys.executable,
        "-m",
        "torch_mingle",
        "doctor",
        "--job",
        job,
        "--seconds",
        "3",
        "--interface",
        "eth0",
    ]
    procs = [
        subprocess.Popen(["ip", "netns", "exec", h.name, *cmd], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for h in hosts
    ]
    return [(p.wait(timeout=60), p.communicate()[0]) for p in procs]


def test_doctor_names_dropped_multicast_and_the_fallback(blocked):
    for code, out in _doctors(blocked, unique_job("doc")):
        assert code == 1, out
        assert "multicast reaches nobody, but broadcast does" in out
        assert "fallback=broadcast" in out


def test_doctor_passes_where_multicast_works(segment):
    hosts = [segment.add_host(f"198.18.0.{i}") for i in (11, 12)]
    for code, out in _doctors(hosts, unique_job("doc")):
        assert code == 0, out
        assert "OK: multicast reaches 1 other node(s) on eth0" in out


@pytest.mark.parametrize(
    "conf",
    [
        {"fallback": "broadcast"},
        # torchrun splits --rdzv_conf on commas: several peers are separated by ';'.
        {"peers": "198.18.1.11;198.18.1.12;198.18.1.13"},
    ],
    ids=["broadcast", "peers"],
)
def test_rendezvous_completes_without_multicast(blocked, tmp_path, conf):
    conf = {"interface": "eth0", "join_timeout": 60, **conf}
    _, reports = train_on_hosts(blocked, tmp_path, conf, steps=3, prefix="nomcast")
    assert sorted(r["rank"] for r in reports) == [0, 1, 2]
    assert len({r["env"]["MASTER_ADDR"] for r in reports}) == 1


def test_a_slurm_job_forms_on_its_node_list_when_multicast_is_dropped(segment, blocked, tmp_path):
    # What srun gives every task: the job's id and its node list; no --rdzv_id, no peers.
    segment.name_hosts({f"gpu{i + 1}": h for i, h in enumerate(blocked)})
    slurm_job = str(random.randrange(10**6, 10**7))
    env = agent_env(SLURM_JOB_ID=slurm_job, SLURM_JOB_NODELIST="gpu[1-3]")
    cmd = torchrun_cmd(
        job="none", nnodes="3", nproc=1, conf={"interface": "eth0", "join_timeout": 60},
        script_args=["--steps", "3", "--report", str(tmp_path / "report")],
    )  # fmt: skip
    agents = [start_agent(h.name, cmd, tmp_path, netns=h.name, env=env, job=slurm_job) for h in blocked]
    assert finish_all(agents) == [0, 0, 0], dump(agents)
    assert_trained_together(final_reports(tmp_path / "report"), 3, 3, agents)
    for agent in agents:
        assert f"rdzv_id: Slurm job {slurm_job}" in agent.output()
    tried = [a for a in agents if "trying the 3 hosts of the Slurm node list by unicast" in a.output()]
    assert tried, dump(agents)
