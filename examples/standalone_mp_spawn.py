"""torch_mingle without torchrun: processes started by torch.multiprocessing.spawn find rank 0.

Every process calls ``torch_mingle.rendezvous(job, world_size)``; nobody passes an address or
a rank. Run: ``python examples/standalone_mp_spawn.py --nprocs 3``.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_mingle


def worker(index: int, job: str, nprocs: int, conf: dict[str, Any]) -> None:
    with torch_mingle.rendezvous(job, nprocs, **conf) as rdzv:
        # env:// reads what rendezvous() set: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE.
        dist.init_process_group("gloo")
        total = torch.tensor([float(rdzv.rank)])
        dist.all_reduce(total)
        where = f"{rdzv.master_addr}:{rdzv.master_port}"
        summed = int(total.item())
        print(
            f"process {index}: rank {rdzv.rank}/{rdzv.world_size}, rank 0 at {where}, sum of ranks {summed}"
        )
        dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nprocs", type=int, default=3)
    p.add_argument("--interface", default="127.0.0.1", help="the processes share this machine: loopback")
    p.add_argument("--port", default=None)
    args = p.parse_args()
    conf = {"interface": args.interface, **({"port": args.port} if args.port else {})}
    job = f"spawn-{uuid.uuid4().hex[:8]}"
    mp.spawn(worker, args=(job, args.nprocs, conf), nprocs=args.nprocs)  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    sys.exit(main())
