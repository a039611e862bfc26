"""The workload torchrun starts in the benchmark: one gloo all_reduce, stamped.

Modes: ``first`` (one all_reduce, then exit); ``fail`` (in the first round rank 1 exits 1
after its first all_reduce while the others keep reducing, so their collective fails too;
every later round does one all_reduce and exits); ``loop`` (all_reduce every 20 ms for
--seconds, stamping each). Stamps go as JSON lines to the file named by ``BENCH_STAMPS``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def stamp(kind: str, **fields: object) -> None:
    record = {"kind": kind, "t": time.time(), "rank": int(os.environ["RANK"]), "pid": os.getpid(), **fields}
    with open(os.environ["BENCH_STAMPS"], "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["first", "fail", "loop"], default="first")
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    failed_marker = os.environ["BENCH_STAMPS"] + ".failed"
    first_round = not os.path.exists(failed_marker)
    dist.init_process_group("gloo")
    x = torch.ones(1)
    dist.all_reduce(x)
    stamp("allreduce", attempt=attempt, world=dist.get_world_size(), master=os.environ["MASTER_ADDR"])
    if args.mode == "fail" and first_round:
        if dist.get_rank() == 1:
            open(failed_marker, "w").close()
            stamp("fail", attempt=attempt)
            os._exit(1)
        end = time.time() + args.seconds
        while time.time() < end:
            dist.all_reduce(x)  # fails (or is stopped by the agent) once rank 1 is gone
    if args.mode == "loop":
        end = time.time() + args.seconds
        go = torch.ones(1)
        while go.item() > 0:
            # The ranks stop together: each says whether its time is up, the minimum decides. A
            # rank that stopped on its own clock would leave another in one more all_reduce,
            # which fails that worker after the job is done and restarts its node alone.
            go.fill_(1.0 if time.time() < end else 0.0)
            dist.all_reduce(go, op=dist.ReduceOp.MIN)
            stamp("allreduce", attempt=attempt, world=dist.get_world_size(), master=os.environ["MASTER_ADDR"])
            time.sleep(0.02)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
