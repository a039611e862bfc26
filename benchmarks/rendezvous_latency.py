"""Rendezvous latency of mingle against torch's own backends, on this machine.

Sections (``--sections``, all by default):

* ``handler``  N processes create the backend's handler and call ``next_rendezvous()``,
  released together: time from the release until every node has returned. The processes
  import torch once and stay up between runs, so only the rendezvous is timed. Also
  ``mingle-discovery``: discovery and election alone (time until every node knows the leader).
* ``e2e``      N torchrun agents launched together: time until every worker finished its
  first gloo all_reduce; and the rendezvous phase inside it, stamped around each agent's
  ``next_rendezvous()``: last agent in -> last agent out.
* ``rerdzv``   a worker exits non-zero (``--max-restarts=1``): time from the failure to
  every worker's next all_reduce, and the re-rendezvous phase (last in -> last out).
* ``leader``   SIGKILL of the leader's agent (and its workers) mid-training: time to the
  survivors' next all_reduce. c10d is tried once the same way (its store host is killed).
* ``sim``      the election core alone, simulated (fake clock, in-memory network), 10 to
  2,000 nodes starting at once: simulated time to one leader, datagrams sent per node.

Output: a table on stdout, ``latency.json`` (every sample) and ``latency.png`` in ``--out``.

    python benchmarks/rendezvous_latency.py            # the full run (make bench)
    python benchmarks/rendezvous_latency.py --quick    # N=2 only, one run per point
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the process-tree helpers are shared with the tests

from bench_pool import compile_package  # noqa: E402
from bench_report import fmt_spread, machine, machine_line  # noqa: E402
from bench_targets import LATENCY  # noqa: E402

from tests.helpers import kill_tree  # noqa: E402

WRAPPER = HERE / "stamped_torchrun.py"
WORKLOAD = HERE / "bench_worker.py"
HANDLER_BACKENDS = ("mingle", "c10d", "static", "etcd-v2")
E2E_BACKENDS = ("mingle", "c10d", "static")
RELEASE_DELAY_S = 0.3
RUN_TIMEOUT_S = 120.0
RERDZV_TIMEOUT_S = 40.0
#: ``--quick`` (a smoke test of every section): mingle trains again within 3 s at N=2, c10d
#: usually never does, and waiting 40 s for it only makes CI slower.
QUICK_RERDZV_TIMEOUT_S = 10.0


@dataclass
class Point:
    section: str
    backend: str
    nodes: int
    samples: list[float] = field(default_factory=list)
    phase: list[float] = field(default_factory=list)  # rendezvous phase (last in -> last out)
    agent: list[float] = field(default_factory=list)  # the same from asking for the handler
    note: str = ""

    def median(self, which: str = "samples") -> float | None:
        values = getattr(self, which)
        return statistics.median(values) if values else None


def _port() -> int:
    """A TCP port that is free now (c10d and static listen on it; mingle uses it for UDP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _etcd_available() -> str | None:
    return None if shutil.which("etcd") else "skipped: no etcd server binary on this machine"


# ------------------------------------------------------------------------ handler level


def _pool_process(conn: Connection) -> None:
    """A long-lived node for handler-level runs: torch is imported once, then it obeys commands."""
    import logging

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    handler: Any = None
    driver: Any = None
    while True:
        cmd, args = conn.recv()
        if cmd == "exit":
            return
        if cmd == "done":
            if handler is not None:
                handler.shutdown()
            if driver is not None:
                driver.shutdown()
            handler = driver = None
            conn.send("ok")
            continue
        backend, job, n, rank, port, release_at = args
        while time.time() < release_at:
            pass  # spin: all nodes start within microseconds of each other
        t0 = time.time()
        try:
            if cmd == "discover":
                driver, leader = _discover_only(job, port)
                conn.send({"t0": t0, "t1": time.time(), "leader": leader})
                continue
            if backend == "mingle":
                params = RendezvousParameters("mingle", "", job, n, n, interface="127.0.0.1", port=str(port))
            elif backend == "c10d":
                params = RendezvousParameters("c10d", f"127.0.0.1:{port}", job, n, n)
            else:
                params = RendezvousParameters("static", f"127.0.0.1:{port}", job, n, n, rank=rank)
            handler = get_rendezvous_handler(params)
            info = handler.next_rendezvous()
            conn.send({"t0": t0, "t1": time.time(), "rank": info.rank})
        except Exception as exc:  # reported to the coordinator, which notes it
            conn.send({"error": f"{type(exc).__name__}: {str(exc)[:300]}"})


def _discover_only(job: str, port: int) -> tuple[Any, int]:
    """mingle's discovery and election alone: create the handler, wait until it knows the leader."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    handler: Any = get_rendezvous_handler(
        RendezvousParameters("mingle", "", job, 2, 2, interface="127.0.0.1", port=str(port))
    )
    found = handler.wait_diagnostics(lambda d: d.leader is not None, 30)
    if found is None:
        raise RuntimeError("no leader within 30 s")
    return handler, int(found.leader, 16)


class Pool:
    """Processes that stay up across runs, so a handler-level run times the rendezvous only."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        for _ in range(size):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_pool_process, args=(theirs,), daemon=True)
            proc.start()
            self.conns.append(ours)
            self.procs.append(proc)

    def run(self, cmd: str, backend: str, n: int) -> tuple[float, list[dict[str, Any]]]:
        job, port = f"bench-{uuid.uuid4().hex[:8]}", _port()
        release = time.time() + RELEASE_DELAY_S
        for rank in range(n):
            self.conns[rank].send((cmd, (backend, job, n, rank, port, release)))
        results = []
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for rank in range(n):
            if not self.conns[rank].poll(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"{backend} N={n}: node {rank} did not finish in {RUN_TIMEOUT_S:g}s")
            results.append(self.conns[rank].recv())
        errors = [r["error"] for r in results if "error" in r]
        for rank in range(n):
            self.conns[rank].send(("done", None))
        for rank in range(n):
            self.conns[rank].recv()
        if errors:
            raise RuntimeError(f"{backend} N={n}: {errors[0]}")
        return max(r["t1"] for r in results) - release, results

    def close(self) -> None:
        for conn in self.conns:
            conn.send(("exit", None))
        for proc in self.procs:
            proc.join(timeout=30)


def bench_handler(nodes: list[int], runs: int, tick: Any) -> list[Point]:
    points = []
    pool = Pool(max(nodes))
    try:
        # One untimed run per backend on every process: imports and first-use set-up are not rendezvous.
        for backend in ("mingle", "c10d", "static"):
            with contextlib.suppress(RuntimeError):
                pool.run("run", backend, max(nodes))
        for n in nodes:
            for backend in (*HANDLER_BACKENDS, "mingle-discovery"):
                point = Point("handler", backend, n)
                points.append(point)
                if backend == "etcd-v2":
                    point.note = _etcd_available() or ""
                    if point.note:
                        tick()
                        continue
                for _ in range(runs):
                    cmd = "discover" if backend == "mingle-discovery" else "run"
                    try:
                        took, results = pool.run(cmd, backend.split("-")[0], n)
                    except RuntimeError as exc:
                        point.note = f"a run failed: {exc}"
                        continue
                    if cmd == "run" and sorted(r["rank"] for r in results) != list(range(n)):
                        raise RuntimeError(f"{backend} N={n}: ranks {[r['rank'] for r in results]}")
                    if cmd == "discover" and len({r["leader"] for r in results}) != 1:
                        point.note = "a run ended with two leaders before the election settled"
                    point.samples.append(took)
                tick()
    finally:
        pool.close()
    return points


# --------------------------------------------------------------------------- torchrun


def _agent_cmd(
    backend: str, job: str, n: int, i: int, port: int, mode: str, extra: list[str], nnodes: str
) -> list[str]:
    if backend == "mingle":
        rdzv = ["--rdzv_backend=mingle", f"--rdzv_id={job}", f"--rdzv_conf=interface=127.0.0.1,port={port}"]
    elif backend == "c10d":
        rdzv = ["--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={job}"]
    else:
        rdzv = [
            "--rdzv_backend=static",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            f"--node_rank={i}",
        ]
    return [
        sys.executable, str(WRAPPER), f"--nnodes={nnodes}", "--nproc_per_node=1", "--monitor_interval=0.1",
        *rdzv, *extra, str(WORKLOAD), f"--mode={mode}",
    ]  # fmt: skip


@dataclass
class Launch:
    procs: list[subprocess.Popen[bytes]]
    port: int
    stamps: Path
    t_launch: float
    logs: list[Path]

    def records(self) -> list[dict[str, Any]]:
        if not self.stamps.exists():
            return []
        return [json.loads(line) for line in self.stamps.read_text().splitlines() if line.strip()]

    def training(self) -> bool:
        """Every worker has all-reduced a few times (at least 3 per node on average)."""
        return bool(sum(r["kind"] == "allreduce" for r in self.records()) >= 3 * len(self.procs))

    def allreduces_after(self, t: float, world: int) -> list[dict[str, Any]]:
        """All-reduces after wall time ``t`` in rounds of ``world`` workers."""
        return [r for r in self.records() if r["kind"] == "allreduce" and r["t"] > t and r["world"] == world]

    def tails(self, lines: int = 40) -> str:
        """The last lines of every agent's log (the folder is gone once the run fails)."""
        return "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            for log in self.logs
            if log.exists()
        )

    def wait(self, timeout: float, procs: list[subprocess.Popen[bytes]] | None = None) -> list[int | None]:
        """Exit codes of ``procs`` (default: every agent); None for one still running at the deadline."""
        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for proc in self.procs if procs is None else procs:
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()


