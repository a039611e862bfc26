"""The leader's capacity: one real leader, and up to 16,384 members from one load generator.

The leader is the production code in a process of its own: a rendezvous handler made from
torch's ``RendezvousParameters``, its loop, its TCPStores, on 127.0.0.1. The members are not
handlers: this process holds them all, each a TCP connection to the leader's control port and
a ``FollowerSession`` (the follower's sans-I/O protocol, the code every real node runs), driven
by one ``selectors`` loop. Nothing about the members is cheaper on the wire than in the field:
they say hello, join, answer proposals, send and check heartbeats on the production frames.
One shortcut keeps one process able to drive 16,384 of them without touching what the leader
sees: a ``members`` or ``propose`` frame that is byte for byte the one a member before got is
decoded once. (A join names its last round by number, as every node's does.)

Measured, for each N (``--members``):

* connect: N connections, hello and welcome (the connection storm of a new leader);
* first round: every member sends its join at once (the leader's own agent joined before);
  from the last join sent to the last ``round`` frame received (``round_s``), and the leader's
  CPU over that phase, per join;
* heartbeats: ``--hb-seconds`` of the formed round at ``--hb-interval`` (by default what a job
  of that size runs: ``max_nodes / 5000`` s, at least 0.2 s, x7): the leader's CPU per
  heartbeat (one in and one out per member and interval), its share of a core at that rate and
  at 1 Hz (from the CPU per heartbeat), the members x rate it would sustain with half a core,
  and whether anyone was evicted (a false alarm, since nobody here is frozen);
* re-rendezvous: one member's connection is reset (its process died), the leader drops it,
  every other member joins again: from the reset to the last ``round`` frame, which includes the
  leader's ``last_call_timeout`` (``--last-call``) since the round is one short of ``max_nodes``;
* on the leader: peak memory (RSS) and open descriptors.

Output: a table, ``leader.json`` and ``leader.png`` in ``--out`` (``results/``), and the
projection: the leader's CPU is the only serial part of a rendezvous.

    python benchmarks/leader_capacity.py                       # make bench-leader
    python benchmarks/leader_capacity.py --members 1024 --out /tmp/x
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import resource
import selectors
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_report  # noqa: E402
import bench_targets  # noqa: E402
from bench_pool import Host, Hosts, compile_package, serve, usage  # noqa: E402

SIZES = (1024, 4096, 16384)
#: A phase that takes longer is reported as not finished (the benchmark goes on to the next N).
PHASE_TIMEOUT_S = 120.0
#: Connections in flight at once while the members connect (the leader's accept queue).
CONNECTS_IN_FLIGHT = 256
#: How often the generator looks at its members' timers (their heartbeats and bounds), per
#: 1,024 members: a pass over 16,384 sessions costs the generator about 10 ms.
SWEEP_S_PER_1K = 0.005
#: Frames larger than this are the round's (``round``, ``propose``): decoded once per content.
BIG_FRAME_BYTES = 2048
FRAME_HEADER = struct.Struct("!I")


# ------------------------------------------------------------------------------ the leader


def leader_main(spec: dict[str, Any]) -> int:
    """The leader's process: one handler, which wins the election alone and leads the job."""
    import logging

    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from torch_mingle._record import field_names
    from torch_mingle.config import MingleConfig
    from torch_mingle.handler import MingleRendezvousHandler

    logging.getLogger("torch_mingle").setLevel(logging.ERROR)
    # LEADER_PROFILE=PATH: the loop thread's cProfile, written at stop; only while the leader's
    # agent waits for a round (join to joined) with LEADER_PROFILE_ROUNDS=1.
    profile_to = os.environ.get("LEADER_PROFILE")
    profiling = (
        _profile_loop_thread(profile_to, os.environ.get("LEADER_PROFILE_ROUNDS") == "1")
        if profile_to
        else None
    )
    params = RendezvousParameters(
        "mingle", "", spec["job"], spec["min"], spec["max"], interface="127.0.0.1",
        port=str(spec["port"]), join_timeout=str(PHASE_TIMEOUT_S * 2),
        last_call_timeout=str(spec["last_call"]),
        keep_alive_interval=str(spec["interval"]), keep_alive_max_attempt=str(spec["attempts"]),
        data_path_timeout="0", state_dir="none",
    )  # fmt: skip
    handler = MingleRendezvousHandler(MingleConfig.from_params(params))
    joined: dict[str, Any] = {}
    done = threading.Event()

    def join() -> None:
        try:
            info = handler.next_rendezvous()
            joined.update(t=time.time(), rank=info.rank, world=info.world_size)
        except Exception as exc:  # reported to the driver
            joined.update(t=time.time(), error=f"{type(exc).__name__}: {str(exc)[:300]}")
        done.set()

    def counters() -> dict[str, Any]:
        c = handler.diagnostics().control
        return {name: getattr(c, name) for name in field_names(c)}

    def handle(cmd: dict[str, Any]) -> dict[str, Any]:
        if cmd["cmd"] == "lead":
            d = handler.wait_diagnostics(lambda d: d.is_leader and d.leader_port > 0, 60.0)
            if d is None:
                raise RuntimeError(f"not the leader after 60 s: {handler.diagnostics()}")
            return {"ip": d.leader_ip, "port": d.leader_port, "epoch": d.epoch, "node": d.node_id}
        if cmd["cmd"] == "join":
            if profiling is not None:
                profiling.set()
            joined.clear()
            done.clear()
            threading.Thread(target=join, name="bench-join", daemon=True).start()
            return {"started": time.time()}
        if cmd["cmd"] == "joined":
            done.wait(cmd["timeout"])
            if profiling is not None:
                profiling.clear()
            return {"joined": dict(joined), "usage": usage(), "control": counters()}
        if cmd["cmd"] == "usage":
            return {"usage": usage(), "control": counters()}
        if cmd["cmd"] == "stop":
            handler.shutdown()
            return {"stopped": True}
        raise ValueError(f"unknown command {cmd!r}")

    print(json.dumps({"loaded": True}), flush=True)
    return serve(handle)


