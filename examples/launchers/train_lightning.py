"""A small PyTorch Lightning training (``Trainer(strategy="ddp")``) under torchrun:

    torchrun --nnodes=2 --nproc_per_node=1 --rdzv_backend=mingle --rdzv_id=job42 train_lightning.py

Lightning's TorchElasticEnvironment reads what mingle's agent sets (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so ``devices`` and
``num_nodes`` are torchrun's ``--nproc_per_node`` and ``--nnodes``, taken here from the
environment (docs/usage.md#launchers). ``--report DIR`` makes every rank write what it saw.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--report", type=Path, default=None)
    args = p.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.manual_seed(0)
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1234))
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    model = Regression()
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu" if not torch.cuda.is_available() else "gpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=int(os.environ["GROUP_WORLD_SIZE"]),
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data)
    if args.report is not None:
        args.report.mkdir(parents=True, exist_ok=True)
        seen = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "node_rank": trainer.node_rank,
            "params": [q.detach().cpu().flatten().tolist() for q in model.parameters()],
            "master_addr": os.environ["MASTER_ADDR"],
        }
        (args.report / f"rank{trainer.global_rank}.json").write_text(json.dumps(seen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
