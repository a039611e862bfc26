"""Soak: a loaded job that nothing breaks, with the default heartbeats, counting false alarms.

A false alarm is a round broken although no node failed: every worker of the job restarts
for nothing. This run looks for them under what a busy cluster does to a healthy job:

* **load**: every node (one network namespace each, 3 nodes, one torchrun agent and one DDP
  worker per node) runs two CPU hogs (one per core of this machine) and a memory-bandwidth hog
  (two 256 MiB buffers copied into each other) beside its training, for the whole run;
* **agent stalls**: every ``duration / 15`` one agent's main thread holds the GIL for
  ``--stall`` seconds (1 s; a long C call, a huge pickle: ``stallable_torchrun``), the leader
  and a follower in turn. A stall stops the agent's mingle loop: no heartbeat goes out. The
  heartbeat timeout (``keep_alive_interval x keep_alive_max_attempt``) less one interval is the
  longest stall a node survives; a longer one is a freeze, and is detected as one;
* **packet loss**: 20 % of the packets on one node's link, both ways, for a minute (a
  follower's, then later the leader's);
* **clock steps**: the wall clock stepped forward by 10 s, later back by 10 s (NTP, a resumed
  VM). The machine's clock: root only, restored when the run ends however it ends.

The job must train from start to end in its first round: the rounds rank 0's step log holds
after the first are rounds broken for nothing (target 0), and each "no heartbeat" line of an
agent's log is shown. Not part of CI (``make soak``, 30 minutes); ``tests/netns`` runs a
one-minute smoke of it.

    .venv/bin/python -m tests.stress.loaded_soak --minutes 30 [--json soak.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import (
    Agent,
    agent_env,
    assert_trained_together,
    final_reports,
    finish_all,
    leader_of,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
)
from tests.netns.segment import Host, Segment, netns_available, nftables_available
from torch_mingle.config import MingleConfig

NODES = 3
STEP_TIME_S = 0.2
LOSS_PERCENT = 20
CLOCK_STEP_S = 10.0
#: Time for the job to start and train before the load begins: the job trains until then + the run.
START_ALLOWANCE_S = 30.0
CPU_HOG = "while True: pass"
MEMORY_HOG = "a = bytearray(1 << 28); b = bytearray(1 << 28)\nwhile True: b[:] = a"


@dataclass
class Soak:
    """One run: its segment, nodes, hogs, and what it did when (seconds since the load began)."""

    workdir: Path
    segment: Segment = field(default_factory=Segment)
    hosts: list[Host] = field(default_factory=list)
    agents: list[Agent] = field(default_factory=list)
    hogs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    clock_offset_s: float = 0.0
    began: float = 0.0
    log: list[tuple[float, str]] = field(default_factory=list)

    def note(self, what: str) -> None:
        at = time.monotonic() - self.began
        self.log.append((at, what))
        print(f"  {at:7.1f}s  {what}", flush=True)

    def start(self, until: float, stall_s: float) -> None:
        self.segment.create_bridge("br0")
        self.hosts = [self.segment.add_host(f"198.18.0.{21 + i}") for i in range(NODES)]
        conf = {"interface": "eth0", "join_timeout": 120, "last_call_timeout": 1}  # heartbeats: defaults
        cmd = torchrun_cmd(
            job=unique_job("soak"), nnodes=f"2:{NODES}", nproc=1, conf=conf,
            script_args=["--steps", str(10**9), "--until", f"{until:.3f}", "--step-time", str(STEP_TIME_S),
                         "--quiet", "--trace", str(self.workdir / "steps.log"), "--checkpoint",
                         str(self.workdir / "ckpt"), "--report", str(self.workdir / "report")],
        )  # fmt: skip
        cmd[cmd.index("torch.distributed.run")] = "tests.stress.stallable_torchrun"
        env = agent_env(MINGLE_STALL_S=str(stall_s))  # how long a stall holds the GIL
        self.agents = [start_agent(h.name, cmd, self.workdir, env=env, netns=h.name) for h in self.hosts]
        wait_until((self.workdir / "ckpt" / "ckpt.pt").exists, 180, "the job to train", 0.1, self.agents)

    def load(self) -> None:
        """Two CPU hogs and a memory-bandwidth hog in every node's namespace."""
        for host in self.hosts:
            for code in (CPU_HOG, CPU_HOG, MEMORY_HOG):
                self.hogs.append(
                    subprocess.Popen(
                        ["ip", "netns", "exec", host.name, sys.executable, "-c", code],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        self.began = time.monotonic()
        self.note(f"load on: {len(self.hogs)} hogs ({len(self.hosts)} nodes x 2 CPU + 1 memory bandwidth)")

    def victim(self, at_leader: bool) -> tuple[Agent, str]:
        """The leader, or a follower, and which it is."""
        leader = leader_of(self.agents)
        if at_leader:
            return leader, "leader"
        return next(a for a in self.agents if a is not leader), "follower"

    def stall(self, at_leader: bool, seconds: float) -> None:
        victim, role = self.victim(at_leader)
        os.kill(victim.pid, signal.SIGUSR2)  # the agent only: its workers would die of it
        self.note(f"stall: {victim.name} ({role}) holds the GIL {seconds:g}s")

    def loss(self, at_leader: bool, on: bool) -> None:
        if on:
            victim, role = self.victim(at_leader)
            self.segment.loss(self.hosts[self.agents.index(victim)], LOSS_PERCENT, link="eth0")
            self.note(f"loss: {LOSS_PERCENT}% of {victim.name}'s packets both ways ({role})")
        else:
            for h in self.hosts:
                self.segment.no_loss(h)
            self.note("loss: off")

    def step_clock(self, seconds: float) -> None:
        time.clock_settime(time.CLOCK_REALTIME, time.time() + seconds)
        self.clock_offset_s += seconds
        self.note(f"clock: wall clock stepped {seconds:+g}s")

    def stop(self) -> None:
        """Undo everything this run did, whatever state it is in."""
        if self.clock_offset_s:
            time.clock_settime(time.CLOCK_REALTIME, time.time() - self.clock_offset_s)
            self.clock_offset_s = 0.0
        for hog in self.hogs:
            if hog.poll() is None:
                hog.kill()
                hog.wait()
        for agent in self.agents:
            agent.kill(signal.SIGCONT)
            agent.kill()
        self.segment.destroy()


def schedule(
    duration_s: float,
    stall_s: float,
    *,
    stalls: int = 15,
    loss: bool = True,
    clock_step_s: float = CLOCK_STEP_S,
) -> list[tuple[float, str, Any]]:
    """What to do when: ``stalls`` stalls spread over the run (leader, follower, ...); with
    ``loss``, loss on a follower's link from 15 % of the run and on the leader's from 55 %, each
    for a minute at most (a tenth of a short run); the clock forward by ``clock_step_s`` at 35 %
    and back at 75 % (0: not at all). A stall that would meet a loss window is left out: each
    fault is met on its own."""
    window = min(60.0, duration_s / 10)
    losses = [(0.15 * duration_s, False), (0.55 * duration_s, True)] if loss else []
    plan: list[tuple[float, str, Any]] = []
    for start, at_leader in losses:
        plan += [(start, "loss", (at_leader, True)), (start + window, "loss", (at_leader, False))]
    if clock_step_s:
        plan += [(0.35 * duration_s, "clock", clock_step_s), (0.75 * duration_s, "clock", -clock_step_s)]
    every = duration_s / stalls
    for i in range(stalls):
        at = every / 2 + i * every
        if not any(start - stall_s - 2 <= at <= start + window + 2 for start, _ in losses):
            plan.append((at, "stall", (i % 2 == 0, stall_s)))
    return sorted(plan, key=lambda item: item[0])


def false_alarms(workdir: Path, agents: list[Agent]) -> tuple[int, list[str]]:
    """Rounds rank 0 trained in after the first (each broken for nothing), and every agent's
    lines that name a silent peer: a lost heartbeat, or a leader's announcements that stopped
    (a follower's two clocks race: whichever runs out first names the silence)."""
    trace = workdir / "steps.log"
    rounds = (
        {tuple(line.split()[1:3]) for line in trace.read_text().splitlines()} if trace.exists() else set()
    )
    lines = [
        f"{a.name}: {line}" for a in agents for line in a.output().splitlines() if "no heartbeat" in line
    ]
    return max(0, len(rounds) - 1), lines


def run(duration_s: float, stall_s: float, workdir: Path, **plan: Any) -> dict[str, Any]:
    """One soak of ``duration_s`` (``plan``: ``schedule``'s choices); what it saw, ``ok`` when the
    job trained to its end in its first round with every node."""
    soak = Soak(workdir)
    result: dict[str, Any] = {"duration_s": duration_s, "stall_s": stall_s, "nodes": NODES}
    defaults = MingleConfig(run_id="soak")
    result["keep_alive"] = [defaults.keep_alive_interval, defaults.keep_alive_max_attempt]
    try:
        soak.start(time.time() + START_ALLOWANCE_S + duration_s, stall_s)  # the job ends with the schedule
        soak.load()
        for at, action, arg in schedule(duration_s, stall_s, **plan):
            wait = soak.began + at - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the schedule itself: faults land at planned times
            if any(a.proc.poll() is not None for a in soak.agents):
                soak.note("an agent exited before the schedule ended")
                break
            if action == "stall":
                soak.stall(*arg)
            elif action == "loss":
                soak.loss(*arg)
            else:
                soak.step_clock(arg)
        rest = max(0.0, duration_s - (time.monotonic() - soak.began))
        codes = finish_all(soak.agents, timeout=rest + 300)
        soak.note(f"job over: exit codes {codes}")
        result["codes"] = codes
        reports = final_reports(workdir / "report")
        world = {r["world_size"] for r in reports}
        result["world"] = sorted(world)
        broken, lines = false_alarms(workdir, soak.agents)
        result.update(false_alarms=broken, lost_heartbeat_lines=lines)
        held = [
            float(line.rsplit(" ", 1)[1].rstrip("s"))
            for a in soak.agents
            for line in a.output().splitlines()
            if "held the GIL for" in line
        ]
        result["stalls_held_s"] = held
        assert codes == [0] * NODES, f"exit codes {codes}"
        assert world == {NODES}, f"the last round held {world} nodes, not {NODES}"
        assert_trained_together(reports, NODES)
        result["steps"] = reports[0]["steps"]
        assert {r["steps"] for r in reports} == {result["steps"]}, "the ranks stopped at different steps"
        result["ok"] = broken == 0
    except AssertionError as exc:
        result.update(ok=False, error=str(exc)[:600])
    finally:
        soak.stop()
        result["events"] = [[round(at, 1), what] for at, what in soak.log]
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--stall", type=float, default=1.0, help="seconds each agent stall holds the GIL")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    reason = netns_available() or nftables_available()
    if reason is not None:
        print(f"the soak needs network namespaces and nftables: {reason}")
        return 2
    defaults = MingleConfig(run_id="soak")
    print(
        f"loaded soak: {args.minutes:g} min, {NODES} nodes, heartbeats {defaults.keep_alive_interval:g}s x "
        f"{defaults.keep_alive_max_attempt} (the defaults), stalls of {args.stall:g}s",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="mingle-soak-") as tmp:
        result = run(args.minutes * 60, args.stall, Path(tmp))
        if not result["ok"]:
            kept = Path(tempfile.mkdtemp(prefix="mingle-soak-failed-"))
            shutil.copytree(tmp, kept, dirs_exist_ok=True)
            result["logs"] = str(kept)
    held = result.get("stalls_held_s", [])
    print(f"\nstalls: {len(held)}, held {min(held, default=0):.2f}-{max(held, default=0):.2f}s")
    for line in result.get("lost_heartbeat_lines", []):
        print(f"  {line}")
    print(f"rounds broken for nothing: {result.get('false_alarms', '-')} (target 0)")
    if "error" in result:
        print(f"FAILED: {result['error']} (logs: {result.get('logs')})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
