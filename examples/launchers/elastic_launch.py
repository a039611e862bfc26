"""torch's Python launcher API with the mingle backend: run this on every node.

    python elastic_launch.py --nnodes 2 --run-id job42

``elastic_launch`` is what torchrun runs inside; ``LaunchConfig(rdzv_backend="mingle")``
needs no ``rdzv_endpoint``. Give every node the same ``run_id``: its default is empty, and
then each agent makes up its own id and never meets the others (docs/usage.md#launchers).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.launcher.api import LaunchConfig, elastic_launch


def worker(report: str | None) -> dict[str, object]:
    """One worker: a process group from the agent's environment and an all_reduce."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    seen: dict[str, object] = {
        "rank": rank,
        "world_size": world,
        "sum": total.item(),
        "master_addr": os.environ["MASTER_ADDR"],
    }
    if report is not None:
        Path(report).mkdir(parents=True, exist_ok=True)
        (Path(report) / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()
    return seen


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nnodes", default="2", help="N or MIN:MAX")
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--run-id", required=True)
    p.add_argument("--rdzv-conf", default="", help="mingle's keys, e.g. interface=eth1,join_timeout=60")
    p.add_argument("--report", default=None)
    args = p.parse_args()
    low, _, high = args.nnodes.partition(":")
    conf = dict(item.split("=", 1) for item in args.rdzv_conf.split(",") if item)
    config = LaunchConfig(
        min_nodes=int(low),
        max_nodes=int(high or low),
        nproc_per_node=args.nproc_per_node,
        run_id=args.run_id,
        rdzv_backend="mingle",
        rdzv_configs=conf,
        max_restarts=0,
    )
    results = elastic_launch(config, worker)(args.report)
    for rank, seen in sorted(results.items()):
        print(f"worker {rank}: {seen}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
