"""examples/train_ddp.py never overwrites a checkpoint written under a newer epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

_SAVE = """
import sys
sys.path.insert(0, "examples")
from pathlib import Path
import torch
from train_ddp import save_checkpoint
model = torch.nn.Linear(2, 1)
save_checkpoint(Path(sys.argv[1]), model, torch.optim.SGD(model.parameters(), lr=0.1), int(sys.argv[2]))
"""


def _save(
    tmp_path, epoch: int, round_number: int, step: int, job: str = "job42"
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "MINGLE_EPOCH": str(epoch),
        "MINGLE_ROUND": str(round_number),
        "TORCHELASTIC_RUN_ID": job,
    }
    return subprocess.run(
        [sys.executable, "-c", _SAVE, str(tmp_path), str(step)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.timeout(240)
def test_a_round_of_an_older_epoch_stops_instead_of_overwriting(tmp_path):
    assert _save(tmp_path, 2, 5, 10).returncode == 0
    assert json.loads((tmp_path / "ckpt.json").read_text()) == {
        "job": "job42",
        "epoch": 2,
        "round": 5,
        "step": 10,
    }
    stale = _save(tmp_path, 1, 4, 11)  # the other side of a split, under the old leader
    assert stale.returncode == 3, stale
    assert "fenced: the checkpoint was written under epoch 2 round 5" in stale.stdout
    assert json.loads((tmp_path / "ckpt.json").read_text())["step"] == 10  # untouched
    assert _save(tmp_path, 3, 6, 12).returncode == 0  # a newer epoch writes
    assert json.loads((tmp_path / "ckpt.json").read_text()) == {
        "job": "job42",
        "epoch": 3,
        "round": 6,
        "step": 12,
    }
    assert _save(tmp_path, 1, 1, 13, job="job43").returncode == 0  # a new job resuming: its epochs start at 1
