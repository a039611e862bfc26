"""How many rank neighbours cross racks under each ``rank_order`` policy (``make bench-order``).

A simulated job of 16 nodes in 4 racks of 4 joins in a random order under a random leader;
the production ordering (``_order.place_of`` on each node, ``_rounds.rank_order`` on the
leader) gives the ranks. NCCL's ring visits ranks 0, 1, ..., n-1 and back to 0, so every pair
of consecutive ranks that sits in two racks is a ring hop through the spine. Two layouts:
host names that follow the racks (``node1``-``node4`` in rack 1, ...) and host names that
do not (racks filled in purchase order). c10d's order (host names sorted as strings) is shown
for comparison. Output: a table on stdout and ``rank_order.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from torch_mingle._frames import Join
from torch_mingle._order import place_of
from torch_mingle._rounds import JoinRequest, rank_order

HERE = Path(__file__).resolve().parent
POLICIES = ("arrival", "host", "env:SLURM_NODEID", "topology")


def crossings(order: list[int], rack: dict[int, int]) -> int:
    """Ring hops between two racks (rank n-1 to rank 0 included)."""
    return sum(rack[order[i]] != rack[order[(i + 1) % len(order)]] for i in range(len(order)))


def ranks_under(
    policy: str, nodes: list[int], names: dict[int, str], rack: dict[int, int], rng: random.Random
) -> list[int]:
    if policy == "c10d":
        return sorted(nodes, key=lambda n: names[n])  # c10d: host names as strings
    arrived = nodes[:]
    rng.shuffle(arrived)
    pending = {}
    for n in arrived:
        env = {"SLURM_NODEID": str(nodes.index(n)), "TORCH_MINGLE_TOPOLOGY": f"dc1/rack{rack[n]}"}
        pending[n] = JoinRequest(node=n, join=Join(0, "198.18.0.1", place=place_of(policy, env, names[n])))
    return list(rank_order(rng.choice(arrived), pending))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--racks", type=int, default=4)
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args()
    rng = random.Random(args.seed)
    per_rack = args.nodes // args.racks
    nodes = list(range(1, args.nodes + 1))  # the scheduler's order: node1, node2, ...
    names = {n: f"node{n}" for n in nodes}
    layouts = {
        "names follow racks": {n: (n - 1) // per_rack + 1 for n in nodes},
        "names do not follow racks": dict(
            zip(
                nodes,
                rng.sample([r for r in range(1, args.racks + 1) for _ in range(per_rack)], args.nodes),
                strict=True,
            )
        ),
    }
    results: dict[str, dict[str, float]] = {}
    print(
        f"{args.nodes} nodes in {args.racks} racks; ring hops that cross racks (of {args.nodes}), "
        f"mean over {args.trials} random arrivals and leaders; the fewest possible is {args.racks}"
    )
    print(f"{'policy':<20}" + "".join(f"{name:>28}" for name in layouts))
    for policy in ("c10d", *POLICIES):
        row = {}
        for layout, rack in layouts.items():
            row[layout] = statistics.fmean(
                crossings(ranks_under(policy, nodes, names, rack, rng), rack) for _ in range(args.trials)
            )
        results[policy] = row
        label = "c10d (string sort)" if policy == "c10d" else policy
        print(f"{label:<20}" + "".join(f"{row[name]:>28.1f}" for name in layouts))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "rank_order.json"
    out.write_text(
        json.dumps(
            {"nodes": args.nodes, "racks": args.racks, "trials": args.trials, "crossings": results}, indent=1
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
