"""The standalone API: processes of torch.multiprocessing.spawn meet without torchrun and train over gloo."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT, agent_env, random_port

pytestmark = pytest.mark.integration


def test_mp_spawn_processes_find_rank_0_and_all_reduce():
    example = ROOT / "examples" / "standalone_mp_spawn.py"
    run = subprocess.run(
        [sys.executable, str(example), "--nprocs", "3", "--port", str(random_port())],
        capture_output=True, text=True, timeout=180, check=False, env=agent_env(), cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    lines = re.findall(r"rank (\d)/3, rank 0 at 127\.0\.0\.1:\d+, sum of ranks (\d+)", run.stdout)
    assert sorted(int(rank) for rank, _ in lines) == [0, 1, 2], run.stdout
    assert {int(total) for _, total in lines} == {3}
