"""Transcripts: a job in the simulator, told as commands and what each one printed.

A transcript file (``tests/transcripts/*.txt``) is a list of blocks, as etcd's ``datadriven``
files are: lines starting with ``#`` explain, then one command, a line ``----``, and what the
command printed, up to a blank line::

    # The leader's process dies; the next member in rank order takes over.
    kill 0
    ----

    run 3s
    ----
     5.3s n1 leads epoch 3
     5.6s n1 runs round 2 (epoch 3): n1 n2 n3, rank 0 of 3

``check(path)`` runs every block against a fresh simulation and returns the file as it
should read; ``tests/test_transcripts.py`` compares it with the file, or with
``MINGLE_REWRITE=1`` writes it back (then ``git diff`` shows what changed). Hosts are named
``n0``, ``n1``...: a restarted process keeps its host's name, times are simulated seconds at
the agents' monitor steps (``agents.MONITOR_S``), and one seed makes every run the same.

Commands (``i``: a host; a group is a comma list, ``0,1|2,3`` two sides):

============================  ===============================================================
``start N [min=2] [max=N]``   ``N`` hosts start at once; ``seed=``, ``secret`` (sealed frames)
``add [K]``                   ``K`` more hosts start now (late joiners, or spares at max_nodes)
``run T``                     the job runs ``T`` seconds (``1.5s``); prints what happened
``stabilize [T]``             runs until every agent runs one round for a second (at most
                              ``T``, default 60s)
``kill i`` / ``poweroff i``   the process dies (its kernel closes its sockets) / the host loses
                              power (nothing closes, nothing answers)
``freeze i`` / ``thaw i``     SIGSTOP / SIGCONT of the host's process tree
``restart i``                 a new process on the host, under its node id (its state file)
``cut A|B [drop|reset|fin]``  traffic between the sides stops: silently, or each packet
                              answered by a reset, or each connection closed by a proxy
``heal``                      every cut heals
``leave i``                   SIGTERM: the agent leaves the job at once
``shutdown i``                the agent calls ``shutdown()``: the job closes for every node
``finish``                    the work is done: each agent enters its exit barrier and exits
``print``                     each host: its role, the round its agent runs, its agent's phase
============================  ===============================================================
"""

from __future__ import annotations

import os
from pathlib import Path

from torch_mingle._claims import BecomeLeader, LeaderFound, LeaderLost, Role, SteppedDown, Timing
from torch_mingle._view import Joined
from torch_mingle._wire import derive_key
from torch_mingle.testing.agents import MONITOR_S, Agent, Phase, TorchAgents
from torch_mingle.testing.net import DROP, FIN, RESET
from torch_mingle.testing.sim import SimNode, Simulation

#: The timing of the unit tests: elections and failover in a few simulated seconds.
TIMING = Timing(beacon_interval_s=1.0, leader_timeout_s=3.0, suspect_ttl_s=3.0, successor_wait_s=1.25)
#: A stable job: every agent runs the same round for this long, nothing else happening.
STABLE_S = 1.0
REWRITE_ENV = "MINGLE_REWRITE"


class TranscriptError(Exception):
    """A transcript that cannot be run: an unknown command, a host that does not exist."""


class _Agents(TorchAgents):
    def __init__(self, world: World) -> None:
        super().__init__(world.sim, join_timeout_s=60.0, close_timeout_s=5.0)
        self.world = world

    def delivered(self, agent: Agent, joined: Joined) -> None:
        super().delivered(agent, joined)
        self.world.delivered(agent, joined)

    def noted(self, agent: Agent, what: str) -> None:
        self.world.say(f"{self.world.name(agent.node)} {what}")


