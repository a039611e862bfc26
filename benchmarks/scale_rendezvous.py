"""Rendezvous at scale: 64 to 1,024 real nodes, many per process, mingle and c10d side by side.

Every node is a real rendezvous handler made through torch's public registry, ``--per-process``
of them in each host process (threads), no torch workers. For mingle that is the whole
control plane: real multicast on 127.0.0.1, the real leader with its TCPStores, its control
connections and heartbeats. The leader is a host process of its own, so its CPU, memory and
descriptors are its own; so are the victim of the death phase and the *successor* (rank 1 of
the round: it joins first after the leader; the member that takes over when the leader is
lost): in the field each has a host of its own, and a new leader starved among 63 other nodes
measures the harness.
Heartbeats run at torch's defaults (5 s x 3, ``bench_targets.SCALE_KEEP_ALIVE``; ``--keep-alive``
changes them, and the leader-loss target with them: the CI smoke test runs 1 s x 3).

Sections (``--sections``, all by default):

* ``mingle``  for each N: the leader starts first and is elected; the other N-1 nodes are
  created, then every node calls ``next_rendezvous()`` at once. Measured:
  - first round: the last node's call to the last node's return (and release to last return);
  - re-rendezvous after a death: the victim host is SIGKILLed, the survivors call again;
  - leader loss: the leader's host is frozen (SIGSTOP, as a host that loses power: no
    connection is closed) and the survivors call again: freeze to the last new round
    (``successor_led``: the successor's process leads it);
  - on the leader: CPU seconds and peak memory over the first round, open descriptors,
    control frames per join (counted by the leader), datagrams sent and received per node.
* ``c10d``    the same first round with torch's c10d backend (one TCPStore endpoint hosted by a
  host process of its own), within ``--c10d-budget`` seconds per point; larger N are
  skipped once one does not finish.
* ``dns``     why the hosts get a resolver of their own: N TCPStore clients connecting at
  once to a local store, with this machine's resolver and with one that answers at once.

Output: a table, ``scale.json`` and ``scale.png`` in ``--out`` (``results/``; a partial
run writes ``results/quick/``), and the issue's targets checked (``bench_targets.py``).

    python benchmarks/scale_rendezvous.py                    # make bench-scale
    python benchmarks/scale_rendezvous.py --nodes 64 --sections mingle --out /tmp/x
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_report  # noqa: E402
import bench_targets  # noqa: E402
from bench_pool import Host, HostError, Hosts, compile_package, isolated_resolver, serve, usage  # noqa: E402

SECTIONS = "mingle,c10d,dns"
READY_TIMEOUT_S = 240.0
PHASE_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 60.0
DNS_BURSTS = (1, 16, 32, 128)
CREATE_THREADS = 4
#: A thousand nodes' threads on two cores answer late; the default 0.02 s window lets a node
#: that heard nothing in time claim against the running leader (see docs/benchmarks.md#scale). 0.25 s
#: until the nodes' work per wake-up shrank; a successor waits one window before it claims.
ELECTION_WINDOW_S = 0.1
#: The data path check is off here. In the field each node makes its 16 probes in parallel on
#: its own host (a round trip); here 1,024 nodes' probes share 2 cores and the GIL of 16
#: processes, which measures this machine, not the rendezvous (with it on, an earlier run
#: took 7.6 s for the first round at 1,024 nodes and 0.18 s at 64; see docs/benchmarks.md#scale).
DATA_PATH_TIMEOUT_S = 0.0
#: The GIL switch interval of the processes that host 64 nodes each (see host_main).
CROWD_SWITCH_INTERVAL_S = 0.05


# ------------------------------------------------------------------------------ host side


def host_main(spec: dict[str, Any]) -> int:
    """A host process: ``spec["count"]`` nodes of one job; answers the driver's commands."""
    import logging

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.api import rendezvous_handler_registry

    import torch_mingle  # noqa: F401 - registers the backend as the entry point would
    from torch_mingle._record import field_names
    from torch_mingle.config import MingleConfig
    from torch_mingle.handler import MingleRendezvousHandler

    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    if spec["role"] == "crowd":
        # 64 nodes' threads share this process's GIL; in the field each node has its own. A
        # thread waiting for the GIL wakes every switch interval (5 ms by default) to ask for
        # it: with a hundred waiters that is a storm of futex calls (75 to 100 % system time
        # here during a burst), CPU taken from every process, the leader's included. See
        # docs/benchmarks.md#what-this-machine-cannot-show.
        sys.setswitchinterval(CROWD_SWITCH_INTERVAL_S)
    logging.getLogger("torch_mingle").setLevel(logging.ERROR)  # a thousand nodes' warnings are noise here
    if spec["role"] in os.environ.get("SCALE_LOG_ROLES", "").split(","):  # e.g. leader,victim
        logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("torch_mingle").setLevel(logging.INFO)
    count = spec["count"]

    def make(_: int) -> Any:
        if spec["backend"] == "mingle":
            interval, attempts = spec["keep_alive"]
            params = RendezvousParameters(
                "mingle", "", spec["job"], spec["min"], spec["max"], interface="127.0.0.1",
                port=str(spec["port"]), join_timeout=str(PHASE_TIMEOUT_S), last_call_timeout="30",
                keep_alive_interval=str(interval), keep_alive_max_attempt=str(attempts),
                election_window=str(ELECTION_WINDOW_S), data_path_timeout=str(DATA_PATH_TIMEOUT_S),
                # Many nodes share this process and its state directory; in the field each node
                # keeps its slot on a host of its own (one lock, a small write per vote).
                state_dir="none",
            )  # fmt: skip
        else:
            params = RendezvousParameters(
                "c10d", f"127.0.0.1:{spec['port']}", spec["job"], spec["min"], spec["max"],
                is_host=str(spec["role"] == "leader"), join_timeout=str(int(spec["budget"])),
                last_call_timeout="30",
            )  # fmt: skip
        if spec["role"] == "successor":
            # Rank 1 of the round (it joins first): the member that takes over when the leader is
            # lost. In the field it has a host of its own; here it gets a process of its own.
            return MingleRendezvousHandler(MingleConfig.from_params(params), node_id=1)
        return rendezvous_handler_registry.create_handler(params)

    pool = ThreadPoolExecutor(max_workers=count)
    handlers: list[Any] = []

    def join(h: Any) -> dict[str, Any]:
        t_call = time.time()
        try:
            info = h.next_rendezvous()
            return {"t_call": t_call, "t": time.time(), "rank": info.rank, "world": info.world_size}
        except Exception as exc:
            return {"t_call": t_call, "t": time.time(), "error": f"{type(exc).__name__}: {str(exc)[:200]}"}

    def leaders() -> list[str]:
        return sorted({f"{d.leader} (epoch {d.epoch})" for d in (h.diagnostics() for h in handlers)})

    def stuck(h: Any) -> dict[str, Any]:
        d = h.diagnostics()
        where = f"role {d.role}, leader {d.leader} (epoch {d.epoch}), round {d.round}, status {d.status}"
        return {"t_call": 0.0, "t": time.time(), "error": f"still waiting: {where}"[:300]}

    def counters() -> dict[str, Any]:
        if spec["backend"] != "mingle":
            return {}
        diags = [h.diagnostics() for h in handlers]
        out: dict[str, Any] = {
            "sent": sum(d.stats.sent for d in diags),
            "received": sum(d.stats.received for d in diags),
            "leaders": sum(d.is_leader for d in diags),
        }
        lead = next((d for d in diags if d.is_leader), None)
        if lead is not None:
            c = lead.control
            out["control"] = {name: getattr(c, name) for name in field_names(c)}
        return out

    def handle(cmd: dict[str, Any]) -> dict[str, Any]:
        if cmd["cmd"] == "create":
            # A few at a time: 64 handlers starting at once in one process starve each
            # other's loop threads (one GIL) past the election window, as no real host would.
            with ThreadPoolExecutor(max_workers=CREATE_THREADS) as creators:
                handlers.extend(creators.map(make, range(count)))
            if spec["backend"] != "mingle":
                return {"usage": usage(), "leaders": []}
            # Until every node here follows a leader (the driver checks it is the first node).
            leads = spec["role"] == "leader"
            deadline = time.monotonic() + READY_TIMEOUT_S / 2
            for h in handlers:
                left = max(0.0, deadline - time.monotonic())
                if h.wait_diagnostics(lambda d: d.is_leader if leads else d.leader is not None, left) is None:
                    raise RuntimeError(f"a node found no leader in time: {h.diagnostics()}")
            return {"usage": usage(), "leaders": leaders()}
        if cmd["cmd"] == "leaders":
            return {"leaders": leaders()}
        if cmd["cmd"] == "ahead":
            return {"ahead": sum(h.diagnostics().store_ahead for h in handlers)}
        if cmd["cmd"] == "join":
            # Answer before the driver gives up, naming the state of every node still waiting.
            futures = [pool.submit(join, h) for h in handlers]
            # A phase this host cannot finish: every thread's stack on stderr, to see where.
            faulthandler.dump_traceback_later(PHASE_TIMEOUT_S - 35)
            wait(futures, timeout=PHASE_TIMEOUT_S - 30)  # a starved host needs its margin
            faulthandler.cancel_dump_traceback_later()
            results = [f.result() if f.done() else stuck(h) for f, h in zip(futures, handlers, strict=True)]
            time.sleep(0.2)  # the leader's diagnostics refresh every 0.1 s
            return {"results": results, "usage": usage(), "counters": counters()}
        if cmd["cmd"] == "stop":
            list(pool.map(lambda h: h.shutdown(), handlers))
            return {"stopped": True}
        raise ValueError(f"unknown command {cmd!r}")

    print(json.dumps({"loaded": True}), flush=True)  # torch is imported: the driver may go on
    return serve(handle)


