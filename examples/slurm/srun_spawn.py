"""One task per node (``srun``), a process per GPU (``torch.multiprocessing.spawn``), no address.

The node's task calls ``torch_mingle.rendezvous`` once (the job's id and node count come from
Slurm), then spawns its processes; each computes its global rank from its node's rank and
joins the process group through rank 0's store. Run by ``examples/slurm/srun_spawn.sbatch``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_mingle


def worker(local: int, node_rank: int, nproc: int, env: dict[str, str], backend: str) -> None:
    rank, world = node_rank * nproc + local, int(env["WORLD_SIZE"]) * nproc
    os.environ.update(env, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local))
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend)  # env://: rank 0's store, found by the rendezvous
    total = torch.tensor([float(rank)], device="cuda" if backend == "nccl" else "cpu")
    dist.all_reduce(total)
    expected = world * (world - 1) // 2
    print(f"node {node_rank} process {local}: rank {rank}/{world}, sum of ranks {int(total.item())} "
          f"(expected {expected}), rank 0 at {env['MASTER_ADDR']}", flush=True)  # fmt: skip
    dist.destroy_process_group()
    if int(total.item()) != expected:
        sys.exit(1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--backend", default="nccl" if torch.cuda.is_available() else "gloo")
    p.add_argument("--conf", default="", help="extra rendezvous keys, key=value;key=value")
    args = p.parse_args()
    conf: dict[str, Any] = dict(kv.split("=", 1) for kv in args.conf.split(";") if kv)
    nodes = int(os.environ["SLURM_NNODES"])
    # "none": the Slurm job's id, as under torchrun; ranks in Slurm's node order.
    with torch_mingle.rendezvous("none", nodes, set_env=False, rank_order="env:SLURM_NODEID", **conf) as rdzv:
        env = rdzv.env()
        mp.spawn(worker, args=(rdzv.rank, args.nproc_per_node, env, args.backend), nprocs=args.nproc_per_node)  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    sys.exit(main())
