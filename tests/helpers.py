"""Helpers for tests that start real torchrun agents (on loopback or inside network namespaces)."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from torch_mingle._frames import from_leader_stream, from_node
from torch_mingle._wire import FRAME_HEADER, Decode, Framed, FrameReader, dumps_compact

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_ddp.py"
AGENT_TIMEOUT_S = 150.0


def unique_job(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def random_port() -> int:
    """A discovery port for one test: jobs are told apart by label anyway, this keeps logs apart."""
    return random.randint(30000, 39999)


def write_secret(tmp_path: Path, name: str, text: str) -> str:
    """A secret file (mode 0600, as mingle requires) named ``name`` in ``tmp_path``; its path."""
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


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
    python: str = sys.executable,
) -> list[str]:
    conf_str = ",".join(f"{k}={v}" for k, v in conf.items())
    return [
        python, "-m", "torch.distributed.run",
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
    job: str
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def node_id(self) -> str:
        """The node id this agent's handler took (its log label), "" before it logged one."""
        found = re.search(rf"\[{re.escape(self.job)} ([0-9a-f]{{16}})\] mingle rendezvous:", self.output())
        return found.group(1) if found else ""

    def wait(self, timeout: float = AGENT_TIMEOUT_S, *, company: Sequence[Agent] = ()) -> int:
        """The agent's exit code; on timeout, fail with every node's output (the cause is often elsewhere)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"agent {self.name} did not finish in {timeout:g}s:\n{dump(company or [self])}"
            ) from None

    def tree(self) -> list[int]:
        """The agent's PID and its descendants' (torchrun puts each worker in a session of its own)."""
        return [self.proc.pid, *descendants(self.proc.pid)]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole node: the agent and every process below it, by PID."""
        kill_tree(self.proc.pid, sig, root=self.proc.poll() is None)
        if sig == signal.SIGKILL and self.proc.poll() is None:
            self.proc.wait()


def job_processes(job: str) -> list[int]:
    """Every process of torchrun job ``job`` on this machine: agents (by --rdzv_id) and workers (by env)."""
    marks = (f"--rdzv_id={job}".encode(), f"TORCHELASTIC_RUN_ID={job}".encode())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            blob = Path(f"/proc/{entry}/cmdline").read_bytes() + Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if any(mark + b"\0" in blob + b"\0" for mark in marks):
            found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """PIDs below ``pid`` (children first), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children.get(child, []))
    return out


def kill_tree(pid: int, sig: int = signal.SIGKILL, *, root: bool = True) -> None:
    """Signal ``pid`` (unless ``root`` is False: it was reaped) and every process below it."""
    for victim in [pid, *descendants(pid)] if root else descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, sig)


def start_agent(
    name: str,
    cmd: Sequence[str],
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    netns: str | None = None,
    job: str | None = None,
    cwd: Path = ROOT,
) -> Agent:
    """Start one node; ``job`` is its rdzv_id, read from ``--rdzv_id=`` when not given (a launcher)."""
    log_path = log_dir / f"{name}.log"
    full = ["ip", "netns", "exec", netns, *cmd] if netns else list(cmd)
    out = log_path.open("wb")
    proc = subprocess.Popen(
        full, stdout=out, stderr=subprocess.STDOUT, env=env or agent_env(), cwd=cwd, start_new_session=True
    )
    out.close()
    if job is None:
        job = next(arg.split("=", 1)[1] for arg in cmd if arg.startswith("--rdzv_id="))
    return Agent(name=name, proc=proc, log_path=log_path, job=job)


def finish_all(agents: Sequence[Agent], timeout: float = AGENT_TIMEOUT_S) -> list[int]:
    """Wait for every agent; whatever is left of them afterwards (or on failure) is killed."""
    deadline = time.monotonic() + timeout
    try:
        return [a.wait(max(1.0, deadline - time.monotonic()), company=agents) for a in agents]
    finally:
        for a in agents:
            a.kill()
            for pid in job_processes(a.job):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


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


def assert_trained_together(
    reports: Sequence[dict[str, Any]], world: int, steps: int | None = None, agents: Sequence[Agent] = ()
) -> None:
    """The final round's workers: ranks 0..world-1, one store, all steps done, identical replicas."""
    why = dump(agents) if agents else ""
    assert sorted(r["rank"] for r in reports) == list(range(world)), why
    assert {r["world_size"] for r in reports} == {world}, why
    if steps is not None:
        assert {r["steps"] for r in reports} == {steps}, why
    assert all(r["params"] == reports[0]["params"] for r in reports), "DDP replicas diverged"
    # A link-local address carries each host's own scope (fe80::1%eth0 here, %eth1 there).
    stores = {(r["env"]["MASTER_ADDR"].partition("%")[0], r["env"]["MASTER_PORT"]) for r in reports}
    assert len(stores) == 1, f"the workers of one round were given different stores: {stores}"


