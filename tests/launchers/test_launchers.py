"""The launchers people already use, each with the mingle backend and no address: two nodes on
127.0.0.1, CPU and gloo, the real launcher package (pinned in the dev extra), the commands of
docs/usage.md#launchers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    ROOT,
    TRAIN,
    Agent,
    agent_env,
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

EXAMPLES = ROOT / "examples" / "launchers"
BIN = Path(sys.executable).parent
ENDPOINT_IGNORED = "is not used by the mingle backend"


def _reports(report_dir: Path) -> list[dict[str, Any]]:
    return sorted((json.loads(p.read_text()) for p in report_dir.glob("rank*.json")), key=lambda r: r["rank"])


def _same_replicas_on_one_store(reports: list[dict[str, Any]], world: int, agents: list[Agent]) -> None:
    assert [r["rank"] for r in reports] == list(range(world)), dump(agents)
    assert {r["world_size"] for r in reports} == {world}, dump(agents)
    assert all(r["params"] == reports[0]["params"] for r in reports), "DDP replicas diverged"
    assert {r["master_addr"] for r in reports} == {"127.0.0.1"}, dump(agents)


def test_accelerate_launch(tmp_path):
    pytest.importorskip("accelerate")
    job, report = unique_job("acc"), tmp_path / "report"
    (tmp_path / "hf").mkdir()
    # accelerate has no --rdzv_id; torchrun's own variable gives one (the default is "none").
    # ACCELERATE_USE_CPU=1: on a machine without GPUs --multi_gpu runs on the CPU (gloo).
    env = agent_env(HF_HOME=str(tmp_path / "hf"), ACCELERATE_USE_CPU="1", PET_RDZV_ID=job)
    agents, port = [], random_port()
    for rank in range(2):
        cmd = [
            BIN / "accelerate", "launch", "--multi_gpu", "--num_machines", "2", "--num_processes", "2",
            "--machine_rank", str(rank), "--main_process_port", "0",
            "--rdzv_backend", "mingle", "--rdzv_conf", f"interface=127.0.0.1,port={port}",
            "--mixed_precision", "no", "--dynamo_backend", "no",
            EXAMPLES / "train_accelerate.py", "--report", report,
        ]  # fmt: skip
        agents.append(start_agent(f"acc{rank}", [str(c) for c in cmd], tmp_path, env=env, job=job))
    assert finish_all(agents) == [0, 0], dump(agents)
    _same_replicas_on_one_store(_reports(report), 2, agents)
    # accelerate built "--rdzv_endpoint None:<port>" itself: accepted, ignored, said once.
    assert all(a.output().count(ENDPOINT_IGNORED) == 1 for a in agents), dump(agents)
    assert all("'None:" in a.output() for a in agents), dump(agents)


def test_torchx_dist_ddp_on_the_local_scheduler(tmp_path):
    pytest.importorskip("torchx")
    report = tmp_path / "report"
    # dist.ddp takes no --rdzv_conf: mingle's keys come from $TORCH_MINGLE_<KEY>. It runs the
    # replicas with `torchrun` from PATH, as a shell command each.
    env = agent_env(
        TORCH_MINGLE_INTERFACE="127.0.0.1",
        TORCH_MINGLE_PORT=str(random_port()),
        PATH=f"{BIN}:{agent_env()['PATH']}",
    )
    cmd = [
        BIN / "torchx", "run", "-s", "local_cwd", "-cfg", f"log_dir={tmp_path / 'torchx'}",
        "dist.ddp", "-j", "2x1", "--rdzv_backend", "mingle", "--script", TRAIN,
        "--", "--steps", "3", "--report", report,
    ]  # fmt: skip
    # The app id is torchx's; it waits for the app and exits non-zero unless it SUCCEEDED.
    agent = start_agent("torchx", [str(c) for c in cmd], tmp_path, env=env, job="train_ddp", cwd=tmp_path)
    assert finish_all([agent]) == [0], dump([agent])
    assert "Job finished: SUCCEEDED" in agent.output(), dump([agent])
    assert_trained_together(final_reports(report), 2, 3, [agent])
    assert {r["env"]["MASTER_ADDR"] for r in final_reports(report)} == {"127.0.0.1"}
    # dist.ddp passes "--rdzv_endpoint localhost:29500": ignored, said once per node.
    assert agent.output().count(ENDPOINT_IGNORED) == 2, dump([agent])


def test_lightning_trainer_ddp_under_torchrun(tmp_path):
    pytest.importorskip("lightning")
    job, report = unique_job("pl"), tmp_path / "report"
    conf = {"interface": "127.0.0.1", "port": random_port()}
    cmd = torchrun_cmd(job=job, nnodes="2", nproc=1, conf=conf, script_args=["--report", str(report)])
    cmd[cmd.index(str(TRAIN))] = str(EXAMPLES / "train_lightning.py")
    agents = [start_agent(f"pl{i}", cmd, tmp_path) for i in range(2)]
    assert finish_all(agents) == [0, 0], dump(agents)
    reports = _reports(report)
    _same_replicas_on_one_store(reports, 2, agents)
    # Lightning's TorchElasticEnvironment took the node rank from mingle's agent (GROUP_RANK).
    assert sorted(r["node_rank"] for r in reports) == [0, 1], dump(agents)


def test_torch_elastic_launch_api(tmp_path):
    job, report = unique_job("el"), tmp_path / "report"
    cmd = [
        sys.executable, str(EXAMPLES / "elastic_launch.py"), "--nnodes", "2", "--run-id", job,
        "--rdzv-conf", f"interface=127.0.0.1,port={random_port()}", "--report", str(report),
    ]  # fmt: skip
    agents = [start_agent(f"el{i}", cmd, tmp_path, job=job) for i in range(2)]
    assert finish_all(agents) == [0, 0], dump(agents)
    reports = _reports(report)
    assert [r["rank"] for r in reports] == [0, 1], dump(agents)
    assert {(r["world_size"], r["sum"], r["master_addr"]) for r in reports} == {(2, 3.0, "127.0.0.1")}
    assert all(ENDPOINT_IGNORED not in a.output() for a in agents)
