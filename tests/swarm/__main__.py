"""Run the fault swarm: ``python -m tests.swarm --seeds 2000`` or ``--duration 7200``.

Every seed generates a cluster, a workload and a schedule of faults (``scenario.py``) and
runs it on the production ``Node`` in the simulator with every invariant checked
(``harness.py``). A violation prints the seed, shrinks the schedule to the fewest events that
still break the same invariant, and prints the command that replays it. Exit status 1 if any
seed failed.

    python -m tests.swarm --seeds 2000 --jobs 2          # what CI runs
    python -m tests.swarm --duration 7200 --jobs 2       # the long run
    python -m tests.swarm --seed 1234 --only 0,3 -v      # replay a shrunk failure
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import multiprocessing
import os
import queue
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from tests.swarm import scenario as sc
from tests.swarm.harness import INVARIANTS, Outcome, World, run

CHUNK = 25


def _scenario(seed: int, only: tuple[int, ...] | None) -> sc.Scenario:
    scenario = sc.generate(seed)
    return scenario if only is None else scenario.only(only)


def run_seed(seed: int, only: tuple[int, ...] | None = None, **kw: Any) -> Outcome:
    return run(_scenario(seed, only), **kw)


def _summary(outcome: Outcome) -> dict[str, Any]:
    v = outcome.violation
    return {
        "seed": outcome.scenario.seed,
        "violation": None if v is None else {"invariant": v.invariant, "detail": v.detail, "at": v.at},
        "sim_s": outcome.sim_s,
        "node_s": outcome.node_s,
        "faults": dict(outcome.faults),
        "checks": outcome.checks,
        "rounds": outcome.rounds,
        "isolated_overlaps": outcome.isolated_overlaps,
        "recovered_after_s": outcome.recovered_after_s,
    }


def _chunk(seeds: list[int]) -> list[dict[str, Any]]:
    return [_summary(run_seed(seed)) for seed in seeds]


def shrink(seed: int, invariant: str, **kw: Any) -> tuple[tuple[int, ...], Outcome]:
    """The fewest events of ``seed``'s schedule that still break ``invariant`` (greedy, one
    event at a time, until no single removal keeps the failure)."""
    full = sc.generate(seed)
    kept = tuple(range(len(full.events)))
    best = run_seed(seed, kept, **kw)

    def fails(trial: tuple[int, ...]) -> Outcome | None:
        outcome = run_seed(seed, trial, **kw)
        ok = outcome.violation is not None and outcome.violation.invariant == invariant
        return outcome if ok else None

    # What comes after the violation cannot have caused it: one run drops it all (a long seed's
    # hour of churn would otherwise cost an hour-long run per event).
    if best.violation is not None:
        before = tuple(i for i in kept if full.events[i].at <= best.violation.at)
        if before != kept and (outcome := fails(before)) is not None:
            kept, best = before, outcome
    changed = True
    while changed:
        changed = False
        for index in kept:
            trial = tuple(i for i in kept if i != index)
            if (outcome := fails(trial)) is not None:
                kept, best, changed = trial, outcome, True
                break
    return kept, best


def digest(world: World) -> str:
    """A hash of everything the agents did, in order: two runs of one seed must give the same."""
    h = hashlib.sha256()
    for at, host, what in world.trace:
        h.update(f"{at:.9f} {host} {what}\n".encode())
    return h.hexdigest()


def replay_command(seed: int, kept: tuple[int, ...]) -> str:
    return f"python -m tests.swarm --seed {seed} --only {','.join(map(str, kept)) or 'none'} -v"


def _seed_stream(args: argparse.Namespace) -> Iterator[list[int]]:
    start = args.start
    if args.duration:
        while True:
            yield list(range(start, start + CHUNK))
            start += CHUNK
    else:
        for first in range(start, start + args.seeds, CHUNK):
            yield list(range(first, min(first + CHUNK, start + args.seeds)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.swarm", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds (default 200)")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--duration", type=float, default=0.0, help="run seeds for this many seconds instead")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--only", help="with --seed: keep only these events (comma-separated indices)")
    parser.add_argument("--no-shrink", action="store_true", help="report failures without shrinking them")
    parser.add_argument("--stop-at-first", action="store_true", help="stop at the first failing seed")
    parser.add_argument("--json", help="write the summary (and every failure) to this file")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the scenario of a single seed")
    parser.add_argument("--digest", action="store_true", help="with --seed: print a digest of the run")
    args = parser.parse_args(argv)
    # The nodes log every fault they see; the swarm reports what matters itself.
    logging.getLogger("torch_mingle").setLevel(
        logging.DEBUG if args.verbose and args.seed is not None else logging.CRITICAL
    )

    if args.seed is not None:
        only = None
        if args.only is not None:
            only = () if args.only == "none" else tuple(int(i) for i in args.only.split(","))
        world = World(_scenario(args.seed, only))
        outcome = world.run()
        if args.digest:
            print(digest(world))
        if args.verbose:
            print(outcome.scenario.describe())
            for at, host, what in world.trace:
                print(f"  {at:8.3f}s  host {host:2d}  {what}" if host >= 0 else f"  {at:8.3f}s  {what}")
        if outcome.violation is None:
            print(f"seed {args.seed}: no violation ({outcome.sim_s:.1f}s simulated, {outcome.rounds} rounds)")
            return 0
        print(f"seed {args.seed}: VIOLATION {outcome.violation}")
        return 1

    started = time.monotonic()
    totals: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    longest = (0.0, -1)
    chunks = _seed_stream(args)
    ctx = multiprocessing.get_context("fork")
    done: queue.SimpleQueue[list[dict[str, Any]] | BaseException] = queue.SimpleQueue()
    with ctx.Pool(args.jobs) as pool:
        # Whichever chunk ends first makes room for the next: a slow seed holds one worker, not all.
        def submit(chunk: list[int] | None) -> int:
            if chunk is None:
                return 0
            pool.apply_async(_chunk, (chunk,), callback=done.put, error_callback=done.put)
            return 1

        in_flight = sum(submit(next(chunks, None)) for _ in range(2 * args.jobs))
        while in_flight:
            results = done.get()
            in_flight -= 1
            if isinstance(results, BaseException):
                raise results
            over = args.duration and time.monotonic() - started >= args.duration
            if not over and not (args.stop_at_first and failures):
                in_flight += submit(next(chunks, None))
            for r in results:
                totals["seeds"] += 1
                totals["checks"] += r["checks"]
                totals["rounds"] += r["rounds"]
                totals["isolated_overlaps"] += r["isolated_overlaps"]
                totals["sim_ms"] += int(r["sim_s"] * 1000)
                totals["node_ms"] += int(r["node_s"] * 1000)
                faults.update(r["faults"])
                longest = max(longest, (r["sim_s"], r["seed"]))
                if r["violation"] is not None:
                    failures.append(r)
                    v = r["violation"]
                    print(
                        f"seed {r['seed']}: VIOLATION {v['invariant']} at {v['at']:.3f}s: {v['detail']}",
                        flush=True,
                    )
    elapsed = time.monotonic() - started
    summary = {
        "seeds": totals["seeds"],
        "failed": len(failures),
        "wall_s": round(elapsed, 1),
        "jobs": args.jobs,
        "simulated_s": round(totals["sim_ms"] / 1000, 1),
        "simulated_node_hours": round(totals["node_ms"] / 3.6e6, 2),
        "longest_seed": {"seed": longest[1], "simulated_s": round(longest[0], 1)},
        "invariant_checks": totals["checks"],
        "rounds_trained": totals["rounds"],
        "isolated_starts_training_beside_the_job": totals["isolated_overlaps"],
        "faults": dict(sorted(faults.items())),
        "invariants": list(INVARIANTS),
    }
    print(json.dumps(summary, indent=2))
    shrunk = []
    failures.sort(key=lambda f: f["seed"])
    for failure in failures[: 0 if args.no_shrink else 5]:
        seed, invariant = failure["seed"], failure["violation"]["invariant"]
        kept, outcome = shrink(seed, invariant)
        print(f"\nseed {seed} shrunk to {len(kept)} event(s):")
        print(outcome.scenario.describe())
        print(f"  -> {outcome.violation}")
        print(f"  replay: {replay_command(seed, kept)}")
        shrunk.append({"seed": seed, "kept": list(kept), "violation": str(outcome.violation)})
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "failures": failures, "shrunk": shrunk}, f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