def train_on_hosts(
    hosts: Sequence[Any],
    tmp_path: Path,
    conf: dict[str, Any],
    *,
    steps: int,
    prefix: str = "net",
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
    env_of: Any = None,
) -> tuple[list[Agent], list[dict[str, Any]]]:
    """One agent per namespace host trains ``steps`` steps; all exit 0 and trained together.

    ``env_of(host)``: each host's environment of its own, instead of ``env``."""
    cmd = torchrun_cmd(
        job=unique_job(prefix), nnodes=str(len(hosts)), nproc=1, conf={"join_timeout": 120, **conf},
        script_args=["--steps", str(steps), "--report", str(tmp_path / "report")], extra=extra,
    )  # fmt: skip
    agents = [
        start_agent(h.name, cmd, tmp_path, netns=h.name, env=env_of(h) if env_of else env) for h in hosts
    ]
    codes = finish_all(agents)
    assert codes == [0] * len(hosts), dump(agents)
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, len(hosts), steps, agents)
    return agents, reports


def start_training(
    hosts: Sequence[Any],
    tmp_path: Path,
    conf: dict[str, Any],
    *,
    nnodes: str,
    steps: int,
    step_time: float,
    prefix: str,
    trained_step: int = 5,
) -> list[Agent]:
    """One agent per namespace host (``--max-restarts=3``), started and trained to ``trained_step``."""
    cmd = torchrun_cmd(
        job=unique_job(prefix), nnodes=nnodes, nproc=1,
        conf={"interface": "eth0", "join_timeout": 120, "last_call_timeout": 1, **conf},
        extra=["--max-restarts=3"],
        script_args=[
            "--steps", str(steps), "--step-time", str(step_time),
            "--checkpoint", str(tmp_path / "ckpt"), "--report", str(tmp_path / "report"),
        ],
    )  # fmt: skip
    agents = [start_agent(h.name, cmd, tmp_path, netns=h.name) for h in hosts]
    needle = f"step {trained_step}/"
    wait_until(lambda: any(needle in a.output() for a in agents), 120, "round 1 to train", 0.1, agents)
    return agents


def leader_of(agents: Sequence[Agent]) -> Agent:
    """The one agent among ``agents`` that leads the job: the last leader its log names is itself.

    Not "ever logged that it leads": agents that start together may elect two leaders of one
    epoch for a moment, and the weaker steps down (the lower node id wins before the first
    round); that node then names the other as its leader.
    """

    def last_leader(agent: Agent) -> str:
        named = [line for line in agent.output().splitlines() if "] leader: " in line]
        return named[-1] if named else ""

    leaders = [a for a in agents if "] leader: this node" in last_leader(a)]
    assert len(leaders) == 1, f"{len(leaders)} leaders among {[a.name for a in agents]}\n{dump(agents)}"
    return leaders[0]


JOINED = re.compile(r"joined round (\d+) as rank (\d+) of (\d+)")