def _profile_loop_thread(path: str, rounds_only: bool) -> threading.Event:
    """Profile every node loop of this process (cProfile), each wake-up while the returned event
    is set (always, unless ``rounds_only``); the stats go to ``path`` when the loop ends."""
    import cProfile

    from torch_mingle import _loop

    prof, on = cProfile.Profile(), threading.Event()
    if not rounds_only:
        on.set()
    run, iterate = _loop.Loop._run, _loop.Loop._iterate

    def profiled_iterate(self: Any) -> None:
        if not on.is_set():
            iterate(self)
            return
        prof.enable()
        try:
            iterate(self)
        finally:
            prof.disable()
        if not on.is_set():  # a phase ended: its stats, so far (a leader stopped hard writes none)
            prof.dump_stats(path)

    def profiled_run(self: Any) -> None:
        try:
            run(self)
        finally:
            prof.dump_stats(path)

    _loop.Loop._iterate = profiled_iterate  # type: ignore[method-assign]
    _loop.Loop._run = profiled_run  # type: ignore[method-assign]
    return on


# ---------------------------------------------------------------------- the load generator


@dataclass(eq=False)
class Member:
    """One member: a socket, the production follower session, and what the benchmark notes."""

    sock: socket.socket
    session: Any
    buf: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)
    connected: bool = False
    welcomed: bool = False
    round_at: float = 0.0
    round_number: int = 0
    evicted: str = ""


