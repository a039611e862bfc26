"""One process of ``test_standalone``'s quiet-close test: meet the other process through
``torch_mingle.rendezvous``, all_reduce over gloo, leave; ``--runs`` times, each under a job id
of its own. The last run leaves its process group to the process exit, as a script that never
calls ``destroy_process_group()`` does. Prints the slowest close.

    python -m tests.standalone_loop JOB PORT RUNS SECRET_FILE CLOSE_TIMEOUT
"""

from __future__ import annotations

import datetime
import sys
import time

import torch
import torch.distributed as dist

import torch_mingle


def main() -> int:
    job, port, runs, secret, close_timeout = sys.argv[1:6]
    slowest = 0.0
    rank = -1
    for i in range(int(runs)):
        with torch_mingle.rendezvous(
            f"{job}-{i}", 2, interface="127.0.0.1", port=port, secret_file=secret, close_timeout=close_timeout
        ) as rdzv:
            rank = rdzv.rank
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
            total = torch.ones(1)
            dist.all_reduce(total)
            if total.item() != 2:
                raise SystemExit(f"run {i}: all_reduce gave {total.item()}")
            if i < int(runs) - 1:
                dist.destroy_process_group()
            leaving = time.monotonic()
        slowest = max(slowest, time.monotonic() - leaving)
    print(f"rank {rank}: {runs} runs, slowest close {slowest:.3f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