def joins(agent: Agent) -> list[tuple[int, int, int]]:
    """(round, node rank, world size) of every round ``agent`` joined, in order, from its log.

    Tests wait for "a later round", never for a round number: a contested first election
    (two leaders of epoch 1 for a moment) uses some numbers up, so the job's first round may
    be round 3.
    """
    return [(int(r), int(rank), int(size)) for r, rank, size in JOINED.findall(agent.output())]


def latest_round(agents: Sequence[Agent]) -> int:
    """The highest round any of ``agents`` joined (0: none)."""
    return max((r for a in agents for r, _, _ in joins(a)), default=0)


def joined_after(agent: Agent, round_no: int) -> bool:
    """Whether ``agent`` joined a round numbered above ``round_no``."""
    return any(r > round_no for r, _, _ in joins(agent))


def logged_at(agent: Agent, needle: str, after: float = 0.0) -> float | None:
    """Wall-clock time of the first mingle log line of ``agent`` with ``needle``, logged after ``after``."""
    for line in agent.output().splitlines():
        if needle in line and " mingle " in line:
            try:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if stamp >= after:
                return stamp
    return None


def resume_delay(report_dir: Path, since: float) -> float | None:
    """Seconds from ``since`` (wall clock) to the first training step of a round started after it.

    Read from the record each rank writes at its first step, so a round that trained and was
    later restarted (before it could write its final report) counts too.
    """
    phases = resume_phases(report_dir, since)
    return phases["trained"] if phases is not None else None


def resume_phases(report_dir: Path, since: float) -> dict[str, float] | None:
    """Where the time to train again went, for the first round started after ``since``.

    Seconds from ``since`` to: ``started`` (the first worker has imported torch), ``group``
    (every worker of the round is in its process group: it can train), ``ddp`` (every worker
    has built DistributedDataParallel, whose first use imports torch._dynamo) and ``trained``
    (the first step is done).
    """
    starts = [json.loads(p.read_text()) for p in report_dir.glob("first-*.json")]
    later = [s for s in starts if s["t_start"] > since]
    if not later:
        return None
    first_round = [s for s in later if s["t_start"] < min(s["t_first_step"] for s in later)]
    return {
        "started": min(s["t_start"] for s in first_round) - since,
        "group": max(s["t_group"] for s in first_round) - since,
        "ddp": max(s["t_ddp"] for s in first_round) - since,
        "trained": min(s["t_first_step"] for s in first_round) - since,
    }


def dump(agents: Sequence[Agent]) -> str:
    """Every agent's mingle lines first (the protocol's story, short enough to survive a CI
    log's truncation), then the tail of each agent's whole output (torch's lines included)."""
    story = "\n".join(
        f"--- {a.name} (pid {a.pid}, rc {a.proc.poll()}): mingle lines\n"
        + "\n".join([line[:240] for line in a.output().splitlines() if " mingle " in line][-25:])
        for a in agents
    )
    tails = "\n".join(
        f"===== {a.name} (pid {a.pid}, rc {a.proc.poll()}) =====\n{a.output()[-6000:]}" for a in agents
    )
    return f"{story}\n{tails}"