class Generator:
    """Every member of one measurement, in one ``selectors`` loop on this thread."""

    def __init__(self, n: int, leader: dict[str, Any], interval_s: float, attempts: int) -> None:
        from torch_mingle._claims import Claim

        self.n = n
        self.leader = leader
        self.interval_s, self.timeout_s = interval_s, interval_s * attempts
        self.claim = Claim(epoch=leader["epoch"], leader=int(leader["node"], 16))
        self.sel = selectors.DefaultSelector()
        self.members: list[Member] = []
        self.by_fd: dict[int, Member] = {}
        self.parsed: dict[bytes, dict[str, Any]] = {}  # a big frame's body -> its fields, once
        self.rounds: dict[int, Any] = {}  # round number -> Round, as the answers named it
        self.evictions: list[str] = []
        self.bytes_in = 0
        self._next_sweep = 0.0

    # -- sockets

    def connect_all(self, deadline: float) -> None:
        from torch_mingle._follower import FollowerSession
        from torch_mingle._settings import Beats

        rng = random.Random(self.n)
        todo = list(range(self.n))
        while todo or not all(m.welcomed for m in self.members):
            in_flight = sum(not m.welcomed for m in self.members)
            while todo and in_flight < CONNECTS_IN_FLIGHT:
                todo.pop()
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.connect_ex((self.leader["ip"], self.leader["port"]))
                session = FollowerSession(
                    claim=self.claim, ip=self.leader["ip"], port=self.leader["port"],
                    node=rng.getrandbits(63) | 1, own_ip="127.0.0.1", history=None,
                    beats=Beats(self.interval_s, self.timeout_s, connect_timeout_s=PHASE_TIMEOUT_S),
                    label="bench", started=time.monotonic(), conn=sock.fileno(),
                )  # fmt: skip
                m = Member(sock, session)
                self.members.append(m)
                self.by_fd[sock.fileno()] = m
                self.sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, m)
                in_flight += 1
            self.pump(0.01)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sum(m.welcomed for m in self.members)} of {self.n} members welcomed")

    def pump(self, wait_s: float) -> None:
        """One pass: read and write what is ready, then the members' timers if due."""
        for key, events in self.sel.select(wait_s):
            m: Member = key.data
            if events & selectors.EVENT_WRITE:
                self._writable(m)
            if events & selectors.EVENT_READ:
                self._readable(m)
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + max(0.02, SWEEP_S_PER_1K * len(self.members) / 1024)
            for m in self.members:
                if m.evicted:
                    continue
                s = m.session
                due = s.next_timer()
                if due is not None and now >= due:
                    s.handle_timer(now)
                    self._after(m, now)

    def _writable(self, m: Member) -> None:
        if not m.connected:
            err = m.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, f"connect to the leader: {os.strerror(err)}")
            m.connected = True
            m.session.connected(time.monotonic())
            self._after(m, time.monotonic())
        self._flush(m)

    def _readable(self, m: Member) -> None:
        try:
            data = m.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionError as exc:
            data, why = b"", str(exc)
        else:
            why = "closed by the leader"
        if not data:
            if not m.evicted:
                m.evicted = why
                self.evictions.append(why)
            self.sel.unregister(m.sock)
            return
        self.bytes_in += len(data)
        m.buf += data
        from torch_mingle._frames import from_leader_stream
        from torch_mingle._wire import Framed

        now = time.monotonic()
        frames: list[Framed] = []
        while len(m.buf) >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(m.buf)
            end = FRAME_HEADER.size + size
            if len(m.buf) < end:
                break
            body = bytes(m.buf[FRAME_HEADER.size : end])
            del m.buf[:end]
            if size > BIG_FRAME_BYTES:
                self._big_frame(m, body, now)
            else:
                frames.append(Framed(from_leader_stream(json.loads(body)), body))
        if frames:
            m.session.received(frames, now)
            self._after(m, now)

    def _big_frame(self, m: Member, body: bytes, now: float) -> None:
        """A round's members (``members``, ``propose``): the same bytes for every member, so
        decoded once; then what the follower session does with it (it keeps the round, which
        the ``round`` answer names by number; a proposal gets its vote)."""
        from torch_mingle._records import Round

        msg = self.parsed.get(body)
        if msg is None:
            self.parsed.clear()
            msg = self.parsed[body] = json.loads(body)
            msg["decoded"] = Round.from_json(msg["round"])
        rnd = msg["decoded"]
        m.session.last_heard = now
        m.session.proposals[rnd.number] = rnd
        if msg["t"] == "propose":
            m.session.accept(rnd.number)
            self._after(m, now)

    def _after(self, m: Member, now: float) -> None:
        from torch_mingle._follower import SessionOver, Welcomed
        from torch_mingle._frames import Propose, RoundFormed

        for ev in m.session.events():
            if isinstance(ev, Welcomed):
                m.welcomed = True
            elif isinstance(ev, SessionOver) and not m.evicted:
                m.evicted = ev.reason
                self.evictions.append(ev.reason)
            elif isinstance(ev, Propose):  # small enough to come the common way
                m.session.accept(ev.round.number)
            elif isinstance(ev, RoundFormed) and ev.round is not None:
                m.round_at, m.round_number = now, ev.round.number
                self.rounds[ev.round.number] = ev.round
        out = m.session.frames()
        if out:
            m.out += b"".join(out)
            self._flush(m)

    def _flush(self, m: Member) -> None:
        if m.evicted:
            return
        if m.out and m.connected:
            try:
                sent = m.sock.send(m.out)
                del m.out[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                    raise
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if m.out or not m.connected else 0)
        self.sel.modify(m.sock, want, m)

    # -- steps

    def join_all(self, ticket: int, round_number: int) -> float:
        """Every live member asks for a place at once; returns when the last join was sent."""
        from torch_mingle._frames import Join
        from torch_mingle._records import History

        # The round each member got on its connection: its join names it by number (``ref``).
        history = History.of(self.rounds[round_number]) if round_number else None
        for m in self.members:
            if not m.evicted:
                m.round_at = 0.0
                m.session.join(
                    Join(
                        ticket,
                        "127.0.0.1",
                        history=history,
                        timeout_s=PHASE_TIMEOUT_S * 2,
                        remaining_s=PHASE_TIMEOUT_S * 2,
                    )
                )
                out = m.session.frames()
                m.out += b"".join(out)
        last = time.monotonic()
        for m in self.members:
            self._flush(m)
        return last

    def wait_rounds(self, number: int, deadline: float) -> float | None:
        """Until every live member got round ``number``: when the last one did (None: never)."""
        while time.monotonic() < deadline:
            live = [m for m in self.members if not m.evicted]
            if not live:
                return None  # every member lost its session (``sessions_lost_why`` says why)
            if all(m.round_number >= number and m.round_at for m in live):
                return max(m.round_at for m in live)
            self.pump(0.01)
        return None

    def run_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.pump(0.01)

    def close(self) -> None:
        for m in self.members:
            m.sock.close()
        self.sel.close()


