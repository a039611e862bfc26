"""Whether a change kept the swarm's runs the same, seed by seed: the check of a refactoring.

Every seed's run is deterministic (``test_a_seed_replays_exactly_whatever_the_hash_seed``), and
its digest hashes everything the agents did, in order, with the times. A change that is meant
to move code, not behaviour, keeps every digest:

    python -m tests.swarm.same --seeds 300 --write before.json     # on the commit before
    python -m tests.swarm.same --seeds 300 --against before.json   # on the change

Exit status 1, with the first seeds that differ, if any digest changed.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import sys

from tests.swarm.__main__ import _scenario, digest
from tests.swarm.harness import World


def _digest(seed: int) -> tuple[int, str]:
    world = World(_scenario(seed, None))
    world.run()
    return seed, digest(world)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.swarm.same", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=300, help="how many seeds (default 300)")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--write", help="write the digests to this file")
    parser.add_argument("--against", help="compare with the digests in this file")
    args = parser.parse_args(argv)
    logging.getLogger("torch_mingle").setLevel(logging.CRITICAL)
    seeds = range(args.start, args.start + args.seeds)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        found = dict(pool.map(_digest, seeds, chunksize=10))
    if args.write:
        with open(args.write, "w") as f:
            json.dump({str(s): d for s, d in found.items()}, f, indent=0)
    if not args.against:
        print(f"{len(found)} seeds digested")
        return 0
    with open(args.against) as f:
        before = {int(s): d for s, d in json.load(f).items()}
    changed = sorted(s for s in found if s in before and before[s] != found[s])
    compared = sum(1 for s in found if s in before)
    if changed:
        print(f"{len(changed)} of {compared} seeds ran differently: {changed[:20]}", file=sys.stderr)
        return 1
    print(f"all {compared} seeds ran the same")
    return 0


if __name__ == "__main__":
    sys.exit(main())
