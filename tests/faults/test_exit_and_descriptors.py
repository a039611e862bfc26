"""The end of a job with a death in torch's exit barrier, and nodes with thousands of descriptors."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from tests.helpers import (
    ROOT,
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    joined_after,
    joins,
    latest_round,
    leader_of,
    random_port,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
)
from torch_mingle._host import DESCRIPTOR_MARGIN, DESCRIPTORS_PER_NODE

pytestmark = pytest.mark.integration

IN_BARRIER = "Waiting 300 seconds for other agents to finish"
BARRIER_DONE = "Done waiting for other agents"
EXTRA_FDS = 1100


def _rank_of(agent) -> int | None:
    """The node rank of the first round ``agent`` joined."""
    joined = joins(agent)
    return joined[0][1] if joined else None


def test_a_member_that_dies_in_the_exit_barrier_does_not_open_it_for_the_others(tmp_path):
    hold = tmp_path / "hold"
    hold.with_name("hold.2").touch()  # rank 2's worker stays busy after training
    conf = {"interface": "127.0.0.1", "port": random_port(), "join_timeout": 60}
    cmd = torchrun_cmd(
        job=unique_job("barrier"), nnodes="3", nproc=1, conf=conf, extra=["--max-restarts=0"],
        script_args=["--steps", "4", "--hold-file", str(hold), "--report", str(tmp_path / "report")],
    )  # fmt: skip
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(3)]
    try:
        wait_until(lambda: all(_rank_of(a) is not None for a in agents), 120, "the round", 0.1, agents)
        by_rank = {_rank_of(a): a for a in agents}
        leader, victim, busy = by_rank[0], by_rank[1], by_rank[2]
        wait_until(lambda: IN_BARRIER in leader.output() and IN_BARRIER in victim.output(), 120,
                   "two agents in the exit barrier", 0.1, agents)  # fmt: skip
        victim.kill()  # dies after it arrived; rank 2's worker still runs
        watched_until = time.monotonic() + 3.0
        while time.monotonic() < watched_until:  # a bounded look for a wrong early exit
            assert BARRIER_DONE not in leader.output(), "the barrier opened under a busy node\n" + dump(
                agents
            )
            assert busy.proc.poll() is None, dump(agents)
            time.sleep(0.1)
        hold.with_name("hold.2").unlink()
        codes = finish_all([leader, busy], timeout=60)
    finally:
        for a in agents:
            a.kill()
    assert codes == [0, 0], dump(agents)
    assert BARRIER_DONE in leader.output() and BARRIER_DONE in busy.output(), dump(agents)
    assert "Error waiting on exit barrier" not in leader.output() + busy.output(), dump(agents)


def test_nodes_with_thousands_of_open_descriptors_survive_a_frozen_member(tmp_path):
    """Every socket of the agents numbers above 1024 (select() would fail there; the loop must not)."""
    conf = {"interface": "127.0.0.1", "port": random_port(), "join_timeout": 120, "last_call_timeout": 1,
            "keep_alive_interval": 1, "keep_alive_max_attempt": 3}  # fmt: skip
    inner = torchrun_cmd(
        job=unique_job("fds"), nnodes="2:3", nproc=1, conf=conf, extra=["--max-restarts=3"],
        script_args=["--steps", "80", "--step-time", "0.1", "--checkpoint", str(tmp_path / "ckpt"),
                     "--report", str(tmp_path / "report")],
    )  # fmt: skip
    cmd = [sys.executable, str(ROOT / "tests" / "with_fds.py"), str(EXTRA_FDS), *inner]
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(3)]
    try:
        wait_until(lambda: any("step 5/" in a.output() for a in agents), 120, "the job to train", 0.1, agents)
        assert all(f"with {EXTRA_FDS} extra descriptors" in a.output() for a in agents), dump(agents)
        leader = leader_of(agents)
        frozen = next(a for a in agents if a is not leader)
        job_round = latest_round(agents)
        frozen.kill(signal.SIGSTOP)
        others = [a for a in agents if a is not frozen]
        wait_until(lambda: all(joined_after(a, job_round) for a in others), 60,
                   "the others to go on without the frozen node", 0.1, agents)  # fmt: skip
        frozen.kill(signal.SIGKILL)
        codes = finish_all(others)
    finally:
        for a in agents:
            a.kill()
    assert codes == [0, 0], dump(agents)
    assert_trained_together(final_reports(tmp_path / "report"), 2, 80, agents)
    for a in others:
        assert "ValueError" not in a.output() and "lost leader" not in a.output(), dump(agents)


_LIMIT_PROBE = """
import logging, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, int(sys.argv[1])))
logging.basicConfig(level=logging.WARNING)
from torch_mingle.config import MingleConfig
from torch_mingle.handler import MingleRendezvousHandler
h = MingleRendezvousHandler(MingleConfig(run_id="limits", min_nodes=1, max_nodes=1024, interface="127.0.0.1",
                                          port=int(sys.argv[2])))
print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0], flush=True)
h.shutdown()
"""


#: What leading 1,024 nodes of 8 workers takes, by the handler's own accounting.
NEED_FOR_1024 = 1024 * DESCRIPTORS_PER_NODE + DESCRIPTOR_MARGIN


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("hard", "soft_after", "warned"), [(20000, NEED_FOR_1024, False), (4096, 4096, True)]
)
def test_a_node_raises_its_descriptor_limit_to_what_leading_its_job_takes(hard, soft_after, warned):
    import resource
    import subprocess

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < hard:
        pytest.skip(f"this machine's hard descriptor limit is below {hard}")
    out = subprocess.run(  # a process of its own: the limit is per process
        [sys.executable, "-c", _LIMIT_PROBE, str(hard), str(random_port())],
        capture_output=True, text=True, timeout=90, cwd=ROOT, check=True,
    )  # fmt: skip
    assert f"soft {soft_after}\n" in out.stdout, out
    assert (
        f"ulimit -n {NEED_FOR_1024}" in out.stderr and "docs/networks.md#limits" in out.stderr
    ) is warned, out.stderr