# ------------------------------------------------------------------------------ one size


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every phase at ``n`` members; a phase that does not finish is reported as such."""
    from torch_mingle.config import MingleConfig, default_keep_alive_interval

    port = _free_port()
    # Heartbeats as a job of this size runs them by default (``max_nodes`` = n + 1 with the
    # leader), unless the command line says otherwise.
    interval = args.hb_interval or default_keep_alive_interval(n + 1)
    attempts = args.hb_attempts or MingleConfig.keep_alive_max_attempt
    spec = {
        "job": f"leader-{n}-{os.getpid()}", "min": n, "max": n + 1, "port": port,
        "last_call": args.last_call, "interval": interval, "attempts": attempts,
    }  # fmt: skip
    out: dict[str, Any] = {"members": n, "hb_interval_s": interval, "hb_attempts": attempts}
    with Hosts() as hosts:
        leader = hosts.start("leader", Path(__file__), ["--leader", json.dumps(spec)])
        Hosts.expect([leader], 120)
        leader.send({"cmd": "lead"})
        where = leader.expect(time.monotonic() + 90)
        gen = Generator(n, where, interval, attempts)
        try:
            t0 = time.monotonic()
            before = _ask(leader, "usage")
            gen.connect_all(t0 + PHASE_TIMEOUT_S)
            after = _ask(leader, "usage")
            out["connect_s"] = time.monotonic() - t0
            out["connect_cpu_ms_per_member"] = 1e3 * _cpu(before, after) / n
            out.update(_first_round(leader, gen, n))
            if "round_s" in out:
                out.update(_heartbeats(leader, gen, n, args))
                out.update(_rerendezvous(leader, gen, n))
            _net_of_heartbeats(out, n)
            final = _ask(leader, "usage")
            out["leader_peak_rss_mib"] = final["usage"]["peak_rss_mib"]
            out["leader_fds"] = final["usage"]["fds"]
            out["control"] = final["control"]
            out["generator_mib_in"] = gen.bytes_in / 2**20
            out["sessions_lost"] = len(gen.evictions)
            out["sessions_lost_why"] = sorted(set(gen.evictions))[:3]
        finally:
            gen.close()
            leader.send({"cmd": "stop"})
            Hosts.expect([leader], 60)
    return out


def _not_delivered(number: int, gen: Generator) -> str:
    lost = f"; {len(gen.evictions)} sessions lost, e.g. {gen.evictions[0]!r}" if gen.evictions else ""
    return f"round {number} not delivered to every member (waited up to {PHASE_TIMEOUT_S:g} s){lost}"


def _own_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _net_of_heartbeats(out: dict[str, Any], n: int) -> None:
    """The leader's CPU per join, without the members' heartbeats of the same seconds (the
    heartbeat phase measured their share of a core)."""
    share = out.get("hb_core_share", 0.0)
    for window, key, joins in (
        ("round_window", "join_cpu_ms", n),
        ("rerdzv_window", "rerdzv_cpu_ms_per_join", n - 1),
    ):
        if window in out:
            seconds, cpu = out.pop(window)
            out[key] = 1e3 * max(0.0, cpu - share * seconds) / joins


def _ask(leader: Host, cmd: str, **fields: Any) -> dict[str, Any]:
    leader.send({"cmd": cmd, **fields})
    return leader.expect(time.monotonic() + PHASE_TIMEOUT_S + 30)


def _cpu(before: dict[str, Any], after: dict[str, Any]) -> float:
    return float(after["usage"]["cpu_s"] - before["usage"]["cpu_s"])


def _round_phase(leader: Host, gen: Generator, number: int, since: float) -> dict[str, Any]:
    """The leader's agent and every live member join round ``number`` (the leader's first);
    when the last join went out and the last round arrived (None: never), and the leader's CPU
    from ``since`` on, with the seconds it covers."""
    before = _ask(leader, "usage")
    leader.send({"cmd": "join"})
    leader.expect(time.monotonic() + 30)
    if number == 1:
        gen.run_for(0.2)  # the leader's own join is in: the members' are the last ones
    last_join = gen.join_all(ticket=number, round_number=number - 1)
    # A first round's bound counts from the last join; a re-rendezvous's from the failure.
    last_round = gen.wait_rounds(number, (since if number > 1 else last_join) + PHASE_TIMEOUT_S)
    joined = _ask(leader, "joined", timeout=30)
    got = [m.round_at for m in gen.members if not m.evicted and m.round_number >= number and m.round_at]
    return {
        "last_join": last_join,
        "first_round": min(got, default=None),  # the first member to get it: the leader decided
        "last_round": last_round,
        "window": [time.monotonic() - since, _cpu(before, joined)],
        "joined": joined["joined"],
    }


def _first_round(leader: Host, gen: Generator, n: int) -> dict[str, Any]:
    p = _round_phase(leader, gen, 1, time.monotonic())
    if p["last_round"] is None:
        return {"round_error": _not_delivered(1, gen)}
    return {
        "round_s": p["last_round"] - p["last_join"],
        "round_first_member_s": p["first_round"] - p["last_join"],
        "round_window": p["window"],
        "leader_rank": p["joined"].get("rank"),
        "leader_error": p["joined"].get("error"),
    }


def _heartbeats(leader: Host, gen: Generator, n: int, args: argparse.Namespace) -> dict[str, Any]:
    gen.run_for(gen.interval_s * 2)  # the round's start settles
    evicted = len(gen.evictions)
    before = _ask(leader, "usage")
    t, gen_before = time.monotonic(), _own_cpu_s()
    gen.run_for(max(args.hb_seconds, 3 * gen.interval_s))  # a few beats of every member at least
    after = _ask(leader, "usage")
    took = time.monotonic() - t
    gen_share = (_own_cpu_s() - gen_before) / took
    beats = 2 * (after["control"]["beats_out"] - before["control"]["beats_out"])  # in and out
    cpu = _cpu(before, after)
    per_member_beat = cpu / max(1, beats / 2)
    return {
        "generator_core_share": gen_share,  # near 1.0: the generator, not the leader, sets the pace
        "hb_core_share": cpu / took,
        "hb_cpu_us": 1e6 * cpu / max(1, beats),
        # n members at 1 Hz, from the CPU per heartbeat measured here (one in, one out a second)
        "hb_core_share_at_1hz": n * per_member_beat,
        "hb_capacity_member_hz": 0.5 / per_member_beat if per_member_beat else None,
        "hb_evicted": len(gen.evictions) - evicted,
    }


def _rerendezvous(leader: Host, gen: Generator, n: int) -> dict[str, Any]:
    victim = gen.members[len(gen.members) // 2]
    t = time.monotonic()
    victim.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    victim.evicted = "killed by the benchmark"
    gen.sel.unregister(victim.sock)
    victim.sock.close()  # a reset: its process died
    p = _round_phase(leader, gen, 2, t)
    if p["last_round"] is None:
        return {"rerdzv_error": _not_delivered(2, gen)}
    return {
        "rerdzv_s": p["last_round"] - t,
        "rerdzv_after_last_join_s": p["last_round"] - p["last_join"],
        "rerdzv_window": p["window"],
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------ report


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        bench_report.machine_line(bench_report.machine()),
        "heartbeats: "
        + (
            f"every {args.hb_interval:g} s"
            if args.hb_interval
            else "each N's default (max_nodes / 5000 s, >= 0.2 s)"
        )
        + f" x{args.hb_attempts or 'default'}; last_call_timeout {args.last_call:g} s",
        "",
        "| members | heartbeats | connect | first round | CPU/join | hb: core | CPU/hb | hb at 1 Hz: core "
        "| capacity (members x Hz, 0.5 core) | evicted | re-rdzv | CPU/re-join | RSS | fds |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['members']:,} | {_fmt(r.get('hb_interval_s'), '.3g')} s x{r.get('hb_attempts', '-')} "
            f"| {_fmt(r.get('connect_s'), '.2f')} s | {_fmt(r.get('round_s'), '.3f')} s "
            f"| {_fmt(r.get('join_cpu_ms'), '.3f')} ms | {_fmt(r.get('hb_core_share'), '.1%')} "
            f"| {_fmt(r.get('hb_cpu_us'), '.1f')} us | {_fmt(r.get('hb_core_share_at_1hz'), '.0%')} "
            f"| {_fmt(r.get('hb_capacity_member_hz'), ',.0f')} "
            f"| {r.get('hb_evicted', '-')} | {_fmt(r.get('rerdzv_s'), '.3f')} s "
            f"| {_fmt(r.get('rerdzv_cpu_ms_per_join'), '.3f')} ms "
            f"| {_fmt(r.get('leader_peak_rss_mib'), '.0f')} MiB | {r.get('leader_fds', '-')} |"
        )
        for key in ("round_error", "rerdzv_error", "leader_error"):
            if r.get(key):
                lines.append(f"  {r['members']}: {key}: {r[key]}")
    lines += ["", projection(results), "", "targets:", *targets(results)]
    return "\n".join(lines)


def targets(results: list[dict[str, Any]]) -> list[str]:
    """The issue's targets (``bench_targets.LEADER_TARGETS``), checked against this run."""
    values = {
        t.metric: {r["members"]: r[t.metric] for r in results if r.get(t.metric) is not None}
        for t in bench_targets.LEADER_TARGETS
    }
    return bench_targets.check(bench_targets.LEADER_TARGETS, values)


