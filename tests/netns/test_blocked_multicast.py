"""A network that drops multicast (broadcast and unicast still pass): doctor says so, fallbacks work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT, train_on_hosts, unique_job

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
