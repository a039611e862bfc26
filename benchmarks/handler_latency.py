"""Handler-level rendezvous latency: N processes create a handler and call next_rendezvous().

Every process imports torch first, then all are released together by a barrier; each
creates its backend's handler and calls ``next_rendezvous()``. The time reported is from
the release to the moment the last process has returned (wall clock, one machine).

    python benchmarks/handler_latency.py --nodes 2 4 --runs 5 --backends mingle c10d
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

BACKENDS = ("mingle", "c10d")


def _node(backend: str, job: str, n: int, port: int, barrier: Any, out: Any) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    if backend == "mingle":
        params = RendezvousParameters("mingle", "", job, n, n, interface="127.0.0.1", port=str(port))
    else:
        params = RendezvousParameters("c10d", f"127.0.0.1:{port}", job, n, n)
    barrier.wait()
    t0 = time.time()
    handler = get_rendezvous_handler(params)
    info = handler.next_rendezvous()
    t1 = time.time()
    out.put({"rank": info.rank, "world": info.world_size, "t0": t0, "t1": t1})
    barrier.wait()  # nobody closes the rendezvous before everyone is in
    handler.shutdown()


def measure(backend: str, n: int, port: int) -> float:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n)
    out = ctx.Queue()
    job = f"bench-{uuid.uuid4().hex[:8]}"
    procs = [ctx.Process(target=_node, args=(backend, job, n, port, barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in range(n)]
    for p in procs:
        p.join(timeout=60)
    if sorted(r["rank"] for r in results) != list(range(n)):
        raise RuntimeError(f"{backend} N={n}: bad ranks {results}")
    return float(max(r["t1"] for r in results) - min(r["t0"] for r in results))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    rows = []
    port = 31000
    for n in args.nodes:
        for backend in args.backends:
            samples = []
            for _ in range(args.runs):
                port += 1
                samples.append(measure(backend, n, port))
            rows.append({"backend": backend, "nodes": n, "samples_s": samples})
            print(
                f"{backend:>7} N={n:<3} median {statistics.median(samples) * 1e3:8.1f} ms   "
                f"min {min(samples) * 1e3:8.1f} ms   max {max(samples) * 1e3:8.1f} ms",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
