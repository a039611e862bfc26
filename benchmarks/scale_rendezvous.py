"""Rendezvous at scale: many real mingle nodes per process, up to a thousand and more.

A first cut of issue 11's harness. Every node is a real ``MingleRendezvousHandler`` made
through torch's public registry (real multicast on 127.0.0.1, the real leader with its
TCPStores and heartbeats), ``--per-process`` of them in each of several host processes; no
torch workers. The host processes create their nodes, report ready, and are released at
once; the figure is the time from the release until the last node's ``next_rendezvous()``
returned (first round), with the spread of return times.

    python benchmarks/scale_rendezvous.py --nodes 64,128,256     # make bench-scale

Not yet measured here (issue 11): re-rendezvous after a death, leader loss, the leader's CPU,
memory and descriptors, control operations per join, and c10d side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
READY_TIMEOUT_S = 120.0


def host(job: str, port: int, count: int, total: int, join_timeout: float) -> int:
    """One host process: ``count`` nodes of a ``total``-node job; stdin says go, then stop."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.api import rendezvous_handler_registry

    import torch_mingle  # noqa: F401 - registers the backend as the entry point would

    def make(_: int) -> Any:
        params = RendezvousParameters(
            "mingle", "", job, total, total, interface="127.0.0.1", port=str(port),
            join_timeout=str(join_timeout), last_call_timeout="1",
        )  # fmt: skip
        return rendezvous_handler_registry.create_handler(params)

    with ThreadPoolExecutor(max_workers=count) as pool:
        handlers = list(pool.map(make, range(count)))
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 1

        def join(h: Any) -> dict[str, Any]:
            try:
                info = h.next_rendezvous()
                return {"t": time.time(), "rank": info.rank, "leader": h.diagnostics().is_leader}
            except Exception as exc:
                return {"t": time.time(), "error": f"{type(exc).__name__}: {str(exc)[:300]}"}

        results = list(pool.map(join, handlers))
        print(json.dumps({"results": results}), flush=True)
        sys.stdin.readline()  # stop
        list(pool.map(lambda h: h.shutdown(), handlers))
    return 0


def run_point(nodes: int, per_process: int, join_timeout: float) -> dict[str, Any]:
    job, port = f"scale-{uuid.uuid4().hex[:8]}", 30000 + int(uuid.uuid4().int % 20000)
    counts = [per_process] * (nodes // per_process) + ([nodes % per_process] if nodes % per_process else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--host", job, str(port), str(c), str(nodes), str(join_timeout)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for c in counts
    ]
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()  # a host that dies reads "" here, not a hang
            if line != "ready" or time.monotonic() > deadline:
                raise RuntimeError(f"a host process did not get ready: {line!r}")
        released = time.time()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results: list[dict[str, Any]] = []
        for p in procs:
            assert p.stdout is not None
            results += json.loads(p.stdout.readline())["results"]
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("stop\n")
            p.stdin.flush()
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    errors = [r["error"] for r in results if "error" in r]
    returned = sorted(r["t"] - released for r in results if "error" not in r)
    return {
        "nodes": nodes,
        "processes": len(procs),
        "first_round_s": returned[-1] if returned and not errors else None,
        "first_return_s": returned[0] if returned else None,
        "median_return_s": statistics.median(returned) if returned else None,
        "ranks_ok": sorted(r["rank"] for r in results if "rank" in r) == list(range(nodes)),
        "leaders": sum(bool(r.get("leader")) for r in results),
        "errors": errors[:3],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="64,128,256,512,1024")
    p.add_argument("--per-process", type=int, default=64)
    p.add_argument("--join-timeout", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=HERE / "results" / "scale.json")
    p.add_argument("--host", nargs=5, metavar=("JOB", "PORT", "COUNT", "TOTAL", "JOIN_TIMEOUT"))
    args = p.parse_args()
    if args.host:
        job, port, count, total, timeout = args.host
        return host(job, int(port), int(count), int(total), float(timeout))
    points = []
    print(f"{'N':>6} {'procs':>6} {'first round (s)':>16} {'median return (s)':>18} {'ranks':>6}  errors")
    for n in (int(x) for x in args.nodes.split(",")):
        pt = run_point(n, args.per_process, args.join_timeout)
        points.append(pt)
        first = "failed" if pt["first_round_s"] is None else f"{pt['first_round_s']:.2f}"
        med = "-" if pt["median_return_s"] is None else f"{pt['median_return_s']:.2f}"
        ok = "ok" if pt["ranks_ok"] and pt["leaders"] == 1 else "BAD"
        print(f"{n:>6} {pt['processes']:>6} {first:>16} {med:>18} {ok:>6}  {'; '.join(pt['errors']) or '-'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"points": points, "per_process": args.per_process}, indent=1))
    print(f"wrote {args.out}")
    return 0 if all(math.isfinite(pt["first_round_s"] or math.nan) for pt in points) else 1


if __name__ == "__main__":
    sys.exit(main())
