"""Real torchrun agents on 127.0.0.1: DDP over gloo with --rdzv_backend=mingle and no address."""

from __future__ import annotations

import time

import pytest

from tests.helpers import (
    agent_env,
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    latest_round,
    random_port,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
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
    assert all("joined round " in a.output() for a in agents)
    # The round's fencing token, for checkpoints (docs/design.md#fencing): one for all, the round
    # every agent logged (round 1 of epoch 1 unless the first election was contested).
    ((epoch, round_no),) = {(r["env"]["MINGLE_EPOCH"], r["env"]["MINGLE_ROUND"]) for r in reports}
    assert int(epoch) >= 1 and int(round_no) == latest_round(agents), dump(agents)


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
    # Said at ERROR before torch's traceback, not only as its last line.
    said = out.index("mingle rendezvous refused its settings: unknown --rdzv_conf key 'prot'")
    assert "Traceback" in out[said:] and "Traceback" not in out[:said], out


def test_a_follower_of_a_job_that_never_formed_fails_with_the_leaders_reason(tmp_path):
    """Two of three nodes start: the leader times out, and so does the job for the follower it
    counted, with the leader's reason (it exited 0, "finished", as if it had trained)."""
    conf = {"interface": "127.0.0.1", "port": random_port(), "join_timeout": 8}
    cmd = torchrun_cmd(job=unique_job("never"), nnodes="3", nproc=1, conf=conf)
    first = start_agent("first", cmd, tmp_path)
    wait_until(lambda: "leader: this node" in first.output(), 60, "the first node to lead", agents=[first])
    second = start_agent("second", cmd, tmp_path)
    codes = finish_all([first, second], timeout=120)
    out = second.output()
    assert codes[0] != 0 and "2 of min_nodes=3 nodes joined" in first.output(), dump([first, second])
    assert codes[1] != 0, dump([first, second])
    assert "the job failed" in out and "2 of min_nodes=3 nodes joined" in out, out
    assert "nothing to do" not in out and "worker group successfully finished" not in out, out


def test_an_agent_without_a_rdzv_id_is_refused_with_the_fix(tmp_path):
    """torchrun's default id ("none") would make every job started without one the same job."""
    conf = {"interface": "127.0.0.1", "port": random_port()}
    cmd = torchrun_cmd(job="none", nnodes="1", nproc=1, conf=conf)
    env = {k: v for k, v in agent_env().items() if not k.startswith("SLURM_")}
    (agent,) = [start_agent("no-id", cmd, tmp_path, env=env)]
    codes = finish_all([agent], timeout=90)
    out = agent.output()
    assert codes != [0], out
    assert "no --rdzv_id was given" in out and "--rdzv_id=<job name>" in out, out
    assert "Traceback" not in out.split("MingleConfigError")[-1], out