def projection(results: list[dict[str, Any]]) -> str:
    """What the leader's serial CPU says about larger jobs."""
    done = [r for r in results if r.get("join_cpu_ms") is not None]
    if not done:
        return "projection: no size finished"
    big = max(done, key=lambda r: r["members"])
    per_join_s = big["join_cpu_ms"] / 1e3
    cap = big.get("hb_capacity_member_hz")
    text = (
        f"projection (the leader's CPU is the only serial part): at {big['members']:,} members a join costs "
        f"{1e3 * per_join_s:.2f} ms of the leader's CPU"
    )
    if cap:
        text += f"; half a core sustains {cap:,.0f} member-heartbeats per second"
    return text + "."


def plot(results: list[dict[str, Any]], path: Path) -> None:
    def series(key: str, scale: float = 1.0) -> list[tuple[float, float]]:
        return [(r["members"], r[key] * scale) for r in results if r.get(key) is not None]

    rounds = {"first round": series("round_s"), "re-rdzv": series("rerdzv_s")}
    joins = {"first round": series("join_cpu_ms"), "re-join": series("rerdzv_cpu_ms_per_join")}
    bench_report.plot_lines(
        [
            ("first round and re-rendezvous (s)", "s", rounds),
            ("leader CPU per join (ms)", "ms", joins),
            ("leader CPU per heartbeat (us)", "us", {"in or out": series("hb_cpu_us")}),
        ],
        path,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", default=",".join(map(str, SIZES)))
    parser.add_argument("--hb-interval", type=float, help="seconds (default: each N's own default)")
    parser.add_argument("--hb-attempts", type=int, help="(default: mingle's default)")
    parser.add_argument("--hb-seconds", type=float, default=10.0)
    parser.add_argument("--last-call", type=float, default=0.25)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--leader", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.leader:
        return leader_main(json.loads(args.leader))
    compile_package()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results = []
    for n in (int(x) for x in args.members.split(",")):
        if n + 64 > hard:
            results.append({"members": n, "round_error": f"the descriptor limit {hard} is below {n} members"})
            continue
        print(f"--- {n} members", flush=True)
        r = measure(n, args)
        print(json.dumps({k: v for k, v in r.items() if k != "control"}), flush=True)
        results.append(r)
    text = report(results, args)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": bench_report.machine(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": results,
        "targets": targets(results),
    }
    (args.out / "leader.json").write_text(json.dumps(payload, indent=1))
    plot(results, args.out / "leader.png")
    print(f"wrote {args.out / 'leader.json'} and {args.out / 'leader.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