def dns_host(n: int) -> dict[str, Any]:
    """N TCPStore clients connecting at once to a store in this process: connect times."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    took: list[float] = []
    go = threading.Event()
    lock = threading.Lock()

    def one() -> None:
        go.wait()
        t = time.monotonic()
        TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=60))
        with lock:
            took.append(time.monotonic() - t)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(timeout=90)
    return {
        "n": n,
        "median_s": statistics.median(took),
        "max_s": max(took),
        "over_1s": sum(x > 1 for x in took),
    }


# ---------------------------------------------------------------------------- driver side


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(hosts: Hosts, name: str, spec: dict[str, Any]) -> Host:
    return hosts.start(name, Path(__file__), ["--host", json.dumps(spec)])


def _crowd(hosts: Hosts, spec: dict[str, Any], nodes: int, per_process: int) -> list[Host]:
    out = []
    for i, first in enumerate(range(0, nodes, per_process)):
        out.append(
            _start(hosts, f"crowd{i}", {**spec, "role": "crowd", "count": min(per_process, nodes - first)})
        )
    return out


def _create(hosts: list[Host]) -> list[dict[str, Any]]:
    """Create every host's nodes, one host after the other.

    On one machine a thousand nodes starting at once share two cores; in the field each has
    its own. One host at a time keeps the creation storm from starving the leader (which
    would then be deposed before the measurement starts); every timed phase below starts
    with every node created and following the leader.
    """
    Hosts.expect(hosts, READY_TIMEOUT_S)  # "loaded": torch is imported everywhere first
    answers = []
    for h in hosts:
        h.send({"cmd": "create"})
        answers.append(h.expect(time.monotonic() + READY_TIMEOUT_S))
    return answers


def _poll(
    hosts: list[Host], cmd: str, done: Callable[[list[dict[str, Any]]], bool], interval_s: float
) -> tuple[float | None, list[dict[str, Any]]]:
    """Ask every host ``cmd`` until ``done(answers)``, for at most ``SETTLE_TIMEOUT_S``; returns how
    long that took (None: it never was) and the last answers."""
    started = time.monotonic()
    while True:
        Hosts.send(hosts, {"cmd": cmd})
        answers = Hosts.expect(hosts, PHASE_TIMEOUT_S)
        if done(answers):
            return time.monotonic() - started, answers
        if time.monotonic() - started > SETTLE_TIMEOUT_S:
            return None, answers
        time.sleep(interval_s)


def _settle(hosts: list[Host], leader: str) -> float:
    """Wait until every node follows ``leader``; returns how long that took after the last creation.

    A node created while its host's threads were starved may claim before it hears the
    leader; its claim loses (see docs/design.md#election) and its followers move, within seconds.
    """

    def seen(answers: list[dict[str, Any]]) -> set[str]:
        return {x for a in answers for x in a["leaders"]}

    took, answers = _poll(hosts, "leaders", lambda answers: seen(answers) == {leader}, 0.5)
    if took is None:
        raise HostError(
            f"{SETTLE_TIMEOUT_S:g} s after creation the nodes follow {sorted(seen(answers))}, not {leader}"
        )
    return took


def _connected_ahead(hosts: list[Host], nodes: int) -> float | None:
    """Wait until every node holds its client of the next round's store, as it does a moment
    after a round formed (a failure that strikes later finds them all connected); returns how
    long that took, None if some still had none after ``SETTLE_TIMEOUT_S``."""
    took, _ = _poll(hosts, "ahead", lambda answers: sum(a["ahead"] for a in answers) >= nodes, 0.1)
    return took


#: How long the successor's join has to reach the leader before the crowd's (rank 1 goes to the
#: first join after the leader's own); ``successor_rank`` in the JSON says whether it did.
SUCCESSOR_HEAD_START_S = 0.2


def _phase(answers: list[dict[str, Any]], started: float) -> dict[str, Any]:
    """One rendezvous step over every node's result: times, ranks, errors."""
    results = [r for a in answers for r in a["results"]]
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    if not ok:
        return {"ok": False, "errors": errors[:3], "failed": len(errors), "nodes": len(results)}
    last_call, last_return = max(r["t_call"] for r in results), max(r["t"] for r in ok)
    ranks = sorted(r["rank"] for r in ok)
    return {
        "ok": not errors and ranks == list(range(len(results))),
        "nodes": len(results),
        "after_last_call_s": last_return - last_call,
        "release_to_last_s": last_return - started,
        "median_return_s": statistics.median(r["t"] - started for r in ok),
        "errors": errors[:3],
        "failed": len(errors),
        "cpu_s_all": sum(a["usage"]["cpu_s"] for a in answers),  # every host, since it started
        # Datagrams every node received since it started (mingle), to tell each phase's share.
        "received_all": sum(a["counters"].get("received", 0) for a in answers),
    }


#: The step of a mingle point that was under way -> the phase its failure is reported under.
PHASE_OF_STEP = {"creation": "first", "settle": "first", "first round": "first",
                 "connect ahead": "rerdzv", "re-rendezvous": "rerdzv",
                 "leader loss": "leader_loss"}  # fmt: skip


def run_mingle(n: int, per_process: int, prefix: list[str], keep_alive: tuple[float, int]) -> dict[str, Any]:
    """One N: every phase measured; a phase that fails keeps the ones measured before it."""
    point: dict[str, Any] = {"backend": "mingle", "nodes": n}
    step = ["creation"]
    try:
        _run_mingle(n, per_process, prefix, keep_alive, point, step)
    except HostError as exc:
        point[PHASE_OF_STEP[step[0]]] = {"ok": False, "errors": [f"{step[0]}: {exc}"], "nodes": n}
    return point


def _run_mingle(
    n: int,
    per_process: int,
    prefix: list[str],
    keep_alive: tuple[float, int],
    point: dict[str, Any],
    step: list[str],
) -> None:
    spec = {
        "backend": "mingle",
        "job": f"scale-{uuid.uuid4().hex[:8]}",
        "port": _free_port(),
        "min": max(2, n // 2),
        "max": n,
        "keep_alive": keep_alive,
    }
    with Hosts(prefix) as hosts:
        leader = _start(hosts, "leader", {**spec, "role": "leader", "count": 1})
        victim = _start(hosts, "victim", {**spec, "role": "victim", "count": 1})
        successor = _start(hosts, "successor", {**spec, "role": "successor", "count": 1})
        crowd = _crowd(hosts, spec, n - 3, per_process)
        everyone = [leader, victim, successor, *crowd]
        created = _create(everyone)
        ready = created[0]["usage"]
        point["cpu_s_created"] = sum(a["usage"]["cpu_s"] for a in created)
        (first,) = created[0]["leaders"]
        step[0] = "settle"
        point["settled_s"] = _settle(everyone, first)
        step[0] = "first round"
        # First round: the successor first (rank 1 is the first join after the leader's), then
        # everyone else at once. Whether it got rank 1 is checked, not hoped for.
        started = time.time()
        Hosts.send([leader, successor], {"cmd": "join"})
        time.sleep(SUCCESSOR_HEAD_START_S)
        Hosts.send([victim, *crowd], {"cmd": "join"})
        answers = Hosts.expect(everyone, PHASE_TIMEOUT_S)
        point["first"] = _phase(answers, started)
        point["successor_rank"] = answers[2]["results"][0].get("rank")
        lead = answers[0]
        point["leader"] = {
            **lead["usage"],
            "round_cpu_s": lead["usage"]["cpu_s"] - ready["cpu_s"],
            **lead["counters"].get("control", {}),
        }
        point["leader_ok"] = lead["counters"].get("leaders") == 1
        sent = sum(a["counters"]["sent"] for a in answers)
        received = sum(a["counters"]["received"] for a in answers)
        point["datagrams_per_node"] = {"sent": sent / n, "received": received / n}
        step[0] = "connect ahead"
        point["ahead_s"] = _connected_ahead(everyone, n)
        # A node dies (its process is killed: its connections close), the survivors call again.
        victim.signal(signal.SIGKILL)
        victim.proc.wait(timeout=30)
        survivors = [leader, successor, *crowd]
        step[0] = "re-rendezvous"
        started = time.time()
        Hosts.send(survivors, {"cmd": "join"})
        point["rerdzv"] = _phase(Hosts.expect(survivors, PHASE_TIMEOUT_S), started)
        step[0] = "connect ahead"
        point["ahead_again_s"] = _connected_ahead(survivors, n - 1)
        # The leader's host freezes: nothing is closed, only heartbeats stop.
        leader.signal(signal.SIGSTOP)
        step[0] = "leader loss"
        started = time.time()
        try:
            Hosts.send([successor, *crowd], {"cmd": "join"})
            answers = Hosts.expect([successor, *crowd], PHASE_TIMEOUT_S)
            point["leader_loss"] = _phase(answers, started)
            point["leader_loss"]["successor_led"] = answers[0]["counters"].get("leaders") == 1
        finally:
            leader.kill()
        Hosts.send([successor, *crowd], {"cmd": "stop"})
        Hosts.expect([successor, *crowd], 60)


def run_c10d(n: int, per_process: int, prefix: list[str], budget: float) -> dict[str, Any]:
    spec = {
        "backend": "c10d",
        "job": f"scale-{uuid.uuid4().hex[:8]}",
        "port": _free_port(),
        "min": n,
        "max": n,
        "budget": budget,
    }
    point: dict[str, Any] = {"backend": "c10d", "nodes": n}
    with Hosts(prefix) as hosts:
        leader = _start(hosts, "c10d-host", {**spec, "role": "leader", "count": 1})
        crowd = _crowd(hosts, spec, n - 1, per_process)
        everyone = [leader, *crowd]
        _create(everyone)
        started = time.time()
        Hosts.send(everyone, {"cmd": "join"})
        try:
            answers = Hosts.expect(everyone, budget + 15)
        except HostError as exc:
            point["first"] = {"ok": False, "errors": [f"not done in {budget:g} s ({exc})"], "nodes": n}
            for h in hosts.all:
                h.kill()
            return point
        point["first"] = _phase(answers, started)
        point["leader"] = answers[0]["usage"]
        Hosts.send(everyone, {"cmd": "stop"})
        Hosts.expect(everyone, 120)
    return point


def run_dns(prefix_isolated: list[str]) -> list[dict[str, Any]]:
    rows = []
    for resolver, prefix in (("machine", []), ("isolated", prefix_isolated)):
        if resolver == "isolated" and not prefix:
            continue
        with Hosts(prefix) as hosts:
            h = hosts.start(f"dns-{resolver}", Path(__file__), ["--dns", ",".join(map(str, DNS_BURSTS))])
            for _ in DNS_BURSTS:
                rows.append({"resolver": resolver, **h.expect(time.monotonic() + 120)})
    return rows


# ------------------------------------------------------------------------------------ main


def table(report: dict[str, Any]) -> str:
    out = []
    pts = {(p["backend"], p["nodes"]): p for p in report["points"]}
    sizes = sorted({p["nodes"] for p in report["points"]})
    out.append(
        f"{'N':>5} | {'first round (s)':>15} {'c10d (s)':>9} {'ratio':>6} | {'re-rdzv (s)':>11} | "
        f"{'leader loss (s)':>15} | {'leader CPU (s)':>14} {'peak MiB':>8} {'fds':>5} {'frames/join':>11} | "
        f"{'dgrams/node':>11}"
    )
    for n in sizes:
        m, c = pts.get(("mingle", n)), pts.get(("c10d", n))

        def sec(phase: dict[str, Any] | None, key: str = "after_last_call_s") -> str:
            if not phase:
                return "-"
            return f"{phase[key]:.2f}" if phase.get("ok") and key in phase else "failed"

        first = sec(m and m.get("first"))
        c10d = sec(c and c.get("first"))
        ratio = "-"
        if m and c and m["first"].get("ok") and c["first"].get("ok"):
            ratio = f"{c['first']['after_last_call_s'] / max(m['first']['after_last_call_s'], 1e-6):.0f}x"
        lead = (m or {}).get("leader", {})
        fpj = bench_targets.control_frames(lead) / max(1, lead.get("joins", 0))
        dg = (m or {}).get("datagrams_per_node", {})
        out.append(
            f"{n:>5} | {first:>15} {c10d:>9} {ratio:>6} | {sec(m and m.get('rerdzv')):>11} | "
            f"{sec(m and m.get('leader_loss'), 'release_to_last_s'):>15} | "
            f"{lead.get('round_cpu_s', 0):>14.2f} {lead.get('peak_rss_mib', 0):>8.0f} "
            f"{lead.get('fds', 0):>5} {fpj:>11.1f} | "
            f"{dg.get('sent', 0):>5.1f}/{dg.get('received', 0):<5.0f}"
        )
    for p in report["points"]:
        for phase in ("first", "rerdzv", "leader_loss"):
            if p.get(phase) and p[phase].get("errors"):
                out.append(f"  {p['backend']} N={p['nodes']} {phase}: {'; '.join(p[phase]['errors'])}")
    if report.get("dns"):
        out.append("\nTCPStore clients connecting at once (torch asks DNS for each peer's name):")
        for row in report["dns"]:
            out.append(
                f"  resolver {row['resolver']:>8}  N={row['n']:>4}: median {row['median_s']:.3f} s, "
                f"max {row['max_s']:.3f} s, {row['over_1s']} over 1 s"
            )
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="64,128,256,512,1024")
    p.add_argument("--per-process", type=int, default=64)
    p.add_argument("--sections", default=SECTIONS)
    p.add_argument("--c10d-budget", type=float, default=60.0, help="seconds a c10d point may take")
    p.add_argument("--resolver", choices=("isolated", "machine"), default="isolated")
    p.add_argument(
        "--keep-alive",
        default=",".join(f"{x:g}" for x in bench_targets.SCALE_KEEP_ALIVE),
        help="mingle's keep_alive_interval,keep_alive_max_attempt (torch's defaults: 5,3)",
    )
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--host", help=argparse.SUPPRESS)
    p.add_argument("--dns", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.host:
        return host_main(json.loads(args.host))
    if args.dns:
        for n in args.dns.split(","):
            print(json.dumps(dns_host(int(n))), flush=True)
        return 0
    compile_package()
    sections = set(args.sections.split(","))
    sizes = [int(x) for x in args.nodes.split(",")]
    interval, attempts = args.keep_alive.split(",")
    keep_alive = (float(interval), int(attempts))
    resolver = isolated_resolver(args.resolver == "isolated")
    started = time.time()
    report: dict[str, Any] = {
        "machine": bench_report.machine(),
        "per_process": args.per_process,
        "resolver": "isolated" if resolver.prefix else f"machine ({resolver.why_not})",
        "settings": {
            "election_window": ELECTION_WINDOW_S,
            "keep_alive": list(keep_alive),
            "data_path_timeout": DATA_PATH_TIMEOUT_S,
        },
        "points": [],
    }
    c10d_failed_at: int | None = None
    try:
        for n in sizes:
            if "mingle" in sections:
                print(f"mingle N={n} ...", file=sys.stderr, flush=True)
                report["points"].append(run_mingle(n, args.per_process, resolver.prefix, keep_alive))
            if "c10d" in sections and c10d_failed_at is None:
                print(f"c10d N={n} ...", file=sys.stderr, flush=True)
                pt = run_c10d(n, args.per_process, resolver.prefix, args.c10d_budget)
                report["points"].append(pt)
                if not pt["first"].get("ok"):
                    c10d_failed_at = n
        if "dns" in sections:
            report["dns"] = run_dns(resolver.prefix)
    finally:
        resolver.close()
    report["seconds"] = round(time.time() - started, 1)
    targets = bench_targets.scale_targets(keep_alive[0] * keep_alive[1])
    report["targets"] = bench_targets.check(targets, bench_targets.scale_values(report))
    partial = (
        args.sections != SECTIONS
        or args.nodes != p.get_default("nodes")
        or args.keep_alive != p.get_default("keep_alive")
    )
    out = args.out or (HERE / "results" / "quick" if partial else HERE / "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(report, indent=1))
    bench_report.plot_scale(report, out / "scale.png")
    print(bench_report.machine_line(report["machine"]))
    print(f"resolver: {report['resolver']}; {args.per_process} nodes per host process")
    print(table(report))
    print("\ntargets:")
    print("\n".join(f"  {line}" for line in report["targets"]))
    print(f"\n{report['seconds']:.0f}s; wrote {out / 'scale.json'} and {out / 'scale.png'}")
    return (
        0 if all(pt.get("first", {}).get("ok") for pt in report["points"] if pt["backend"] == "mingle") else 1
    )


if __name__ == "__main__":
    sys.exit(main())