def _listener_pid(port: int) -> int | None:
    """The PID of the process listening on TCP ``port`` (from /proc/net/tcp{,6} and fd links)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(cols[9])
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            links = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        if any(link.startswith("socket:[") and link[8:-1] in inodes for link in links):
            return int(entry)
    return None


def _launch(
    backend: str, n: int, workdir: Path, *, mode: str, extra: tuple[str, ...] = (), elastic: bool = False
) -> Launch:
    """Start ``n`` agents; ``elastic`` lets the job go on with n-1 nodes (``--nnodes=n-1:n``)."""
    job, port = f"bench-{uuid.uuid4().hex[:8]}", _port()
    stamps = workdir / f"{job}.jsonl"
    env = {
        **os.environ,
        "BENCH_STAMPS": str(stamps),
        "OMP_NUM_THREADS": "1",
        "LOGLEVEL": "INFO",
        "TORCH_MINGLE_LOG": os.environ.get("TORCH_MINGLE_LOG", "info"),
    }
    logs = [workdir / f"{job}-{i}.log" for i in range(n)]
    t_launch = time.time()
    procs = []
    for i in range(n):
        with logs[i].open("wb") as out:
            procs.append(
                subprocess.Popen(
                    _agent_cmd(
                        backend, job, n, i, port, mode, list(extra), f"{n - 1}:{n}" if elastic else str(n)
                    ),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )
    return Launch(procs=procs, port=port, stamps=stamps, t_launch=t_launch, logs=logs)


def _phase(rdzv: list[dict[str, Any]], start: str = "t_in") -> float:
    """Rendezvous phase: from the last agent entering next_rendezvous() to the last leaving it.

    With ``start="t_ask"``, rendezvous as the agent sees it: from the last agent asking torch's
    registry for the handler (creating it included) to the last leaving next_rendezvous().
    """
    return float(max(r["t_out"] for r in rdzv) - max(r[start] for r in rdzv))


def bench_e2e(nodes: list[int], runs: int, small_runs: int, workdir: Path, tick: Any) -> list[Point]:
    """Backends take turns run by run, so a slow spell of the machine hits them all alike.

    Jobs of up to 4 nodes get ``small_runs``: they are quick and noisy (process start-up dominates).
    """
    points: list[Point] = []
    for n in nodes:
        row = {backend: Point("e2e", backend, n) for backend in E2E_BACKENDS}
        points.extend(row.values())
        for _ in range(small_runs if n <= 4 else runs):
            for backend, point in row.items():
                launch = _launch(backend, n, workdir, mode="first")
                try:
                    codes = launch.wait(RUN_TIMEOUT_S)
                finally:
                    launch.cleanup()
                recs = launch.records()
                reduces = [r for r in recs if r["kind"] == "allreduce"]
                rdzv = [r for r in recs if r["kind"] == "rdzv"]
                if codes != [0] * n or len(reduces) != n:
                    raise RuntimeError(f"e2e {backend} N={n} failed: {codes}; see {launch.logs[0]}")
                point.samples.append(max(r["t"] for r in reduces) - launch.t_launch)
                if len(rdzv) == n:
                    point.phase.append(_phase(rdzv))
                    point.agent.append(_phase(rdzv, "t_ask"))
        tick(len(row))
    return points


def bench_rerdzv(
    n: int, runs: int, workdir: Path, tick: Any, timeout_s: float = RERDZV_TIMEOUT_S
) -> list[Point]:
    """A worker fails once; from the failure to every rank's all-reduce in the new round.

    ``timeout_s``: how long a run may take to train again (c10d's often never does).
    """
    points = []
    for backend in ("mingle", "c10d"):
        point = Point("rerdzv", backend, n)
        points.append(point)
        for _ in range(runs):
            launch = _launch(backend, n, workdir, mode="fail", extra=("--max-restarts=1",))

            def resumed(launch: Launch = launch) -> bool:
                recs = launch.records()
                fails = [r["t"] for r in recs if r["kind"] == "fail"]
                return (
                    bool(fails)
                    and len({r["rank"] for r in recs if r["kind"] == "allreduce" and r["t"] > fails[0]}) == n
                )

            try:
                done = _wait_for(resumed, timeout_s)
            finally:
                launch.cleanup()
            recs = launch.records()
            fails = [r["t"] for r in recs if r["kind"] == "fail"]
            if not fails:
                raise RuntimeError(f"rerdzv {backend}: the failure was not injected; see {launch.logs[0]}")
            first_after: dict[int, dict[str, Any]] = {}
            for r in sorted(
                (r for r in recs if r["kind"] == "rdzv" and r["t_in"] > fails[0]), key=lambda r: r["t_in"]
            ):
                first_after.setdefault(r["pid"], r)
            if len(first_after) == n:
                point.phase.append(_phase(list(first_after.values())))
            if done:
                after = [r["t"] for r in recs if r["kind"] == "allreduce" and r["t"] > fails[0]]
                point.samples.append(max(after) - fails[0])
            else:
                point.note = (
                    f"workers never all-reduced again within {timeout_s:g}s in some runs: "
                    "the new round's workers read the last round's keys from the shared store"
                )
        tick()
    return points


def _wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def bench_leader(runs: int, workdir: Path, tick: Any) -> list[Point]:
    n = 3
    point = Point("leader", "mingle", n)
    for _ in range(runs):
        launch = _launch("mingle", n, workdir, mode="loop", extra=("--max-restarts=3",), elastic=True)
        try:
            if not _wait_for(launch.training, 60):
                raise RuntimeError(f"leader-loss run did not start training; see {launch.logs[0]}")
            (leader_pid,) = [r["pid"] for r in launch.records() if r["kind"] == "rdzv" and r["rank"] == 0]
            killed = time.time()
            kill_tree(leader_pid)
            survivors = [p for p in launch.procs if p.pid != leader_pid]
            codes = launch.wait(RUN_TIMEOUT_S, survivors)
        finally:
            launch.cleanup()
        after = launch.allreduces_after(killed, n - 1)
        if codes != [0] * (n - 1) or not after:
            raise RuntimeError(f"leader-loss run failed (exit codes {codes}):\n{launch.tails()}")
        first: dict[int, float] = {}
        for r in sorted(after, key=lambda r: r["t"]):
            first.setdefault(r["rank"], r["t"])
        point.samples.append(max(first.values()) - killed)
    tick()
    c10d = Point("leader", "c10d", n, note=_c10d_leader_loss(workdir))
    tick()
    return [point, c10d]


def _c10d_leader_loss(workdir: Path) -> str:
    """Kill the agent that hosts c10d's store, once, and report what the others did."""
    launch = _launch("c10d", 3, workdir, mode="loop", extra=("--max-restarts=3",), elastic=True)
    try:
        if not _wait_for(launch.training, 60):
            return "could not start the c10d job"
        owner = _listener_pid(launch.port)
        host = [p for p in launch.procs if p.pid == owner]
        if len(host) != 1:
            return "could not tell which c10d agent hosts the store"
        killed = time.time()
        kill_tree(host[0].pid)
        others = [p for p in launch.procs if p is not host[0]]
        codes = [p.wait(timeout=90) for p in others]
    except subprocess.TimeoutExpired:
        return "job fails: the surviving agents hung (killed after 90 s)"
    finally:
        launch.cleanup()
    if launch.allreduces_after(killed, 2) and codes == [0, 0]:
        return "recovered (unexpected)"
    return f"job fails: the surviving agents exited with {codes} {time.time() - killed:.1f}s after the kill"


# ----------------------------------------------------------------------------- simulation


def bench_sim(sizes: list[int], runs: int, tick: Any) -> list[Point]:
    from torch_mingle.testing.sim import Simulation

    points = []
    for n in sizes:
        point = Point("sim", "mingle", n)
        per_node = []
        for seed in range(runs):
            sim = Simulation(n, seed=seed)
            converged = sim.run_until_converged(deadline=30.0)
            if converged is None:
                raise RuntimeError(f"simulation of {n} nodes did not converge")
            point.samples.append(converged)
            per_node.append(sim.datagrams_per_node())
        point.note = f"datagrams sent per node: {statistics.median(per_node):.2f}"
        point.phase = per_node
        points.append(point)
        tick()
    return points


# --------------------------------------------------------------------------- reporting


def _ratio(base: Point | None, point: Point, which: str = "samples") -> str:
    if base is None or point is base or not getattr(point, which) or not getattr(base, which):
        return ""
    ours, theirs = point.median(which), base.median(which)
    if not ours or not theirs:
        return ""
    return f" {theirs / ours:.1f}x"


def table(points: list[Point]) -> str:
    out = []

    def find(section: str, backend: str, n: int) -> Point | None:
        return next((p for p in points if (p.section, p.backend, p.nodes) == (section, backend, n)), None)

    sections = [
        ("handler", "samples", "handler level: create handler + next_rendezvous(), released together (ms)"),
        ("e2e", "samples", "end to end: launch N torchrun agents -> every worker's first all_reduce (ms)"),
        ("e2e", "phase", "rendezvous phase in torchrun: last agent in -> last agent out (ms)"),
        (
            "e2e",
            "agent",
            "rendezvous as the agent sees it: last agent asks for the handler -> last agent out (ms)",
        ),
        ("rerdzv", "samples", "re-rendezvous: worker failure -> every worker's next all_reduce (ms)"),
        ("rerdzv", "phase", "re-rendezvous phase: last agent in -> last agent out (ms)"),
        (
            "leader",
            "samples",
            "leader loss: SIGKILL of the leader's agent -> survivors' next all_reduce (ms)",
        ),
    ]
    for section, which, title in sections:
        rows = [p for p in points if p.section == section]
        if not rows:
            continue
        backends = list(dict.fromkeys(p.backend for p in rows))
        out.append(f"\n{title}; median [min-max], and c10d's median / this one's")
        out.append("  N  " + "".join(f"{b:>28}" for b in backends))
        for n in sorted({p.nodes for p in rows}):
            cells = []
            for b in backends:
                p = find(section, b, n)
                if p is None:
                    cells.append(f"{'':>28}")
                elif not getattr(p, which):
                    cells.append(f"{(p.note or '-')[:27]:>28}")
                else:
                    cells.append(
                        f"{fmt_spread(getattr(p, which)) + _ratio(find(section, 'c10d', n), p, which):>28}"
                    )
            out.append(f"{n:>3}  " + "".join(cells))
        notes = {p.note for p in rows if p.note and getattr(p, which)} | {
            f"{p.backend}: {p.note}" for p in rows if p.note and not getattr(p, which)
        }
        out.extend(f"     note: {n}" for n in sorted(notes))
    sim = [p for p in points if p.section == "sim"]
    if sim:
        out.append("\nelection core, simulated (all nodes start at once; fake clock, in-memory network)")
        out.append("      N   time to one leader (ms)   datagrams sent per node")
        for p in sim:
            out.append(f"{p.nodes:>7}   {fmt_spread(p.samples):>23}   {statistics.median(p.phase):>23.2f}")
    return "\n".join(out)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def targets(points: list[Point]) -> list[str]:
    """The targets of the issues (``bench_targets.LATENCY``), checked against this run."""
    lim = LATENCY

    def get(section: str, backend: str, n: int) -> Point | None:
        return next((p for p in points if (p.section, p.backend, p.nodes) == (section, backend, n)), None)

    lines = []
    phases = (
        ("e2e", "phase", "rendezvous phase", lim["rendezvous_phase_ms"],
         lim["rendezvous_phase_vs_c10d"], None),
        ("e2e", "agent", "rendezvous as the agent sees it (handler created)", lim["agent_rendezvous_ms"],
         lim["agent_rendezvous_vs_c10d"], lim["agent_rendezvous_nodes"]),
        ("rerdzv", "phase", "re-rendezvous phase", lim["rerendezvous_phase_ms"],
         lim["rerendezvous_phase_vs_c10d"], None),
    )  # fmt: skip
    for section, which, what, max_ms, min_ratio, only in phases:
        for p in [
            p
            for p in points
            if p.section == section
            and p.backend == "mingle"
            and p.nodes <= lim["phase_max_nodes"]
            and (only is None or p.nodes == only)
            and getattr(p, which)
        ]:
            c10d = get(section, "c10d", p.nodes)
            ms = (p.median(which) or 0) * 1e3
            ratio = (
                ((c10d.median(which) or 0) / (p.median(which) or 1))
                if c10d and getattr(c10d, which)
                else float("nan")
            )
            ok = ms <= max_ms and ratio >= min_ratio
            limits = f"{ms:.0f} ms (<= {max_ms:g}), {ratio:.0f}x c10d (>= {min_ratio:g})"
            lines.append(f"{_verdict(ok)} {what} N={p.nodes}: {limits}")
    for p in [p for p in points if p.section == "e2e" and p.backend == "mingle" and p.samples]:
        c10d, static = get("e2e", "c10d", p.nodes), get("e2e", "static", p.nodes)
        if c10d and static and c10d.samples and static.samples:
            ours, c, s = p.median() or 0, c10d.median() or 0, static.median() or 1
            ok = ours < c and ours <= lim["e2e_vs_static"] * s
            lines.append(
                f"{_verdict(ok)} end to end N={p.nodes}: {ours:.2f}s, c10d {c:.2f}s, static {s:.2f}s "
                f"(faster than c10d, within {100 * (lim['e2e_vs_static'] - 1):.0f}% of static: "
                f"{100 * (ours / s - 1):+.1f}%)"
            )
    for p in [
        p
        for p in points
        if p.section == "handler" and p.backend == "mingle" and p.nodes <= lim["handler_max_nodes"]
    ]:
        c10d = get("handler", "c10d", p.nodes)
        if c10d and c10d.samples and p.samples:
            ratio = (c10d.median() or 0) / (p.median() or 1)
            lines.append(
                f"{_verdict(ratio >= lim['handler_vs_c10d'])} handler level N={p.nodes}: {ratio:.0f}x c10d "
                f"(>= {lim['handler_vs_c10d']:g})"
            )
    for p in [p for p in points if p.section == "leader" and p.backend == "mingle" and p.samples]:
        worst = max(p.samples)
        lines.append(
            f"{_verdict(worst <= lim['leader_loss_s'])} leader loss: worst {worst:.2f}s "
            f"(<= {lim['leader_loss_s']:g} s: the default heartbeat timeout + 2 s)"
        )
    return lines


def plot(points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("handler", "samples", "handler level"), ("e2e", "phase", "rendezvous phase in torchrun"),
              ("e2e", "samples", "end to end (to first all_reduce)")]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (section, which, title) in zip(axes, panels, strict=True):
        rows = [p for p in points if p.section == section and getattr(p, which)]
        for backend in dict.fromkeys(p.backend for p in rows):
            mine = sorted((p for p in rows if p.backend == backend), key=lambda p: p.nodes)
            xs = [p.nodes for p in mine]
            med = [statistics.median(getattr(p, which)) * 1e3 for p in mine]
            lo = [m - min(getattr(p, which)) * 1e3 for m, p in zip(med, mine, strict=True)]
            hi = [max(getattr(p, which)) * 1e3 - m for m, p in zip(med, mine, strict=True)]
            ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=backend)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes (N)")
        ax.set_ylabel("ms (median, min-max)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if rows:  # a partial run (--sections) leaves some panels empty
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -------------------------------------------------------------------------------- main


SECTIONS = "handler,e2e,rerdzv,leader,sim"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N=2 only, one run per point (under 2 minutes)")
    p.add_argument("--sections", default=SECTIONS)
    p.add_argument(
        "--runs",
        type=int,
        default=None,
        help="runs per point (default: 5 handler and end to end up to N=4, else 3)",
    )
    p.add_argument(
        "--nodes", default=None, help="comma-separated N for the handler and end-to-end sections (e.g. 8)"
    )
    p.add_argument("--out", type=Path, default=None, help="default: results/ (results/quick/ with --quick)")
    p.add_argument("--keep", type=Path, default=None, help="keep agents' logs and stamps in this folder")
    args = p.parse_args()
    compile_package()
    sections = set(args.sections.split(","))
    if args.quick:
        handler_nodes, e2e_nodes, sim_sizes = [2], [2], [10, 100]
        handler_runs, torchrun_runs, small_e2e_runs, sim_runs = (args.runs or 1,) * 3 + (1,)
    else:
        handler_nodes, e2e_nodes, sim_sizes = (
            [2, 4, 8, 16, 32],
            [2, 4, 8],
            [10, 50, 100, 200, 500, 1000, 2000],
        )
        handler_runs, torchrun_runs, small_e2e_runs, sim_runs = (
            args.runs or 5,
            args.runs or 3,
            args.runs or 5,
            3,
        )
    if args.nodes:
        handler_nodes = e2e_nodes = [int(n) for n in args.nodes.split(",")]
    total = (
        ("handler" in sections) * len(handler_nodes) * (len(HANDLER_BACKENDS) + 1)
        + ("e2e" in sections) * len(e2e_nodes) * len(E2E_BACKENDS)
        + ("rerdzv" in sections) * 2 + ("leader" in sections) * 2 + ("sim" in sections) * len(sim_sizes)
    )  # fmt: skip
    try:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="benchmark", unit="point", file=sys.stderr)
        tick = bar.update
    except ImportError:
        bar, tick = None, lambda n=1: None
    started = time.time()
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="mingle-bench-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if "handler" in sections:
            points += bench_handler(handler_nodes, handler_runs, tick)
        if "e2e" in sections:
            points += bench_e2e(e2e_nodes, torchrun_runs, small_e2e_runs, workdir, tick)
        if "rerdzv" in sections:
            timeout_s = QUICK_RERDZV_TIMEOUT_S if args.quick else RERDZV_TIMEOUT_S
            points += bench_rerdzv(3 if not args.quick else 2, torchrun_runs, workdir, tick, timeout_s)
        if "leader" in sections:
            points += bench_leader(torchrun_runs, workdir, tick)
        if "sim" in sections:
            points += bench_sim(sim_sizes, sim_runs, tick)
    if bar is not None:
        bar.close()
    # A quick or partial run never overwrites the full run's results (docs/benchmarks.md shows those).
    partial = args.quick or args.nodes or args.sections != SECTIONS
    args.out = args.out or (HERE / "results" / "quick" if partial else HERE / "results")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": machine(),
        "quick": args.quick,
        "seconds": round(time.time() - started, 1),
        "points": [asdict(p) for p in points],
        "targets": targets(points),
    }
    (args.out / "latency.json").write_text(json.dumps(report, indent=2))
    plot(points, args.out / "latency.png")
    print(machine_line(report["machine"]))
    print(table(points))
    print("\ntargets:")
    print("\n".join(f"  {line}" for line in report["targets"]))
    print(f"\n{report['seconds']:.0f}s; wrote {args.out / 'latency.json'} and {args.out / 'latency.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
