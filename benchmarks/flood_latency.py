"""Rendezvous latency under a flood of hostile datagrams, against the same rendezvous in quiet.

Every run uses a fresh job and port on 127.0.0.1, with three handlers in this process (real
multicast sockets, real TCPStores) and, for the flooded runs, ``tests/flood.py`` in a process
of its own sending at ``--rate`` datagrams per second to the job's group and port:

* ``first``     three nodes rendezvous (no secret); the flood is garbage only: random bytes,
  the magic followed by noise, truncated datagrams.
* ``newcomer``  three nodes with a shared secret form a round, then a fourth arrives and the
  job re-forms with it (time from the newcomer's start until all four have returned); the
  flood adds forged datagrams of the job (unsigned, wrongly signed, forged leaders) and
  replays of the genuine datagrams it recorded while the first round formed.
* ``cpu``       one node alone (with the secret) under the full flood for 3 s: the CPU time
  its process spends, per datagram and as a share of one core.

All nodes of a run share this process, so it decodes the flood once per node (3 or 4 times
``--rate``) on the same cores as the flood: a pessimistic setup, where a real node decodes it
once. Quiet and flooded runs take turns. Output: a table on stdout and ``flood.json`` in ``--out``.

    python benchmarks/flood_latency.py       # make bench-flood
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the flood and the port helper are shared with the tests

from bench_pool import compile_package  # noqa: E402
from bench_report import fmt_spread  # noqa: E402

from tests.flood import Flood  # noqa: E402
from tests.helpers import random_port, rendezvous_all, unique_job, wait_until  # noqa: E402

GROUP = "239.255.77.77"


def _handler(job: str, port: int, min_nodes: int, max_nodes: int, **conf: str) -> Any:
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from torch_mingle.handler import MingleRendezvousHandler

    params = RendezvousParameters(
        "mingle", "", job, min_nodes, max_nodes, interface="127.0.0.1", port=str(port), **conf
    )
    return MingleRendezvousHandler.from_params(params)


def _shutdown(handlers: list[Any]) -> None:
    threads = [threading.Thread(target=h.shutdown) for h in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)


def _dropped(handlers: list[Any]) -> int:
    return sum(h.diagnostics().stats.dropped_total() for h in handlers)


def run_first(flooded: bool, rate: int) -> dict[str, Any]:
    job, port = unique_job("bench-flood"), random_port()
    flood = Flood(GROUP, port, job, seconds=2, rate=rate, garbage_only=True) if flooded else None
    handlers = [_handler(job, port, 3, 3) for _ in range(3)]
    try:
        started = time.monotonic()
        rendezvous_all(handlers)
        took = time.monotonic() - started
        dropped = _dropped(handlers)
    finally:
        _shutdown(handlers)
    report = flood.result() if flood else {}
    return {"seconds": took, "flood_rate": report.get("rate", 0.0), "dropped": dropped}


def run_newcomer(flooded: bool, rate: int, secret_file: str) -> dict[str, Any]:
    job, port = unique_job("bench-flood"), random_port()
    conf = {"secret_file": secret_file, "last_call_timeout": "0.3"}
    first = [_handler(job, port, 3, 4, **conf) for _ in range(3)]
    # The flood records the first round's genuine datagrams, to replay them at the newcomer.
    flood = Flood(GROUP, port, job, seconds=3, rate=rate, capture=0.5) if flooded else None
    handlers = list(first)
    try:
        rendezvous_all(first)
        started = time.monotonic()
        newcomer = _handler(job, port, 3, 4, **conf)
        handlers.append(newcomer)
        done: list[Any] = []
        joiner = threading.Thread(target=lambda: done.append(newcomer.next_rendezvous()))
        joiner.start()
        wait_until(lambda: all(h.num_nodes_waiting() == 1 for h in first), 30, "the newcomer", interval=0.001)
        rendezvous_all(first)
        joiner.join(timeout=60)
        took = time.monotonic() - started
        if not done:
            raise RuntimeError("the newcomer never got a round")
        dropped = _dropped(handlers)
    finally:
        _shutdown(handlers)
    report = flood.result() if flood else {}
    return {
        "seconds": took,
        "flood_rate": report.get("rate", 0.0),
        "replays": report.get("replays", 0),
        "dropped": dropped,
    }


def run_cpu(rate: int, secret_file: str) -> dict[str, Any]:
    job, port = unique_job("bench-flood"), random_port()
    node = _handler(job, port, 2, 2, secret_file=secret_file)
    try:
        before, started = _cpu_s(), time.monotonic()
        report = Flood(GROUP, port, job, seconds=3, rate=rate).result()
        cpu, took = _cpu_s() - before, time.monotonic() - started
        received = node.diagnostics().stats.received
    finally:
        _shutdown([node])
    return {
        "core_share": cpu / took,
        "us_per_datagram": cpu / max(received, 1) * 1e6,
        "flood_rate": report["rate"],
    }


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=7, help="runs per point (quiet and flooded take turns)")
    p.add_argument("--rate", type=int, default=25_000, help="datagrams per second from the flood process")
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args()
    compile_package()
    args.out.mkdir(parents=True, exist_ok=True)
    # The flood's drops and forged leaders are logged as warnings by design; the table is the point here.
    logging.getLogger("torch_mingle").setLevel(logging.ERROR)
    samples: dict[str, list[dict[str, Any]]] = {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        secret_file = Path(tmp) / "secret"
        secret_file.write_text(secrets.token_hex(32) + "\n")  # a fresh one per run
        secret_file.chmod(0o600)
        for i in range(args.runs):
            for flooded in (False, True):
                tag = "flood" if flooded else "quiet"
                samples.setdefault(f"first/{tag}", []).append(run_first(flooded, args.rate))
                samples.setdefault(f"newcomer/{tag}", []).append(
                    run_newcomer(flooded, args.rate, str(secret_file))
                )
            print(f"run {i + 1}/{args.runs} done", file=sys.stderr, flush=True)
        samples["cpu"] = [run_cpu(args.rate, str(secret_file)) for _ in range(3)]
    print("\nrendezvous under a flood (ms); median [min-max]")
    print(f"{'':44}{'quiet':>16}{'flooded':>16}{'flood rate/s':>14}{'dropped/run':>13}")
    rows = {
        "first": "3 nodes, no secret, garbage flood",
        "newcomer": "3 -> 4 nodes, secret, forgeries + replays",
    }
    for key, title in rows.items():
        quiet = [s["seconds"] for s in samples[f"{key}/quiet"]]
        flood = samples[f"{key}/flood"]
        rate = statistics.median(s["flood_rate"] for s in flood)
        dropped = statistics.median(s["dropped"] for s in flood)
        spread = fmt_spread([s["seconds"] for s in flood])
        print(f"{title:44}{fmt_spread(quiet):>16}{spread:>16}{rate:>14.0f}{dropped:>13.0f}")
    cpu = samples["cpu"]
    share = statistics.median(s["core_share"] for s in cpu) * 100
    per = statistics.median(s["us_per_datagram"] for s in cpu)
    rate = statistics.median(s["flood_rate"] for s in cpu)
    print(
        f"\none node under a {rate:.0f}/s flood (secret set): {share:.0f}% of one core, "
        f"{per:.1f} us per datagram"
    )
    out = args.out / "flood.json"
    out.write_text(json.dumps({"rate": args.rate, "runs": args.runs, "samples": samples}, indent=1) + "\n")
    print(f"\n{time.monotonic() - began:.0f}s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