def wait_until(
    predicate: Any, timeout: float, what: str, interval: float = 0.02, agents: Sequence[Agent] = ()
) -> None:
    """Wait for a condition that has no blocking form (e.g. the agent's num_nodes_waiting() poll)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{dump(agents)}")
        time.sleep(interval)


def rendezvous_all(handlers: Sequence[Any]) -> list[Any]:
    """Call next_rendezvous() on every in-process handler at once; their RendezvousInfos, in order."""
    with ThreadPoolExecutor(max_workers=len(handlers)) as pool:
        return list(pool.map(lambda h: h.next_rendezvous(), handlers))


def rendezvous_as_agents(handlers: Sequence[Any], timeout: float = 60.0) -> list[Any]:
    """As torch's agents do: every handler joins, and one whose round is told it will change
    (``num_nodes_waiting() > 0``: a member joined again) joins again, until all hold one round
    that nobody waits on; their RendezvousInfos, in order. A round can break as it forms (a
    member's connection fails just as the round reaches it), and the agents then re-join."""
    deadline = time.monotonic() + timeout

    def agent(h: Any) -> Any:
        info = h.next_rendezvous()
        while time.monotonic() < deadline:
            rounds = {x.diagnostics().round for x in handlers}
            if len(rounds) == 1 and not any(x.num_nodes_waiting() for x in handlers):
                return info
            if h.num_nodes_waiting() > 0:
                info = h.next_rendezvous()
            time.sleep(0.05)
        raise AssertionError(f"the handlers held no one round within {timeout:g}s")

    with ThreadPoolExecutor(max_workers=len(handlers)) as pool:
        return list(pool.map(agent, handlers))


def rounds_training_at_once(trace: Path) -> str | None:
    """Two rounds whose steps interleave in rank 0's step log, if any: each round (epoch,
    round) trained from its first logged step to its last; a later round may only start after."""
    spans: dict[tuple[int, int], list[float]] = {}
    for line in trace.read_text().splitlines() if trace.exists() else []:
        at, epoch, rnd, _ = line.split()
        span = spans.setdefault((int(epoch), int(rnd)), [float(at), float(at)])
        span[0], span[1] = min(span[0], float(at)), max(span[1], float(at))
    ordered = sorted(spans.items(), key=lambda item: item[1][0])
    for (key_a, (_, end_a)), (key_b, (start_b, _)) in itertools.pairwise(ordered):
        if start_b < end_a:
            return f"round {key_a} stepped until {end_a:.3f}, round {key_b} from {start_b:.3f}"
    return None


# ---------------------------------------------------------------- control frames, as the wire gives them


def _on_the_wire(msg: dict[str, Any] | bytes) -> bytes:
    body = msg if isinstance(msg, bytes) else dumps_compact(msg).encode()
    return FRAME_HEADER.pack(len(body)) + body


Said = dict[str, Any] | bytes | Framed


def _said(msgs: Sequence[Said], decode: Decode) -> list[Framed]:
    out: list[Framed] = []
    for msg in msgs:
        if isinstance(msg, Framed):
            out.append(msg)
            continue
        got = FrameReader(decode).feed(_on_the_wire(msg))
        assert isinstance(got, list) and len(got) == 1, got
        out.extend(got)
    return out


def node_said(msgs: Sequence[Said]) -> list[Framed]:
    """What a leader's term receives when a node sends ``msgs`` (JSON objects, or their text,
    through the wire as they would come; frames read already pass as they are)."""
    return _said(msgs, from_node)


def leader_said(msgs: Sequence[Said]) -> list[Framed]:
    """What a session receives when its leader sends ``msgs`` (as ``node_said``)."""
    return _said(msgs, from_leader_stream)


def dicts_of(data: bytes) -> list[dict[str, Any]]:
    """The frames in ``data`` as the JSON objects they are: what a test looks at of what was sent."""
    got = FrameReader(dict).feed(data)
    assert isinstance(got, list), got
    return [cast("dict[str, Any]", f.frame) for f in got]


def _read(decode: Decode, data: Sequence[bytes]) -> list[Framed]:
    reader, out = FrameReader(decode), []
    for chunk in data:
        got = reader.feed(chunk)
        assert isinstance(got, list), got
        out.extend(got)
    return out


def node_sent(data: Sequence[bytes]) -> list[Framed]:
    """What a leader's term receives of the bytes a node sent (one connection's, in order)."""
    return _read(from_node, data)


def leader_sent(data: Sequence[bytes]) -> list[Framed]:
    """What a session receives of the bytes its leader sent (one connection's, in order)."""
    return _read(from_leader_stream, data)