class World:
    """One simulated job under transcript commands."""

    def __init__(self, n: int, *, min_nodes: int, max_nodes: int, seed: int, secret: bool) -> None:
        self.sim = Simulation(
            0,
            seed=seed,
            timing=TIMING,
            key=derive_key(b"transcript secret") if secret else None,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            last_call_timeout_s=0.5,
            rejoin_delay_s=10.0,
        )
        self.agents = _Agents(self)
        self.host_of_id: dict[int, int] = {}
        self.out: list[str] = []
        self._events_seen: dict[int, int] = {}  # by process: how many of its events were printed
        self.cuts = 0
        self.add(n)

    # ------------------------------------------------------------ naming and printing

    def name(self, node: SimNode) -> str:
        return f"n{self.host(node)}"

    def host(self, node: SimNode) -> int:
        return self.host_of_id[node.core.node_id]

    def id_name(self, node_id: int) -> str:
        host = self.host_of_id.get(node_id)
        return f"n{host}" if host is not None else f"{node_id:016x}"

    def say(self, what: str) -> None:
        self.out.append(f"{self.sim.now:6.2f}s {what}")

    def delivered(self, agent: Agent, joined: Joined) -> None:
        rnd = joined.round
        members = " ".join(self.id_name(m) for m in rnd.members)
        rank = rnd.rank_of(agent.node_id)
        self.say(
            f"{self.name(agent.node)} runs round {rnd.number} (epoch {rnd.epoch}): {members}, "
            f"rank {rank} of {len(rnd.members)}"
        )

    def _discovery_events(self) -> None:
        """What each process's election saw since the last step, at the moment it saw it."""
        lines: list[tuple[float, int, str]] = []
        for node in self.sim.nodes:
            seen = self._events_seen.get(node.index, 0)
            for at, ev in node.events[seen:]:
                name = self.name(node)
                match ev:
                    case BecomeLeader(epoch=epoch):
                        what = f"{name} leads epoch {epoch}"
                    case LeaderFound(leader=view) if not view.is_self:
                        what = f"{name} follows {self.id_name(view.claim.leader)} (epoch {view.claim.epoch})"
                    case LeaderLost(claim=claim, reason=reason):
                        what = f"{name} lost {self.id_name(claim.leader)} (epoch {claim.epoch}): {reason}"
                    case SteppedDown(winner=winner):
                        what = f"{name} steps down for {self.id_name(winner.leader)} (epoch {winner.epoch})"
                    case _:
                        continue
                lines.append((at, node.index, what))
            self._events_seen[node.index] = len(node.events)
        for at, _, what in sorted(lines):
            self.out.append(f"{at:6.2f}s {what}")

    # ------------------------------------------------------------ running

    def run(self, seconds: float) -> None:
        end = self.sim.now + seconds
        while self.sim.now < end - 1e-9:
            self.sim.run_until(min(end, self.sim.now + MONITOR_S))
            self._discovery_events()
            self.agents.tick()

    def stabilize(self, limit_s: float) -> bool:
        end = self.sim.now + limit_s
        stable_since: float | None = None
        while self.sim.now < end - 1e-9:
            self.run(MONITOR_S)
            if self._one_round():
                stable_since = self.sim.now if stable_since is None else stable_since
                if self.sim.now - stable_since >= STABLE_S:
                    return True
            else:
                stable_since = None
        return False

    def _one_round(self) -> bool:
        """Every living agent runs one round whose members all run it (or waits as a spare)."""
        live = [a for a in self.agents.running() if a.node.alive and not a.node.frozen]
        running = [a for a in live if a.phase is Phase.RUNNING and a.round is not None]
        if not running or any(a not in running and not a.node.node.joining.parked for a in live):
            return False
        keys = {(a.round.epoch, a.round.number) for a in running}
        if len(keys) != 1:
            return False
        members = running[0].round.members
        by_id = {a.node_id: a for a in running}
        return all(m in by_id for m in members)

    # ------------------------------------------------------------ hosts

    def add(self, k: int) -> None:
        for _ in range(k):
            host = len(self.agents.by_host)
            node = self.sim.add_node(self.sim.now)
            self.host_of_id[node.core.node_id] = host
            self.agents.start(host, node, self.sim.now)

    def agent(self, arg: str) -> Agent:
        """Host ``arg``, or (``leader``) the host that leads now."""
        if arg == "leader":
            leading = [self.host(n) for n in self.sim.leaders()]
            if len(leading) != 1:
                raise TranscriptError(f"`leader` names one host; leading now: {leading}")
            arg = str(leading[0])
        try:
            return self.agents.by_host[int(arg)]
        except (KeyError, ValueError):
            raise TranscriptError(f"no host {arg!r}") from None

    def restart(self, agent: Agent) -> None:
        old = agent.node
        if old.alive:
            self.sim.kill(old)
            self.agents.exit(agent, "killed for the restart")
        node = self.sim.restart(old, self.sim.now, node_id=old.core.node_id)
        self.agents.start(agent.host, node, self.sim.now)
        self.say(f"{self.name(node)} starts again (incarnation {node.node.settings.incarnation})")

    def cut(self, spec: str, mode: str) -> None:
        sides = [[self.agent(h).node.addr for h in side.split(",")] for side in spec.split("|")]
        if len(sides) < 2:
            raise TranscriptError(f"a cut needs two sides: {spec!r}")
        pairs = [
            (a, b)
            for i, side in enumerate(sides)
            for a in side
            for j, other in enumerate(sides)
            if i != j
            for b in other
        ]
        self.cuts += 1
        self.sim.net.block(self.cuts, pairs, mode)

    def show(self) -> list[str]:
        lines = []
        for host, agent in sorted(self.agents.by_host.items()):
            node = agent.node
            if not node.alive:
                state = "dead"
            elif node.frozen:
                state = "frozen"
            else:
                role = node.core.role
                view = node.core.leader
                if role is Role.LEADING and view is not None:
                    state = f"leads epoch {view.claim.epoch}"
                elif role is Role.FOLLOWING and view is not None:
                    state = f"follows {self.id_name(view.claim.leader)} (epoch {view.claim.epoch})"
                else:
                    state = role.value
            rnd = agent.round
            where = f"round {rnd.number} (epoch {rnd.epoch})" if rnd is not None else "no round"
            if agent.phase is Phase.JOINING and node.alive and node.node.joining.parked:
                where += ", a spare"
            closed = (
                "; is_closed()"
                if node.alive and node.board is not None and node.board.diagnostics().closed
                else ""
            )
            lines.append(f"n{host}: {state}; {where}; agent {agent.phase.value}{closed}")
        return lines


