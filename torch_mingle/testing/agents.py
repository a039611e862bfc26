"""torch's elastic agent, reduced to what its rendezvous sees: one per simulated host.

The agent that torchrun runs on each node calls the handler: ``next_rendezvous()`` to join,
then, while its workers run, ``num_nodes_waiting()`` every monitor interval (a positive
answer restarts the workers into a new round), and at the end the exit barrier and
``shutdown()``; SIGTERM makes it leave at once. ``Agents`` drives that policy against a
``Simulation`` (``sim.join``, ``sim.arrive``, ``sim.leave``, ``sim.preempt``, the same
requests the handler makes of its ``Node``), one monitor step at a time. The unit tests, the
transcripts (``transcript``) and the fault swarm all run this one model; the swarm adds its
bookkeeping by overriding the hooks (``delivered``, ``round_ended``, ``noted``...).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from torch_mingle._joining import JOIN_GRACE_S
from torch_mingle._ready import Ticket
from torch_mingle._view import JobOver, Joined, TimedOut
from torch_mingle.testing.sim import SimNode, Simulation

#: torch's agent looks at its workers (and asks ``num_nodes_waiting``) this often.
MONITOR_S = 0.1


class Phase(enum.Enum):
    JOINING = "joining"  # in next_rendezvous()
    RUNNING = "running"  # its workers train in a round
    ARRIVING = "arriving"  # in the exit barrier of its last round
    SHUTTING = "shutting"  # in shutdown(): done, or failed for good
    LEAVING = "leaving"  # SIGTERM: it leaves the job at once
    EXITED = "exited"


@dataclass
class Agent:
    host: int
    node: SimNode
    phase: Phase = Phase.JOINING
    ticket: Ticket | None = None
    #: When the bound of the pending call started, and how long it is.
    since: float = 0.0
    bound_s: float = 0.0
    #: The round its workers run (the driver's record of it), None when they run none.
    round: Any = None
    #: The node's count of parks when the driver last looked (``Node.parks``).
    parks_seen: int = 0

    @property
    def node_id(self) -> int:
        return self.node.core.node_id


A = TypeVar("A", bound=Agent)


class Agents(Generic[A]):
    """The agents of a simulated job, each driven by torch's policy one monitor step at a time."""

    #: What ``start`` makes: ``Agent``, or a subclass that keeps more per agent.
    agent_class: type[A]

    def __init__(
        self,
        sim: Simulation,
        *,
        join_timeout_s: float = 60.0,
        close_timeout_s: float = 5.0,
        leave_timeout_s: float = 15.0,
        arrive_timeout_s: float = 5.0,
    ) -> None:
        self.sim = sim
        self.join_timeout_s = join_timeout_s
        self.close_timeout_s = close_timeout_s
        self.leave_timeout_s = leave_timeout_s
        self.arrive_timeout_s = arrive_timeout_s
        self.agents: list[A] = []
        self.by_host: dict[int, A] = {}
        #: The work is done: a running agent enters the exit barrier of its round.
        self.finished = False
        #: Some agent called ``shutdown()``: torch's contract closes the job for every node.
        self.closed = False

    # ------------------------------------------------------------ the hosts

    def start(self, host: int, node: SimNode, at: float) -> A:
        """The agent of ``host`` starts on ``node`` at ``at`` and joins (a restart replaces the last)."""
        agent = self.agent_class(host, node, since=at, bound_s=self.join_timeout_s + JOIN_GRACE_S)
        agent.ticket = self.sim.join(node, self.join_timeout_s)
        self.agents.append(agent)
        self.by_host[host] = agent
        return agent

    def running(self) -> Iterable[A]:
        return (a for a in self.by_host.values() if a.phase is not Phase.EXITED)

    # ------------------------------------------------------------ the policy

    def run_until(self, t: float) -> None:
        """Run the simulation to ``t``, the agents acting at each monitor step."""
        while self.sim.now < t:
            self.sim.run_until(min(t, self.sim.now + MONITOR_S))
            self.tick()

    def tick(self) -> None:
        now = self.sim.now
        for agent in self.agents:
            node = agent.node
            if agent.phase is Phase.EXITED or not node.started:
                continue
            if not node.alive:
                self.exit(agent, "died")
                continue
            if node.frozen:
                continue
            ticket = agent.ticket
            if agent.phase is Phase.JOINING:
                if node.node.joining.parked or node.node.joining.parks != agent.parks_seen:
                    # It waits for the job, not for a timeout (docs/faults.md): its wait restarts
                    # when it is no longer parked, also after a park shorter than a monitor step.
                    agent.parks_seen, agent.since = node.node.joining.parks, now
                if ticket is not None and ticket.done:
                    self._joined(agent, ticket)
            elif agent.phase is Phase.RUNNING:
                if self.finished:
                    self.arrive_if_running(agent)  # (a round that formed after the work was done)
                elif node.node.nodes_waiting(now) > 0:
                    self.rejoin(agent)
            elif ticket is not None and ticket.done:
                if agent.phase is Phase.ARRIVING:
                    self.call(
                        agent,
                        Phase.SHUTTING,
                        self.sim.leave(node, self.close_timeout_s),
                        self.close_timeout_s,
                    )
                else:  # shut down, or left: the process exits
                    self.exit(agent, agent.phase.value, kill=True)

    def _joined(self, agent: A, ticket: Ticket) -> None:
        result = ticket.result
        if ticket.error is not None:
            self.rejoin(agent)  # superseded: join again
        elif isinstance(result, Joined):
            self.delivered(agent, result)
            agent.phase, agent.ticket = Phase.RUNNING, None
        elif isinstance(result, TimedOut | JobOver):
            # torch's launcher shuts the handler down when the agent fails (that closes the
            # job for every node), and also after a closed rendezvous.
            self.shut(agent)
        else:
            self.unanswered(agent, result)

    def rejoin(self, agent: A) -> None:
        """Its workers restart: it asks for the next round."""
        self.noted(agent, "joins again")
        self._end_round(agent)
        agent.phase = Phase.JOINING
        agent.since, agent.bound_s = self.sim.now, self.join_timeout_s + JOIN_GRACE_S
        agent.ticket = self.sim.join(agent.node, self.join_timeout_s)

    def arrive_if_running(self, agent: A) -> None:
        """The work is done: an agent that runs a round enters its exit barrier."""
        number = self.round_number(agent)
        if agent.phase is Phase.RUNNING and number is not None and agent.node.alive:
            bound_s = self.arrive_timeout_s
            self.call(agent, Phase.ARRIVING, self.sim.arrive(agent.node, number, bound_s), bound_s)

    def shut(self, agent: A) -> None:
        """``shutdown()``: it is done (or failed for good), and closes the job."""
        self.call(
            agent, Phase.SHUTTING, self.sim.leave(agent.node, self.close_timeout_s), self.close_timeout_s
        )

    def preempt(self, agent: A) -> None:
        """SIGTERM: it leaves the job at once."""
        self.call(
            agent, Phase.LEAVING, self.sim.preempt(agent.node, self.leave_timeout_s), self.leave_timeout_s
        )

    def call(self, agent: A, phase: Phase, ticket: Ticket, bound_s: float) -> None:
        self.noted(agent, phase.value)
        if phase is Phase.SHUTTING:
            self.closed = True
        self._end_round(agent)
        agent.phase, agent.ticket, agent.since, agent.bound_s = phase, ticket, self.sim.now, bound_s

    def exit(self, agent: A, why: str, *, kill: bool = False) -> None:
        self.noted(agent, f"exits ({why})")
        self._end_round(agent)
        agent.phase, agent.ticket = Phase.EXITED, None
        if kill and agent.node.alive:
            self.sim.kill(agent.node)  # the process exits: its kernel closes its sockets

    def _end_round(self, agent: A) -> None:
        rnd, agent.round = agent.round, None
        if rnd is not None:
            self.round_ended(agent, rnd)

    # ------------------------------------------------------------ hooks (the swarm overrides them)

    def delivered(self, agent: A, joined: Joined) -> None:
        """A round reached the agent: its workers run it."""
        agent.round = joined.round

    def round_number(self, agent: A) -> int | None:
        """The number of the round the agent runs (for its exit barrier)."""
        return agent.round.number if agent.round is not None else None

    def round_ended(self, agent: A, rnd: Any) -> None:
        """The agent's workers stopped running ``rnd``."""

    def noted(self, agent: A, what: str) -> None:
        """Something the agent did, for a trace."""

    def unanswered(self, agent: A, result: object) -> None:
        """A join resolved with something that is no answer: a bug of the node."""
        raise AssertionError(f"host {agent.host}: join answered {result!r}")


class TorchAgents(Agents[Agent]):
    """The agents, with nothing kept beyond what torch's agent keeps."""

    agent_class = Agent
