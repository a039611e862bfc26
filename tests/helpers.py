"""Helpers for tests that start real torchrun agents (on loopback or inside network namespaces)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_ddp.py"
AGENT_TIMEOUT_S = 150.0


def unique_job(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def random_port() -> int:
    """A discovery port for one test: jobs are told apart by label anyway, this keeps logs apart."""
    return random.randint(30000, 39999)


def agent_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MASTER_", "GLOO_", "NCCL_", "TORCHELASTIC_"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_MINGLE_LOG="info", LOGLEVEL="INFO")
    env.update(extra)
    return env


def torchrun_cmd(
    *,
    job: str,
    nnodes: str,
    nproc: int,
    conf: dict[str, Any],
    script_args: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> list[str]:
    conf_str = ",".join(f"{k}={v}" for k, v in conf.items())
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
        "--rdzv_backend=mingle", f"--rdzv_id={job}", f"--rdzv_conf={conf_str}",
        "--monitor_interval=0.1", *extra,
        str(TRAIN), *script_args,
    ]  # fmt: skip


@dataclass
class Agent:
    """One torchrun agent (a "node") started by a test, with its output in a file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = AGENT_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"agent {self.name} did not finish in {timeout:g}s:\n{self.output()[-4000:]}"
            ) from None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the agent and its workers (its own process group, created at start)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            if sig == signal.SIGKILL:
                self.proc.wait()

    def kill_agent_only(self) -> None:
        """SIGKILL the agent process alone: its workers lose their parent, like a crashed node."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_agent(
    name: str,
    cmd: Sequence[str],
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    netns: str | None = None,
) -> Agent:
    log_path = log_dir / f"{name}.log"
    full = ["ip", "netns", "exec", netns, *cmd] if netns else list(cmd)
    out = log_path.open("wb")
    proc = subprocess.Popen(
        full, stdout=out, stderr=subprocess.STDOUT, env=env or agent_env(), cwd=ROOT, start_new_session=True
    )
    out.close()
    return Agent(name=name, proc=proc, log_path=log_path)


def finish_all(agents: Sequence[Agent], timeout: float = AGENT_TIMEOUT_S) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [a.wait(max(1.0, deadline - time.monotonic())) for a in agents]
    finally:
        for a in agents:
            a.kill()


def read_reports(report_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(report_dir.glob("rank*.json"))]


def final_reports(report_dir: Path) -> list[dict[str, Any]]:
    """The reports of the last round that finished training (one per rank)."""
    reports = read_reports(report_dir)
    if not reports:
        return []
    last = max(r["t_end"] for r in reports)
    world = next(r["world_size"] for r in reports if r["t_end"] == last)
    latest: dict[int, dict[str, Any]] = {}
    for r in sorted(reports, key=lambda r: r["t_end"]):
        if r["world_size"] == world:
            latest[r["rank"]] = r
    return [latest[k] for k in sorted(latest)]


def dump(agents: Sequence[Agent]) -> str:
    return "\n".join(
        f"===== {a.name} (pid {a.pid}, rc {a.proc.poll()}) =====\n{a.output()[-6000:]}" for a in agents
    )


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.02) -> None:
    """Wait for a condition that has no blocking form (e.g. the agent's num_nodes_waiting() poll)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
