"""Real torchrun agents on 127.0.0.1: DDP over gloo with --rdzv_backend=mingle and no address."""

from __future__ import annotations

import time

import pytest

from tests.helpers import (
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    random_port,
    start_agent,
    torchrun_cmd,
    unique_job,
)

pytestmark = pytest.mark.integration


def test_three_agents_train_ddp_and_agree_on_everything(tmp_path):
    job, port = unique_job("ddp"), random_port()
    cmd = torchrun_cmd(
        job=job, nnodes="3", nproc=2, conf={"interface": "127.0.0.1", "port": port},
        script_args=["--steps", "8", "--report", str(tmp_path / "report")],
    )  # fmt: skip
    agents = [start_agent(f"node{i}", cmd, tmp_path) for i in range(3)]
    codes = finish_all(agents)
    assert codes == [0, 0, 0], dump(agents)
    reports = final_reports(tmp_path / "report")
    # Every rank trained every step, DDP kept the replicas identical, and all were given one store...
    assert_trained_together(reports, 6, 8, agents)
    # ...though nobody configured an address: the agents handed the workers rank 0's IP.
    assert {r["env"]["MASTER_ADDR"] for r in reports} == {"127.0.0.1"}
    assert {r["env"]["GLOO_SOCKET_IFNAME"] for r in reports} == {"lo"}
    assert all("joined round 1 as rank" in a.output() for a in agents)
    # The round's fencing token, for checkpoints (docs/design.md#fencing): the first term, round 1.
    assert {(r["env"]["MINGLE_EPOCH"], r["env"]["MINGLE_ROUND"]) for r in reports} == {("1", "1")}


def test_a_lone_agent_fails_within_join_timeout_with_a_clear_error(tmp_path):
    join_timeout = 4
    cmd = torchrun_cmd(
        job=unique_job("alone"), nnodes="2", nproc=1,
        conf={"interface": "127.0.0.1", "port": random_port(), "join_timeout": join_timeout},
    )  # fmt: skip
    started = time.monotonic()
    (agent,) = [start_agent("alone", cmd, tmp_path)]
    codes = finish_all([agent], timeout=90)
    elapsed = time.monotonic() - started
    out = agent.output()
    assert codes != [0], out
    assert "MingleTimeoutError" in out, out
    assert "timed out after" in out
    assert "interface lo (127.0.0.1)" in out
    assert "group 239.255.77.77 port" in out
    assert "What to try:" in out
    # Python and torch take a few seconds to start; the rendezvous itself gives up on time.
    assert elapsed < join_timeout + 30, out


def test_a_bad_rdzv_conf_key_is_named_with_its_fix(tmp_path):
    cmd = torchrun_cmd(
        job=unique_job("typo"), nnodes="2", nproc=1, conf={"interface": "127.0.0.1", "prot": 5}
    )
    (agent,) = [start_agent("typo", cmd, tmp_path)]
    codes = finish_all([agent], timeout=90)
    out = agent.output()
    assert codes != [0], out
    assert "unknown --rdzv_conf key 'prot'" in out
    assert "Did you mean 'port'?" in out
