"""Reporting shared by the benchmarks: the machine, spreads, and the PNG figures."""

from __future__ import annotations

import os
import platform
import statistics
from pathlib import Path
from typing import Any

from bench_targets import control_frames


def machine() -> dict[str, Any]:
    import torch

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(mem_gib, 1),
        "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
    }  # fmt: skip


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, "
        f"Python {m['python']}, torch {m['torch']}"
    )


def fmt_spread(values: list[float], scale: float = 1e3) -> str:
    """``median [min-max]``, in ms by default."""
    if not values:
        return "-"
    return f"{statistics.median(values) * scale:.0f} [{min(values) * scale:.0f}-{max(values) * scale:.0f}]"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_lines(panels: list[tuple[str, str, dict[str, list[tuple[float, float]]]]], path: Path) -> None:
    """One log-log panel per ``(title, y label, {series: [(x, y), ...]})``; x is the node count."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (title, ylabel, series) in zip(axes[0], panels, strict=True):
        for name, points in series.items():
            xy = sorted(p for p in points if p[1] > 0)
            if xy:
                ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes (N)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if any(series.values()):
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scale(report: dict[str, Any], path: Path) -> None:
    """Time and the leader's cost against N, both backends (``scale_rendezvous.py``)."""
    times: dict[str, list[tuple[float, float]]] = {}
    cost: dict[str, list[tuple[float, float]]] = {}
    for p in report["points"]:
        n = p["nodes"]
        for phase, label, key in (
            ("first", "first round", "after_last_call_s"),
            ("rerdzv", "re-rendezvous after a death", "after_last_call_s"),
            ("leader_loss", "leader loss to new round", "release_to_last_s"),
        ):
            got = p.get(phase) or {}
            if got.get("ok"):
                times.setdefault(f"{p['backend']}: {label}", []).append((n, got[key]))
        lead = p.get("leader") or {}
        if p["backend"] == "mingle" and lead:
            cost.setdefault("leader CPU s (first round)", []).append((n, lead.get("round_cpu_s", 0)))
            cost.setdefault("leader peak MiB", []).append((n, lead.get("peak_rss_mib", 0)))
            cost.setdefault("leader open descriptors", []).append((n, lead.get("fds", 0)))
            frames = control_frames(lead)
            cost.setdefault("control frames per join", []).append((n, frames / max(1, lead.get("joins", 0))))
    plot_lines([("rendezvous time", "seconds", times), ("mingle leader's cost", "per unit", cost)], path)
