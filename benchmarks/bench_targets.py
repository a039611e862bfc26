"""The benchmark targets of the issues, as data, and the one function that checks them.

A target is a ``Target``: a metric name (a key of the values a benchmark extracts from its
run), the node count it applies to (``None``: every N measured), and one bound:

* ``at_most``: the value is at most this;
* ``flat``: the value at the largest N is at most this factor of the value at the smallest;
* ``at_least``: the value is at least this (ratios against c10d).

A benchmark turns its report into ``{metric: {N: value}}`` and calls ``check``; a target
without a value in this run is listed as "not measured", never as passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch_mingle.config import MingleConfig

#: keep_alive_interval and keep_alive_max_attempt that scale_rendezvous.py runs with: torch's
#: own defaults (c10d's too). A thousand nodes on two cores starve the leader's loop for
#: seconds at a time, which shorter heartbeats take for a dead leader (see docs/benchmarks.md#scale).
SCALE_KEEP_ALIVE = (5.0, 3)


@dataclass(frozen=True)
class Target:
    what: str
    metric: str
    nodes: int | None = None
    at_most: float | None = None
    at_least: float | None = None
    flat: float | None = None
    unit: str = "s"


def scale_targets(keep_alive_s: float) -> tuple[Target, ...]:
    """Issue 11 (scale), checked by ``make bench-scale``; leader loss is bounded by the run's
    heartbeat timeout (``keep_alive_interval x keep_alive_max_attempt``) + 2 s."""
    return (
        Target("first round formed after the last call, N=1,024", "first_s", 1024, at_most=2.0),
        Target("re-rendezvous after a node's death, N=1,024", "rerdzv_s", 1024, at_most=1.0),
        Target(
            f"leader loss to new round, N=1,024 (keep-alive {keep_alive_s:g} s + 2 s)",
            "leader_loss_s",
            1024,
            at_most=keep_alive_s + 2,
        ),
        Target("no stall longer than 1 s (worst phase after the last call)", "stall_s", at_most=1.0),
        Target(
            "control frames per join the same at every N (largest against smallest, 5 % noise)",
            "frames_per_join",
            flat=1.05,
            unit="",
        ),
        Target("leader CPU per join, largest N against smallest", "cpu_per_join_s", flat=2.0),
        Target("faster than c10d (first round)", "c10d_ratio", at_least=10.0, unit="x"),
    )


#: Issue 34 (leader capacity), checked by ``make bench-leader``.
LEADER_TARGETS = (
    Target("first round of 16,384 members, from the last join", "round_s", 16384, at_most=2.0),
    Target(
        "heartbeats of 16,384 members at 1 Hz: the leader's share of a core (from its CPU per beat)",
        "hb_core_share_at_1hz",
        16384,
        at_most=0.25,
        unit="",
    ),
    Target("leader CPU per join, largest N against smallest", "join_cpu_ms", flat=1.2, unit=" ms"),
)


#: ``make bench`` (rendezvous_latency.py): the limits its ``targets()`` checks, by name.
LATENCY = {
    # The faults issue: no worse than before it, at N <= 8.
    "rendezvous_phase_ms": 20.0,
    "rendezvous_phase_vs_c10d": 20.0,
    "rerendezvous_phase_ms": 10.0,
    "rerendezvous_phase_vs_c10d": 10.0,
    "phase_max_nodes": 8,
    # The scale issue: rendezvous as the agent sees it (creating the handler included), N=4.
    "agent_rendezvous_ms": 40.0,
    "agent_rendezvous_vs_c10d": 25.0,
    "agent_rendezvous_nodes": 4,
    # End to end: faster than c10d, within this factor of static.
    "e2e_vs_static": 1.10,
    # Handler level, N <= 16: at least this many times c10d.
    "handler_vs_c10d": 20.0,
    "handler_max_nodes": 16,
    # Leader loss: the default heartbeat timeout (0.2 s x 7) + 2 s.
    "leader_loss_s": round(MingleConfig.keep_alive_interval * MingleConfig.keep_alive_max_attempt + 2, 2),
}


def check(targets: tuple[Target, ...], values: dict[str, dict[int, float]]) -> list[str]:
    lines = []
    for t in targets:
        got = values.get(t.metric, {})
        if not got:
            lines.append(f"---- {t.what}: not measured in this run")
            continue
        if t.flat is not None:
            lo, hi = min(got), max(got)
            if lo == hi:
                lines.append(f"---- {t.what}: needs two sizes, got N={lo} only")
                continue
            ratio = got[hi] / got[lo] if got[lo] else float("inf")
            ok = ratio <= t.flat + 1e-9
            detail = (
                f"N={lo}: {got[lo]:.4g}{t.unit}, N={hi}: {got[hi]:.4g}{t.unit} ({ratio:.2f}x, <= {t.flat:g}x)"
            )
        else:
            sizes = [t.nodes] if t.nodes is not None else sorted(got)
            missing = [n for n in sizes if n not in got]
            if missing:
                lines.append(f"---- {t.what}: N={missing[0]} not measured in this run")
                continue
            bad = [
                n
                for n in sizes
                if (t.at_most is not None and got[n] > t.at_most)
                or (t.at_least is not None and got[n] < t.at_least)
            ]
            ok = not bad
            bound = f"<= {t.at_most:g}{t.unit}" if t.at_most is not None else f">= {t.at_least:g}{t.unit}"
            shown = ", ".join(f"N={n}: {got[n]:.3g}{t.unit}" for n in sizes)
            detail = f"{shown} ({bound})"
        lines.append(f"{'PASS' if ok else 'MISS'} {t.what}: {detail}")
    return lines


def scale_values(report: dict[str, Any]) -> dict[str, dict[int, float]]:
    """The metrics of ``scale_rendezvous.py``'s report, by N."""
    out: dict[str, dict[int, float]] = {}
    mingle = {p["nodes"]: p for p in report["points"] if p["backend"] == "mingle"}
    c10d = {p["nodes"]: p for p in report["points"] if p["backend"] == "c10d"}

    def put(metric: str, n: int, value: float) -> None:
        out.setdefault(metric, {})[n] = value

    for n, p in mingle.items():
        first, rerdzv, loss = (p.get(k) or {} for k in ("first", "rerdzv", "leader_loss"))
        if first.get("ok"):
            put("first_s", n, first["after_last_call_s"])
        if rerdzv.get("ok"):
            put("rerdzv_s", n, rerdzv["after_last_call_s"])
        if loss.get("ok"):
            put("leader_loss_s", n, loss["release_to_last_s"])
        phases = [x["after_last_call_s"] for x in (first, rerdzv) if x.get("ok")]
        if phases:
            put("stall_s", n, max(phases))
        lead = p.get("leader") or {}
        if lead.get("joins"):
            put("frames_per_join", n, control_frames(lead) / lead["joins"])
            put("cpu_per_join_s", n, lead["round_cpu_s"] / n)
        c = (c10d.get(n) or {}).get("first") or {}
        if first.get("ok") and c.get("ok"):
            put("c10d_ratio", n, c["after_last_call_s"] / max(first["after_last_call_s"], 1e-6))
    return out


def control_frames(leader: dict[str, Any]) -> int:
    """Control frames the leader handled, heartbeats left out (they count time, not joins)."""
    return int(
        leader.get("frames_in", 0)
        + leader.get("frames_out", 0)
        - leader.get("beats_in", 0)
        - leader.get("beats_out", 0)
    )
