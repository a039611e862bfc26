"""The benchmarks run in quick mode; their JSON has every backend, point and field (not the numbers)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.integration

SECTIONS = {
    "handler": {"mingle", "c10d", "static", "etcd-v2", "mingle-discovery"},
    "e2e": {"mingle", "c10d", "static"},
    "rerdzv": {"mingle", "c10d"},
    "leader": {"mingle", "c10d"},
    "sim": {"mingle"},
}


@pytest.mark.timeout(420)
def test_quick_benchmark_reports_every_backend_and_field(tmp_path):
    script = ROOT / "benchmarks" / "rendezvous_latency.py"
    run = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((tmp_path / "latency.json").read_text())
    assert (tmp_path / "latency.png").stat().st_size > 10_000
    assert {"cpus", "cpu_model", "memory_gib", "python", "torch"} <= report["machine"].keys()
    assert report["quick"] is True
    assert report["targets"], "no target was evaluated"
    found: dict[str, set[str]] = {}
    for point in report["points"]:
        assert {"section", "backend", "nodes", "samples", "phase", "agent", "note"} <= point.keys()
        assert point["samples"] or point["note"], (
            f"{point['section']}/{point['backend']} has neither data nor a note"
        )
        found.setdefault(point["section"], set()).add(point["backend"])
    assert found == SECTIONS
    assert {p["nodes"] for p in report["points"] if p["section"] in ("handler", "e2e")} == {2}
    assert "handler level" in run.stdout and "targets:" in run.stdout
    # Rendezvous as the agent sees it (asking for the handler included), for every e2e backend.
    assert all(p["agent"] for p in report["points"] if p["section"] == "e2e")
    assert "rendezvous as the agent sees it" in run.stdout


@pytest.mark.timeout(180)
def test_flood_benchmark_reports_every_point(tmp_path):
    script = ROOT / "benchmarks" / "flood_latency.py"
    run = subprocess.run(
        [sys.executable, str(script), "--runs", "1", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=160, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((tmp_path / "flood.json").read_text())
    samples = report["samples"]
    assert set(samples) == {"first/quiet", "first/flood", "newcomer/quiet", "newcomer/flood", "cpu"}
    for key in ("first/flood", "newcomer/flood"):
        (sample,) = samples[key]
        assert sample["flood_rate"] > 0 and sample["dropped"] > 0, (key, sample)
    assert samples["newcomer/flood"][0]["replays"] > 0, "the flood replayed nothing"
    assert all(s["us_per_datagram"] > 0 for s in samples["cpu"])
    assert "rendezvous under a flood" in run.stdout and "of one core" in run.stdout


@pytest.mark.timeout(420)
def test_scale_benchmark_at_64_nodes_reports_every_field(tmp_path):
    script = ROOT / "benchmarks" / "scale_rendezvous.py"
    run = subprocess.run(
        [sys.executable, str(script), "--nodes", "64", "--sections", "mingle,c10d", "--c10d-budget", "20",
         "--keep-alive", "1,3", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((tmp_path / "scale.json").read_text())
    assert (tmp_path / "scale.png").stat().st_size > 10_000
    assert {"machine", "per_process", "resolver", "points", "targets", "seconds"} <= report.keys()
    assert {"election_window", "keep_alive", "data_path_timeout"} <= report["settings"].keys()
    assert report["settings"]["keep_alive"] == [1.0, 3]  # 1 s x 3: the leader-loss phase waits 3 s, not 15 s
    assert any("keep-alive 3 s + 2 s" in line for line in report["targets"]), report["targets"]
    points = {(p["backend"], p["nodes"]): p for p in report["points"]}
    assert set(points) == {("mingle", 64), ("c10d", 64)}
    mingle = points[("mingle", 64)]
    for phase in ("first", "rerdzv", "leader_loss"):
        assert mingle[phase]["ok"], mingle[phase]
        assert {"nodes", "after_last_call_s", "release_to_last_s", "median_return_s"} <= mingle[phase].keys()
    assert (
        mingle["first"]["nodes"] == 64
        and mingle["rerdzv"]["nodes"] == 63
        and mingle["leader_loss"]["nodes"] == 62
    )
    lead = mingle["leader"]
    assert {"cpu_s", "round_cpu_s", "peak_rss_mib", "fds", "frames_in", "frames_out", "joins"} <= lead.keys()
    assert lead["joins"] >= 64
    assert {"sent", "received"} <= mingle["datagrams_per_node"].keys()
    assert "first" in points[("c10d", 64)]
    assert any(line.startswith(("PASS", "MISS")) for line in report["targets"])
    assert "targets:" in run.stdout


@pytest.mark.timeout(240)
def test_leader_capacity_benchmark_measures_every_phase_and_checks_the_targets(tmp_path):
    """bench-leader at a size CI can afford: one real leader, 64 members from the generator."""
    script = ROOT / "benchmarks" / "leader_capacity.py"
    run = subprocess.run(
        [sys.executable, str(script), "--members", "32,64", "--hb-seconds", "1", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=220, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((tmp_path / "leader.json").read_text())
    assert (tmp_path / "leader.png").stat().st_size > 10_000
    for r in report["results"]:
        assert not r.get("round_error") and not r.get("rerdzv_error"), r
        assert r["round_s"] > 0 and r["rerdzv_s"] > 0 and r["hb_cpu_us"] > 0, r
        assert r["sessions_lost"] == 0 and r["leader_rank"] == 0, r
    # The targets are stated at 16,384 members: here they say so, and the flatness is checked.
    assert any("N=16384 not measured" in line for line in report["targets"]), report["targets"]
    assert any(line.startswith(("PASS", "MISS")) and "per join" in line for line in report["targets"])
