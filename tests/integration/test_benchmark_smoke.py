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
        assert {"section", "backend", "nodes", "samples", "phase", "note"} <= point.keys()
        assert point["samples"] or point["note"], (
            f"{point['section']}/{point['backend']} has neither data nor a note"
        )
        found.setdefault(point["section"], set()).add(point["backend"])
    assert found == SECTIONS
    assert {p["nodes"] for p in report["points"] if p["section"] in ("handler", "e2e")} == {2}
    assert "handler level" in run.stdout and "targets:" in run.stdout


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
