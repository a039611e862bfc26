"""The demo: a real multi-node torchrun job on this machine's loopback, with no address given.

Starts N torchrun agents (N "nodes", each with --nproc_per_node workers) running the same
command, ``--rdzv_backend=mingle`` and nothing else: no --rdzv_endpoint, no MASTER_ADDR.
The agents find each other by multicast on 127.0.0.1, elect a leader, and the workers
train a small DDP model over gloo. Every line is prefixed with the node that printed it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 300.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--nproc-per-node", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()

    torchrun = Path(sys.executable).with_name("torchrun")
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    cmd = [
        str(torchrun),
        f"--nnodes={args.nodes}",
        f"--nproc_per_node={args.nproc_per_node}",
        "--rdzv_backend=mingle",
        f"--rdzv_id={run_id}",
        # The demo's "nodes" share this machine, so discovery is pinned to loopback.
        "--rdzv_conf=interface=127.0.0.1",
        str(HERE / "train_ddp.py"),
        f"--steps={args.steps}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TORCH_MINGLE_LOG": "info"}
    print(
        f"$ {' '.join(cmd[:1] + [c for c in cmd[1:] if not c.endswith('.py')])} train_ddp.py ...", flush=True
    )
    print(
        f"starting {args.nodes} agents (nodes) with the same command; nobody is told an address\n", flush=True
    )
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        for _ in range(args.nodes)
    ]
    pumps = [threading.Thread(target=_pump, args=(i, proc), daemon=True) for i, proc in enumerate(procs)]
    for t in pumps:
        t.start()
    try:
        codes = [proc.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - started))) for proc in procs]
    except subprocess.TimeoutExpired:
        print(f"demo: timed out after {TIMEOUT_S:g}s; stopping the agents", flush=True)
        codes = [1]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for t in pumps:
            t.join(timeout=5)
    took = time.monotonic() - started
    if any(codes):
        print(f"\ndemo FAILED (agent exit codes {codes}) after {took:.1f}s", flush=True)
        return 1
    print(
        f"\ndemo OK: {args.nodes} agents x {args.nproc_per_node} workers trained together in {took:.1f}s",
        flush=True,
    )
    return 0


_PRINT_LOCK = threading.Lock()


def _pump(index: int, proc: subprocess.Popen[str]) -> None:
    for line in proc.stdout or ():
        text = line.rstrip()
        if _interesting(text):
            with _PRINT_LOCK:
                sys.stdout.write(f"[node {index}] {text}\n")
                sys.stdout.flush()


def _interesting(line: str) -> bool:
    """Worker lines and rendezvous results; torchrun's own chatter stays out of the demo's output."""
    keep = ("joined round", "leads job", "Error", "error")
    return line.startswith("rank ") or any(k in line for k in keep)


if __name__ == "__main__":
    sys.exit(main())
