"""The package as a user gets it: build the sdist and the wheel, install the wheel into a new
virtual environment, and run a 2-agent torchrun job from there (README#install).

Then the route for images without a C compiler: netifaces (which multicast-expert requires)
ships no wheels for Python 3.10 and later, so the README installs the binary fork
netifaces-plus, which provides the same ``netifaces`` module, and the rest with ``--no-deps``.
With netifaces missing altogether, the agent's error says what to install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torch_mingle
from tests.helpers import (
    ROOT,
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    random_port,
    start_agent,
    torchrun_cmd,
    unique_job,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# The same pins as the dev install: torch's CPU build from its local file, and these.
CONSTRAINTS = ROOT / "constraints.txt"
NETIFACES_PLUS = "netifaces-plus==0.12.5"
MULTICAST_EXPERT = "multicast-expert==1.6.0"


def _run(cmd: list[str | Path], *, timeout: float, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a command to completion (with a deadline); fail with its output if it fails."""
    try:
        done = subprocess.run(
            [str(c) for c in cmd],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        said = f"{exc.stdout!r}\n{exc.stderr!r}"
        raise AssertionError(f"{cmd} did not finish in {timeout:g}s:\n{said}") from None
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{out[-8000:]}"
    return out


def _train(venv: Path, tmp_path: Path, name: str) -> None:
    """Two agents from the venv's Python, on 127.0.0.1, train together (DDP over gloo)."""
    job = unique_job(name)
    report = tmp_path / f"report-{name}"
    cmd = torchrun_cmd(
        job=job,
        nnodes="2",
        nproc=1,
        conf={"interface": "127.0.0.1", "port": random_port()},
        script_args=["--steps", "3", "--report", str(report)],
        python=str(venv / "bin" / "python"),
    )
    # Run from an empty folder, so that the checkout's torch_mingle cannot shadow the installed one.
    agents = [start_agent(f"{name}{i}", cmd, tmp_path, cwd=tmp_path / "empty") for i in range(2)]
    codes = finish_all(agents)
    assert codes == [0, 0], dump(agents)
    assert_trained_together(final_reports(report), 2, 3, agents)
    assert all("joined round " in a.output() for a in agents), dump(agents)


def _installed(venv: Path, cwd: Path) -> dict[str, str]:
    """Where the venv's torch_mingle and netifaces come from, and which distributions are there."""
    probe = (
        "import importlib.metadata as m, json, netifaces, torch_mingle;"
        "print(json.dumps({'mingle': torch_mingle.__file__, 'netifaces': netifaces.__file__,"
        "'dists': sorted(d.metadata['Name'].lower() for d in m.distributions())}))"
    )
    out = _run([venv / "bin" / "python", "-c", probe], timeout=60, cwd=cwd)
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_the_wheel_installs_into_a_fresh_venv_and_trains(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as on a user's machine
    dist = tmp_path / "dist"
    log = _run([sys.executable, "-m", "build", "--outdir", dist, ROOT], timeout=300, cwd=ROOT, env=env)
    warnings = [line for line in log.splitlines() if "warning" in line.lower()]
    assert warnings == [], "the build warned:\n" + "\n".join(warnings)
    version = torch_mingle.__version__
    wheel = dist / f"torch_mingle-{version}-py3-none-any.whl"
    assert wheel.exists() and (dist / f"torch_mingle-{version}.tar.gz").exists(), sorted(dist.iterdir())

    venv = tmp_path / "venv"
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
    _run([sys.executable, "-m", "venv", venv], timeout=120, cwd=tmp_path)
    _run([*pip, "install", "-c", CONSTRAINTS, wheel], timeout=600, cwd=tmp_path, env=env)
    seen = _installed(venv, tmp_path / "empty")
    assert seen["mingle"].startswith(str(venv)), seen
    out = _run([venv / "bin" / "torch-mingle", "--version"], timeout=60, cwd=tmp_path)
    assert out.strip() == f"torch-mingle {version}"
    show_meta = "import importlib.metadata as m; print(m.metadata('torch-mingle').json)"
    meta = _run([venv / "bin" / "python", "-c", show_meta], timeout=60, cwd=tmp_path / "empty")
    assert "'license_expression': 'BSD-3-Clause'" in meta, meta
    _train(venv, tmp_path, "wheel")

    # netifaces gone (a --no-deps install, a slim image): the agent says what to install.
    _run([*pip, "uninstall", "-y", "netifaces"], timeout=120, cwd=tmp_path)
    job = unique_job("nonetifaces")
    cmd = torchrun_cmd(
        job=job, nnodes="1", nproc=1, conf={"interface": "127.0.0.1"}, python=str(venv / "bin" / "python")
    )
    agent = start_agent("nonetifaces", cmd, tmp_path, cwd=tmp_path / "empty")
    assert finish_all([agent]) != [0]
    assert "pip install netifaces-plus" in agent.output() and "README.md#install" in agent.output(), dump(
        [agent]
    )

    # The route without a compiler (README#install): binary wheels only, so nothing is compiled.
    _run([*pip, "uninstall", "-y", "multicast-expert", "torch-mingle"], timeout=120, cwd=tmp_path)
    binary_only: list[str | Path] = [*pip, "install", "--only-binary=:all:", "-c", CONSTRAINTS]
    _run([*binary_only, NETIFACES_PLUS], timeout=300, cwd=tmp_path, env=env)
    _run([*binary_only, "--no-deps", MULTICAST_EXPERT, wheel], timeout=300, cwd=tmp_path, env=env)
    seen = _installed(venv, tmp_path / "empty")
    assert "netifaces-plus" in seen["dists"] and "netifaces" not in seen["dists"], seen
    _train(venv, tmp_path, "netifacesplus")
