"""``python -m torch_mingle ls|doctor`` against real torchrun agents on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT, finish_all, random_port, start_agent, torchrun_cmd, unique_job, wait_until

pytestmark = pytest.mark.integration


def mingle(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch_mingle", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def test_ls_and_doctor_see_a_running_job(tmp_path):
    job, port = unique_job("visible"), random_port()
    cmd = torchrun_cmd(
        job=job, nnodes="2", nproc=1, conf={"interface": "127.0.0.1", "port": port},
        script_args=["--steps", "200", "--step-time", "0.1", "--quiet"],
    )  # fmt: skip
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(2)]
    try:
        wait_until(lambda: all("joined round 1" in a.output() for a in agents), 120, "round 1", agents=agents)
        where = ["--interface", "127.0.0.1", "--port", str(port)]
        listing = mingle("ls", *where, "--json")
        assert listing.returncode == 0, listing.stderr
        (seen,) = [j for j in json.loads(listing.stdout) if j["job"] == job]
        assert seen["leader_ip"] == "127.0.0.1"
        assert (seen["members"], seen["round"], seen["epoch"]) == (2, 1, 1)
        assert (seen["min_nodes"], seen["max_nodes"], seen["closed"]) == (2, 2, False)
        table = mingle("ls", *where)
        assert any(job in line and "running" in line for line in table.stdout.splitlines()), table.stdout
        doctor = mingle("doctor", *where, "--seconds", "1")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "lo: joined the group" in doctor.stdout
        assert f"job '{job}': leader 127.0.0.1, epoch 1, round 1, 2 node(s)" in doctor.stdout
    finally:
        for agent in agents:
            agent.kill()
        finish_all(agents, timeout=30)


def test_two_doctors_hear_each_other_on_loopback():
    args = ["doctor", "--interface", "127.0.0.1", "--port", str(random_port()), "--job", unique_job("doc"),
            "--seconds", "2"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "torch_mingle", *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "OK: multicast reaches 1 other node(s) on lo" in out


def test_check_gpu_skips_a_machine_without_a_gpu_and_says_so():
    import torch

    done = mingle("check-gpu")
    if torch.cuda.is_available():  # on a GPU machine it checks for real
        assert done.returncode == 0 and "GPU(s) compute; NCCL" in done.stdout, done.stdout + done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "check-gpu: no CUDA device on this machine; nothing to check (skipped)"
