"""The benchmark's quick mode runs and its JSON has every backend and field (numbers are not checked)."""

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
