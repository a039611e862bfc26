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


RUNS = 50
CLOSE_TIMEOUT_S = 20.0


def test_the_close_is_quiet_and_prompt_in_every_run(tmp_path):
    """Two processes meet, train a step and leave, 50 times: nothing on stderr (no "lost" node,
    no traces of torch's store clients) and no close that waits for ``close_timeout``: rank 0
    keeps the store up only until the other rank has left."""
    secret = tmp_path / "secret"
    secret.write_text("a-secret-for-the-quiet-close-0123456789")
    secret.chmod(0o600)
    job, port = f"quiet-{random_port()}", str(random_port())
    args = [
        sys.executable,
        "-m",
        "tests.standalone_loop",
        job,
        port,
        str(RUNS),
        str(secret),
        str(CLOSE_TIMEOUT_S),
    ]
    env = agent_env(TORCH_MINGLE_LOG="warning")  # our warnings, and nothing of the rest
    procs = [
        subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out + err[-4000:]
        assert err == "", err[-4000:]
    slowest = [float(m) for out, _ in outs for m in re.findall(r"slowest close (\d+\.\d+)s", out)]
    assert len(slowest) == 2, outs
    assert max(slowest) < CLOSE_TIMEOUT_S / 2, f"a close waited for close_timeout: {slowest}"
