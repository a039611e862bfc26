"""Slurm for real: ``sbatch`` of the examples on a 3-node cluster, one namespace per node.

No address, no rendezvous id and no rank appear in either script: mingle takes the job's id
from ``$SLURM_JOB_ID`` and finds rank 0 by multicast between the nodes' namespaces.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT, assert_trained_together, final_reports, kill_tree
from tests.slurm.cluster import Cluster, slurm_available

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

EXAMPLES = ROOT / "examples" / "slurm"
JOB_END_S = 300.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = slurm_available()
    if why is not None:
        pytest.skip(why)
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _submit(cluster: Cluster, script: Path, out: Path, **env: str) -> str:
    """sbatch ``script``; the job gets sbatch's environment (``--export=ALL``) with ``env``, and
    runs the project's Python (torchrun on PATH) from the repository, as a user's would."""
    env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    done = cluster.run(
        "sbatch", "--parsable", f"--chdir={ROOT}", f"--output={out}", "--export=ALL", str(script), env=env
    )
    return done.stdout.strip().split(";")[0]


def _state(cluster: Cluster, job: str) -> str:
    shown = cluster.run("scontrol", "show", "job", job, check=False).stdout
    found = re.search(r"JobState=(\w+)", shown)
    return found.group(1) if found else "GONE"


def _wait_until_done(cluster: Cluster, job: str, out: Path) -> str:
    deadline = time.monotonic() + JOB_END_S
    while (state := _state(cluster, job)) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        if time.monotonic() > deadline:
            cluster.run("scancel", job, check=False)
            why = f"job {job} still {state} after {JOB_END_S:g}s"
            raise AssertionError(f"{why}\n{_read(out)}\n{cluster.logs()}")
        time.sleep(0.5)
    return state


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else "(no output yet)"


def _agent_on(cluster: Cluster, node: int) -> int | None:
    """The torchrun agent of the job on that node (by PID, in that node's namespace)."""
    for pid in cluster.processes_on(cluster.hosts[node]):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"torchrun") for part in cmdline[:2]):
            return pid
    return None


def test_the_scripts_carry_no_address_no_id_and_no_rank():
    for script in ("train.sbatch", "srun_spawn.sbatch", "srun_spawn.py"):
        lines = (EXAMPLES / script).read_text().splitlines()
        text = "\n".join(line for line in lines if not line.lstrip().startswith("#") or "#SBATCH" in line)
        for needle in ("MASTER_ADDR=", "--rdzv_endpoint", "--rdzv_id", "scontrol show hostnames"):
            assert needle not in text, f"{script} names {needle}"
        assert not re.search(r"\b\d{1,3}(\.\d{1,3}){3}\b", text), f"{script} holds an address"


def test_sbatch_trains_over_three_nodes_and_survives_a_killed_agent(cluster, tmp_path):
    out, report = tmp_path / "job.out", tmp_path / "report"
    conf = "interface=eth0,join_timeout=120,last_call_timeout=2,keep_alive_interval=1"
    args = f"--steps 60 --step-time 0.1 --checkpoint {tmp_path / 'ckpt'} --report {report}"
    job = _submit(cluster, EXAMPLES / "train.sbatch", out, MINGLE_CONF=conf, TRAIN_ARGS=args,
                  TORCH_MINGLE_LOG="info", OMP_NUM_THREADS="1")  # fmt: skip
    deadline = time.monotonic() + 180
    while "step 5/60" not in _read(out):
        assert time.monotonic() < deadline, f"no training within 180 s\n{_read(out)}\n{cluster.logs()}"
        assert _state(cluster, job) in ("PENDING", "CONFIGURING", "RUNNING"), _read(out)
        time.sleep(0.5)
    assert f"rdzv_id: Slurm job {job}" in _read(out)
    victim = _agent_on(cluster, 2)
    assert victim is not None, f"no torchrun agent on node3\n{_read(out)}"
    kill_tree(victim, signal.SIGKILL)  # the agent and its workers, as if that node died
    _wait_until_done(cluster, job, out)
    reports = final_reports(report)
    assert_trained_together(reports, 2, 60)
    text = _read(out)
    assert len(set(re.findall(r"joined round (\d+) as rank", text))) >= 2, text  # a round after the kill
    # The first round's ranks follow Slurm's node order (rank_order=env:SLURM_NODEID) around from the
    # leader: srun --label puts each node's task number (its SLURM_NODEID) before its lines.
    first = dict(re.findall(r"^(\d+): .*joined round \d+ as rank (\d) of 3", text, re.MULTILINE))
    ring = [node for node, _ in sorted(first.items(), key=lambda item: item[1])]
    assert len(ring) == 3 and ring in (["0", "1", "2"], ["1", "2", "0"], ["2", "0", "1"]), (first, text)


def test_srun_spawn_needs_no_address_either(cluster, tmp_path):
    out = tmp_path / "spawn.out"
    job = _submit(cluster, EXAMPLES / "srun_spawn.sbatch", out, SPAWN_ARGS="--conf interface=eth0",
                  OMP_NUM_THREADS="1")  # fmt: skip
    state = _wait_until_done(cluster, job, out)
    text = _read(out)
    assert state == "COMPLETED", f"{state}\n{text}\n{cluster.logs()}"
    lines = [line for line in text.splitlines() if "sum of ranks" in line]
    assert len(lines) == 3 and all("sum of ranks 3 (expected 3)" in line for line in lines), text
    assert sorted(int(re.search(r"rank (\d)/3", line).group(1)) for line in lines) == [0, 1, 2]  # type: ignore[union-attr]
