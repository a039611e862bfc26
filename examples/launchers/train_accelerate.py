"""A small training under Hugging Face accelerate, started on every node with the same command:

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_machines 2 --num_processes 2 \\
        --machine_rank 0 --main_process_port 0 --rdzv_backend mingle \\
        --mixed_precision no --dynamo_backend no train_accelerate.py

(docs/usage.md#launchers; on GPUs leave out ACCELERATE_USE_CPU). accelerate builds a
``--rdzv_endpoint`` from ``--main_process_ip`` even when none is given; mingle ignores it.
``--report DIR`` makes every rank write what it saw (JSON), which the tests read.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--report", type=Path, default=None)
    args = p.parse_args()
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = accelerator.prepare(model, opt)
    rank, world = accelerator.process_index, accelerator.num_processes
    gen = torch.Generator().manual_seed(1234 + rank)  # every rank its own data: DDP must average
    for _ in range(args.steps):
        x = torch.randn(16, 8, generator=gen).to(accelerator.device)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
    accelerator.wait_for_everyone()
    params = [q.detach().cpu().flatten().tolist() for q in model.parameters()]
    accelerator.print(f"accelerate: {world} processes trained {args.steps} steps, loss {loss.item():.5f}")
    if args.report is not None:
        args.report.mkdir(parents=True, exist_ok=True)
        seen = {"rank": rank, "world_size": world, "params": params, "master_addr": os.environ["MASTER_ADDR"]}
        (args.report / f"rank{rank}.json").write_text(json.dumps(seen))
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