# --------------------------------------------------------------------------- the file


def _seconds(arg: str) -> float:
    try:
        return float(arg.removesuffix("s"))
    except ValueError:
        raise TranscriptError(f"not a duration: {arg!r} (say 1.5s)") from None


def _options(args: list[str]) -> dict[str, str]:
    return {a.partition("=")[0]: a.partition("=")[2] for a in args}


class Runner:
    def __init__(self) -> None:
        self.world: World | None = None

    def _world(self) -> World:
        if self.world is None:
            raise TranscriptError("no job yet: start one with `start N`")
        return self.world

    def run(self, command: str) -> list[str]:
        words = command.split()
        verb, args = words[0], words[1:]
        if verb == "start":
            opts = _options(args[1:])
            n = int(args[0])
            self.world = World(
                n,
                min_nodes=int(opts.get("min", 2)),
                max_nodes=int(opts.get("max", n)),
                seed=int(opts.get("seed", 1)),
                secret="secret" in opts,
            )
            return []
        w = self._world()
        w.out = []
        if verb == "run":
            w.run(_seconds(args[0]))
        elif verb == "stabilize":
            limit = _seconds(args[0]) if args else 60.0
            if not w.stabilize(limit):
                w.say(f"not stable after {limit:g}s")
        elif verb == "add":
            w.add(int(args[0]) if args else 1)
        elif verb == "kill":
            w.sim.kill(w.agent(args[0]).node)
        elif verb == "poweroff":
            w.sim.power_off(w.agent(args[0]).node)
        elif verb == "freeze":
            w.sim.freeze(w.agent(args[0]).node)
        elif verb == "thaw":
            w.sim.thaw(w.agent(args[0]).node)
        elif verb == "restart":
            w.restart(w.agent(args[0]))
        elif verb == "cut":
            mode = {"drop": DROP, "reset": RESET, "fin": FIN}.get(args[1] if len(args) > 1 else "drop")
            if mode is None:
                raise TranscriptError(f"a cut drops, resets or closes (fin): {args[1]!r}")
            w.cut(args[0], mode)
        elif verb == "heal":
            w.sim.net.heal(w.sim.now)
        elif verb == "leave":
            w.agents.preempt(w.agent(args[0]))
        elif verb == "shutdown":
            w.agents.shut(w.agent(args[0]))
        elif verb == "finish":
            w.agents.finished = True
        elif verb == "print":
            return w.show()
        else:
            raise TranscriptError(f"unknown command {verb!r}")
        return w.out


def check(path: Path) -> str:
    """The transcript at ``path`` as it should read: each command's output as it runs now."""
    runner = Runner()
    out: list[str] = []
    block: list[str] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("#") or not line.strip():
            out.append(line)
            continue
        if i >= len(lines) or lines[i] != "----":
            raise TranscriptError(f"{path.name}:{i}: a command is followed by a line ----")
        i += 1
        while i < len(lines) and lines[i].strip():
            i += 1  # the expected output: replaced by what runs now
        try:
            block = runner.run(line)
        except (IndexError, ValueError) as exc:
            raise TranscriptError(f"{path.name}:{i}: {line!r}: {exc}") from None
        out += [line, "----", *block]
    return "\n".join(out) + "\n"


def rewrite_wanted() -> bool:
    return os.environ.get(REWRITE_ENV, "") not in ("", "0")
