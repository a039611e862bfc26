"""torch's elastic agent and mingle's handler around it, one per simulated host.

The agent that torchrun runs on each node calls the handler: ``next_rendezvous()`` to join,
then torch's rank exchange through the round's store, then, while its workers run,
``num_nodes_waiting()`` every monitor interval (a positive answer restarts the workers into a
new round), and at the end the exit barrier and ``shutdown()``; SIGTERM makes it leave at once.

``next_rendezvous()`` is the handler's own policy (``_agent.JoinFlow``), run here as the handler
runs it: its actions (ask the node, connect the round's store, probe the peers, watch the round
break, tell the node the store is unreachable) are carried out in simulated time, against the
processes of the round's members on the simulated network, and its answers read the node's
snapshot on the board (``Board.diagnostics``), as the handler reads them. What the handler
then hands torch (rank, world size, its store) goes through torch's rank exchange
(``_assign_worker_ranks``: every agent writes its role info, rank 0 assigns the ranks, every
agent reads its own) over ``_world`` and the store's rules (``AgentStore``), so that the world
each agent's workers start in is the one production would give them (``workers_started``).
What is modelled, not run: torch's agent loop, the sockets (a store or a probe port answers,
refuses, or stays silent, by the process behind it and the cuts between), and no health
check program (``CheckHealth`` passes; the swarm's ``unfit`` fault tells the node directly).

``Agents`` drives it one monitor step at a time; the unit tests, the transcripts
(``transcript``) and the fault swarm all run this one model; the swarm adds its bookkeeping by
overriding the hooks (``delivered``, ``workers_started``, ``round_ended``, ``noted``...).
"""

from __future__ import annotations

import enum
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from torch_mingle import _world
from torch_mingle._agent import (
    Action,
    Answered,
    AskJoin,
    Began,
    BreakSeen,
    CheckHealth,
    ConnectStore,
    Deliver,
    Event,
    ExitClean,
    Fail,
    HealthChecked,
    JoinFlow,
    Probed,
    ProbePeers,
    StoreFailed,
    StoreOpened,
    TellStoreUnreachable,
    Told,
    WatchBreak,
    nodes_waiting,
)
from torch_mingle._errors import StateError
from torch_mingle._joining import JOIN_GRACE_S
from torch_mingle._keys import RoundKey
from torch_mingle._ready import CloseRequested, StoreUnreachable, Ticket
from torch_mingle._record import assert_never
from torch_mingle._records import History, JobEnd
from torch_mingle._view import Diagnostics, Joined
from torch_mingle._world import ASSIGNED_RANKS_PREFIX, ROLE_INFO_PREFIX
from torch_mingle.testing.net import DROP, FIN
from torch_mingle.testing.sim import SimNode, Simulation

#: torch's agent looks at its workers (and asks ``num_nodes_waiting``) this often.
MONITOR_S = 0.1
#: The handler's defaults: each try at the round's store (``keep_alive_timeout``, at most
#: ``MAX_CONNECT_TIMEOUT_S``; the handler gives torch's client ``RESOLVER_ALLOWANCE_S`` more
#: once the port accepted, for its name lookup, and the simulator has no resolver), and the
#: data path probe (``data_path_timeout``).
STORE_TIMEOUT_S = 5.0
DATA_PATH_TIMEOUT_S = 5.0

#: What a connect or a store call to a process meets (``Agents.reach``).
OK, REFUSED, SILENT = "ok", "refused", "silent"


class Phase(enum.Enum):
    JOINING = "joining"  # in next_rendezvous()
    RUNNING = "running"  # its workers run a round (after torch's rank exchange)
    ARRIVING = "arriving"  # in the exit barrier of its last round
    SHUTTING = "shutting"  # in shutdown(): done, or failed for good
    LEAVING = "leaving"  # SIGTERM: it leaves the job at once
    EXITED = "exited"


class Stage(enum.Enum):
    """torch's rank exchange (``SimpleElasticAgent._assign_worker_ranks``), right after a join."""

    WRITE = "write its role info"
    ROLES = "read every member's role info"  # rank 0
    ASSIGN = "write the ranks it assigned"  # rank 0
    RANKS = "read its ranks"
    STARTED = "workers started"


@dataclass
class Exchange:
    """One agent's part of torch's rank exchange for the round ``key``, through its store."""

    key: RoundKey
    rank: int
    world_size: int
    #: The process that holds the round's store (its leader's), as the agent joined.
    store: SimNode | None
    role: bytes
    stage: Stage = Stage.WRITE
    #: The role infos rank 0 read, or stood in for.
    roles: list[bytes] = field(default_factory=list)
    #: It read stand-ins: the round broke before every member took its rank.
    stood_in: bool = False
    #: When a call on the store failed while the node did not say the round broke ...
    error_at: float | None = None
    #: ... how long the agent ran since, waiting for the node's word (``_world.ran_s``), and when
    #: it last looked.
    ran_s: float = 0.0
    looked_at: float = 0.0


@dataclass
class Agent:
    host: int
    node: SimNode
    phase: Phase = Phase.JOINING
    ticket: Ticket | None = None
    #: When the bound of the pending call (or action) started, and how long it is.
    since: float = 0.0
    bound_s: float = 0.0
    #: The round its workers run (the driver's record of it), None when they run none.
    round: Any = None
    #: The node's count of parks when the driver last looked (``Node.parks``).
    parks_seen: int = 0
    #: The handler's join flow, and the action of it under way (in ``next_rendezvous()``).
    flow: JoinFlow | None = None
    action: Action | None = None
    #: The processes of the joined round's members when the join was answered.
    procs: dict[int, SimNode] = field(default_factory=dict)
    #: What ``next_rendezvous()`` returned last (rank and world size), and the rank exchange.
    deliver: Deliver | None = None
    exchange: Exchange | None = None
    #: It ran a round of the job before (the handler's ``_round``).
    had_round: bool = False
    #: Its client of the round's store lost its connection (``Agents._watch_client``).
    client_lost: bool = False
    #: How many workers it runs (``--nproc_per_node``).
    local_world_size: int = 1

    @property
    def node_id(self) -> int:
        return self.node.core.node_id

    @property
    def diagnostics(self) -> Diagnostics:
        """The node's snapshot, as the handler reads it on the board."""
        assert self.node.board is not None  # noqa: S101 - every simulated node has one
        return self.node.board.diagnostics()

    @property
    def in_exchange(self) -> bool:
        return self.exchange is not None and self.exchange.stage is not Stage.STARTED


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
        store_timeout_s: float = STORE_TIMEOUT_S,
        data_path_timeout_s: float = DATA_PATH_TIMEOUT_S,
        local_world_size: int = 1,
    ) -> None:
        self.sim = sim
        self.join_timeout_s = join_timeout_s
        self.close_timeout_s = close_timeout_s
        self.leave_timeout_s = leave_timeout_s
        self.arrive_timeout_s = arrive_timeout_s
        self.store_timeout_s = store_timeout_s
        self.data_path_timeout_s = data_path_timeout_s
        self.local_world_size = local_world_size
        #: How long torch's rank exchange may wait for the others before the round must have
        #: broken (the node's detection) or completed: the join's own bound.
        self.exchange_bound_s = join_timeout_s
        self.agents: list[A] = []
        self.by_host: dict[int, A] = {}
        #: The contents of each round's store (by round key), on its leader's process.
        self.stores: dict[RoundKey, dict[str, bytes]] = defaultdict(dict)
        #: The work is done: a running agent enters the exit barrier of its round.
        self.finished = False
        #: Some agent called ``shutdown()``: torch's contract closes the job for every node.
        self.closed = False
        #: When an agent first failed (and closed the job as failed on its way out), and when
        #: one whose workers had finished first shut down (torch's contract: the job is done).
        self.failed_at: float | None = None
        self.finished_at: float | None = None
        #: The members of each round whose workers started in it (by round key).
        self.started_in: dict[RoundKey, set[int]] = defaultdict(set)
        #: Whether each node's agent, the last time it shut down, failed (by node id).
        self.shut_failed: dict[int, bool] = {}

    # ------------------------------------------------------------ the hosts

    def start(self, host: int, node: SimNode, at: float) -> A:
        """The agent of ``host`` starts on ``node`` at ``at`` and joins (a restart replaces the last)."""
        agent = self.agent_class(host, node, since=at, local_world_size=self.local_world_size)
        self.agents.append(agent)
        self.by_host[host] = agent
        self._next_rendezvous(agent)
        return agent

    def running(self) -> Iterable[A]:
        return (a for a in self.by_host.values() if a.phase is not Phase.EXITED)

    # ------------------------------------------------------------ torch's agent

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
                if isinstance(agent.action, AskJoin) and (
                    node.node.joining.parked or node.node.joining.parks != agent.parks_seen
                ):
                    # It waits for the job, not for a timeout (docs/faults.md): its wait restarts
                    # when it is no longer parked, also after a park shorter than a monitor step.
                    agent.parks_seen, agent.since = node.node.joining.parks, now
                event = self._outcome(agent)
                if event is not None:
                    self._carry_on(agent, event)
            elif agent.phase is Phase.RUNNING:
                if agent.in_exchange:
                    self._exchange(agent)
                elif self.finished:
                    self.arrive_if_running(agent)  # (a round that formed after the work was done)
                elif self._nodes_waiting(agent) > 0:
                    self.rejoin(agent)
            elif ticket is not None and ticket.done:
                if agent.phase is Phase.ARRIVING:
                    self.shut(agent)
                else:  # shut down, or left: the process exits
                    self.exit(agent, agent.phase.value, kill=True)

    def _nodes_waiting(self, agent: A) -> int:
        """``num_nodes_waiting()``, as the handler answers it from the node's snapshot."""
        key = History.of(agent.deliver.joined.round).key if agent.deliver is not None else None
        return nodes_waiting(key, False, agent.diagnostics)

    def rejoin(self, agent: A) -> None:
        """Its workers restart: it asks for the next round."""
        self.noted(agent, "joins again")
        self._end_round(agent)
        agent.phase = Phase.JOINING
        self._next_rendezvous(agent)

    def arrive_if_running(self, agent: A) -> None:
        """The work is done: an agent whose workers run a round enters its exit barrier."""
        number = self.round_number(agent)
        if self.workers_ran(agent) and number is not None and agent.node.alive:
            bound_s = self.arrive_timeout_s
            self.call(agent, Phase.ARRIVING, self.sim.arrive(agent.node, number, bound_s), bound_s)

    def shut(self, agent: A, *, failed: str = "") -> None:
        """``shutdown()``: it is done (or failed for good: ``failed`` says why), and closes the job."""
        why = f"it shut down after: {failed}" if failed else "finished"
        if failed and self.failed_at is None:
            self.failed_at = self.sim.now
        if not failed and self.finished_at is None and self.workers_ran(agent):
            self.finished_at = self.sim.now  # its workers finished their work
        self.shut_failed[agent.node_id] = bool(failed)
        ticket = self.sim.leave(agent.node, self.close_timeout_s, why=why, failed=bool(failed))
        self.call(agent, Phase.SHUTTING, ticket, self.close_timeout_s)

    def workers_ran(self, agent: A) -> bool:
        """Whether the agent's workers run (or ran to the end) their round: they started, and so
        did every other member's (a process group forms only with all of them)."""
        return agent.phase is Phase.ARRIVING or (
            agent.phase is Phase.RUNNING and not agent.in_exchange and not self.waits_for_peers(agent)
        )

    def waits_for_peers(self, agent: A) -> bool:
        """Its workers started, and wait for a member's that never started in that round: they
        cannot train, and only a restart (``num_nodes_waiting() > 0``) ends them."""
        ex = agent.exchange
        if agent.phase is not Phase.RUNNING or ex is None or ex.stage is not Stage.STARTED:
            return False
        members = agent.deliver.joined.round.members if agent.deliver is not None else ()
        return not self.started_in[ex.key] >= set(members)

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
        agent.flow = agent.action = None
        agent.phase, agent.ticket, agent.since, agent.bound_s = phase, ticket, self.sim.now, bound_s

    def exit(self, agent: A, why: str, *, kill: bool = False) -> None:
        self.noted(agent, f"exits ({why})")
        self._end_round(agent)
        agent.phase, agent.ticket, agent.flow, agent.action = Phase.EXITED, None, None, None
        if kill and agent.node.alive:
            self.sim.kill(agent.node)  # the process exits: its kernel closes its sockets

    def _end_round(self, agent: A) -> None:
        rnd, agent.round = agent.round, None
        agent.exchange = None
        if rnd is not None:
            self.round_ended(agent, rnd)

    # ------------------------------------------------------------ the handler's next_rendezvous()

    def _next_rendezvous(self, agent: A) -> None:
        agent.flow = JoinFlow(
            agent.node_id,
            self.sim.job,
            join_timeout_s=self.join_timeout_s,
            store_timeout_s=self.store_timeout_s,
            had_round=agent.had_round,
        )
        self._carry_on(agent, Began(closed=False))

    def _carry_on(self, agent: A, event: Event | None) -> None:
        """Step the flow with what its last action came to, and start what it says next, until
        an action takes simulated time."""
        while event is not None and agent.flow is not None:
            action = agent.flow.step(event, self.sim.now)
            agent.action = action
            event = self._begin(agent, action)

    def _begin(self, agent: A, action: Action) -> Event | None:
        """Start ``action`` (its bound too); the event it came to if that is known at once."""
        node, now = agent.node, self.sim.now
        agent.since, agent.bound_s = now, 0.0
        match action:
            case CheckHealth():
                return HealthChecked(ok=True)
            case AskJoin(timeout_s=timeout_s):
                agent.bound_s = timeout_s + JOIN_GRACE_S
                agent.ticket = self.sim.join(node, timeout_s)
                return None
            case ConnectStore(timeout_s=timeout_s):
                agent.bound_s = timeout_s
                return self._outcome(agent)
            case TellStoreUnreachable(claim=claim, why=why):
                self.noted(agent, f"store unreachable: {why}")
                self.sim.step_node(node, [StoreUnreachable(claim, why)])
                return Told()
            case ProbePeers():
                agent.bound_s = self.data_path_timeout_s
                return self._outcome(agent)
            case WatchBreak(grace_s=grace_s):
                agent.bound_s = grace_s
                return self._outcome(agent)
            case Deliver():
                self._delivered(agent, action)
                return None
            case Fail(why=why, close=close):
                why = why or "the data path failed"
                self.noted(agent, f"fails: {action.kind.value}: {why}")
                if close:
                    self.sim.step_node(node, [CloseRequested(JobEnd(why, stops_round=True, failed=True))])
                self.failed(agent, action)
                self.shut(agent, failed=why)  # torch's launcher calls shutdown() on the way out
                return None
            case ExitClean(why=why):
                self.noted(agent, f"exits 0: {why}")
                self.exited_clean(agent, action)
                self.shut(agent)  # SystemExit(0): shutdown() still runs on the way out
                return None
            case _:
                assert_never(action)

    def _outcome(self, agent: A) -> Event | None:
        """What the pending action came to by now, or None while it still waits."""
        action, flow, now = agent.action, agent.flow, self.sim.now
        if flow is None:
            return None
        over = now >= agent.since + agent.bound_s - 1e-9
        match action:
            case AskJoin():
                ticket = agent.ticket
                if ticket is None or not ticket.done:
                    return None
                if isinstance(ticket.result, Joined):
                    agent.procs = self._processes(ticket.result.round.members)
                return Answered(ticket.result, error=str(ticket.error) if ticket.error is not None else "")
            case ConnectStore():
                # torch's client retries a refused port until its timeout; the node cuts the
                # connect once it knows the leader is lost (then the round broke).
                joined = flow.current()
                reach = self.reach(agent.node, agent.procs.get(joined.claim.leader))
                if reach == OK:
                    agent.client_lost = False
                    return StoreOpened()
                broke = self._broke(agent)
                if broke or over:
                    return StoreFailed(
                        f"the round's store {reach if reach == REFUSED else 'did not answer'}", broke
                    )
                return None
            case ProbePeers(peers=peers):
                # A connect refused or unanswered is tried again until the deadline (``probe``).
                self._watch_client(agent, agent.procs.get(flow.current().claim.leader))
                members = flow.current().round.members
                reaches = [self.reach(agent.node, agent.procs.get(members[p]), kernel=True) for p in peers]
                if all(r == OK for r in reaches) or over:
                    return Probed(all(r == OK for r in reaches), agent.diagnostics.failure)
                return None
            case WatchBreak(key=key):
                self._watch_client(agent, agent.procs.get(flow.current().claim.leader))
                diag = agent.diagnostics
                if diag.round_broke(key) or over:
                    return BreakSeen(diag.round_broke(key), diag.failure, closed=diag.closed)
                return None
        return None

    def _broke(self, agent: A) -> bool:
        assert agent.flow is not None  # noqa: S101
        return agent.diagnostics.round_broke(History.of(agent.flow.current().round).key)

    def _delivered(self, agent: A, deliver: Deliver) -> None:
        """``next_rendezvous()`` returned: torch's agent exchanges ranks, then starts its workers."""
        joined = deliver.joined
        agent.phase, agent.ticket, agent.action, agent.flow = Phase.RUNNING, None, None, None
        agent.deliver, agent.had_round = deliver, True
        role = {"role": "default", "rank": deliver.rank, "local_world_size": agent.local_world_size}
        agent.exchange = Exchange(
            History.of(joined.round).key,
            deliver.rank,
            deliver.world_size,
            agent.procs.get(joined.claim.leader),
            json.dumps(role).encode(),
        )
        agent.since, agent.bound_s = self.sim.now, self.exchange_bound_s
        self.delivered(agent, joined)
        self._exchange(agent)

    # ------------------------------------------------------------ torch's rank exchange

    def _exchange(self, agent: A) -> None:
        """As far as torch's rank exchange gets now, through ``AgentStore``'s rules: a read waits
        until its keys are there, or stands in once the node knows the round broke; a store
        that fails is ignored for a round that broke, and fails the agent otherwise."""
        ex = agent.exchange
        assert ex is not None  # noqa: S101
        store = self.stores[ex.key]
        size = ex.world_size
        while agent.phase is Phase.RUNNING and ex.stage is not Stage.STARTED:
            self._watch_client(agent, ex.store)
            reach, broke = self.reach(agent.node, ex.store), agent.diagnostics.round_broke(ex.key)
            if ex.error_at is not None or agent.client_lost:
                reach = REFUSED  # a client whose connection failed, or was closed, stays failed
            if ex.stage in (Stage.WRITE, Stage.ASSIGN):  # (``AgentStore._unless_round_over``)
                if reach == OK or (reach == REFUSED and broke) or (reach == SILENT and broke):
                    if reach == OK and ex.stage is Stage.WRITE:
                        store[f"{ROLE_INFO_PREFIX}{ex.rank}"] = ex.role
                    elif reach == OK:
                        store.update(_assign(ex.roles))
                    ex.stage = Stage.ROLES if ex.stage is Stage.WRITE and ex.rank == 0 else Stage.RANKS
                    continue
                if reach == REFUSED:
                    self._store_failed(agent, ex)
                return  # silent: the call blocks until the node cuts it (the round broke)
            keys = (
                [f"{ROLE_INFO_PREFIX}{r}" for r in range(size)]
                if ex.stage is Stage.ROLES
                else [f"{ASSIGNED_RANKS_PREFIX}{ex.rank}"]
            )  # (``AgentStore._ranks_read``)
            if broke:
                values = [_world.stand_in(k, ex.role, size) for k in keys]
                ex.stood_in = True
            elif reach == OK and all(k in store for k in keys):
                values = [store[k] for k in keys]
            elif reach == REFUSED:
                self._store_failed(agent, ex)
                return
            else:
                return  # not there yet, or the store is silent: it waits in slices
            try:
                values = [_world.checked(k, v, ex.role, size) for k, v in zip(keys, values, strict=True)]
            except StateError as exc:
                self.refused(agent, str(exc))
                self.shut(agent, failed=f"its agent failed: {exc}")
                return
            if ex.stage is Stage.ROLES:
                ex.roles, ex.stage = values, Stage.ASSIGN
                continue
            base, world, _, _ = json.loads(values[0])
            ex.stage = Stage.STARTED
            self.started_in[ex.key].add(agent.node_id)
            agent.since, agent.bound_s = self.sim.now, self.exchange_bound_s  # (``waits_for_peers``)
            self.workers_started(agent, int(base), int(world))

    def _store_failed(self, agent: A, ex: Exchange) -> None:
        """The round's store refused, and the node did not say the round broke within
        ``_world.store_error_wait_s``: the error reaches torch's rank exchange, and the agent
        fails (``AgentStore._broke_after_error``)."""
        now = self.sim.now
        if ex.error_at is None:
            ex.error_at, ex.looked_at = now, now
        ex.ran_s, ex.looked_at = ex.ran_s + _world.ran_s(now - ex.looked_at), now
        if ex.ran_s < _world.store_error_wait_s(self.sim.timing.leader_timeout_s):
            return  # it waits for the node's word (a freeze meanwhile does not count)
        why = f"the round's store failed in torch's rank exchange ({ex.stage.value})"
        self.noted(agent, f"fails: {why}")
        self.exchange_failed(agent, why)
        self.shut(agent, failed=f"its agent failed: {why}")

    # ------------------------------------------------------------ the simulated sockets

    def _watch_client(self, agent: A, store: SimNode | None) -> None:
        """The agent's client of the round's store loses its connection, idle or not, when the
        store's process dies or a proxy closes the connections that cross a cut (``FIN``); a
        cut that drops, or resets only what crosses it, leaves an idle connection be."""
        if store is None or store is agent.node or agent.client_lost:
            return
        net = self.sim.net
        died = not store.alive and store.addr not in net.dark
        agent.client_lost = died or FIN in (
            net.cut_mode(agent.node.addr, store.addr),
            net.cut_mode(store.addr, agent.node.addr),
        )

    def _processes(self, members: Iterable[int]) -> dict[int, SimNode]:
        """The newest process of each member id, now (dead or alive: ``reach`` tells a host that
        lost power from a process that died)."""
        wanted = set(members)
        return {n.core.node_id: n for n in self.sim.nodes if n.started and n.core.node_id in wanted}

    def reach(self, src: SimNode, dst: SimNode | None, *, kernel: bool = False) -> str:
        """What a connect, or a call on a connection, from ``src`` to the process ``dst`` meets:
        ``OK``, ``REFUSED`` (its process is gone, or a reset or a proxy's close across a cut) or
        ``SILENT`` (its host is off, a cut that drops, or a frozen process that must answer;
        ``kernel``: only the kernel answers, as for a probe's handshake)."""
        if dst is src:
            return OK
        net = self.sim.net
        if dst is None or not dst.alive:
            return SILENT if dst is not None and dst.addr in net.dark else REFUSED
        mode = net.cut_mode(src.addr, dst.addr) or net.cut_mode(dst.addr, src.addr)
        if mode == DROP:
            return SILENT
        if mode is not None:
            return REFUSED
        return SILENT if dst.frozen and not kernel else OK

    # ------------------------------------------------------------ hooks (the swarm overrides them)

    def delivered(self, agent: A, joined: Joined) -> None:
        """A round reached the agent: ``next_rendezvous()`` returned it (``agent.deliver``)."""
        agent.round = joined.round

    def workers_started(self, agent: A, base: int, world: int) -> None:
        """torch's rank exchange gave the agent's workers ranks ``base``.. of ``world``."""

    def failed(self, agent: A, fail: Fail) -> None:
        """``next_rendezvous()`` failed (torch's launcher shuts the handler down next)."""

    def exited_clean(self, agent: A, clean: ExitClean) -> None:
        """``next_rendezvous()`` ends the agent with exit status 0 (a spare the job never needed)."""

    def exchange_failed(self, agent: A, why: str) -> None:
        """torch's rank exchange failed on the round's store (the agent fails next)."""

    def refused(self, agent: A, why: str) -> None:
        """``_world.checked`` refused the ranks torch's exchange gave (a bug of torch_mingle)."""

    def round_number(self, agent: A) -> int | None:
        """The number of the round the agent runs (for its exit barrier)."""
        return agent.round.number if agent.round is not None else None

    def round_ended(self, agent: A, rnd: Any) -> None:
        """The agent's workers stopped running ``rnd``."""

    def noted(self, agent: A, what: str) -> None:
        """Something the agent did, for a trace."""


def _assign(roles: list[bytes]) -> dict[str, bytes]:
    """The ranks torch's rank 0 assigns from every member's role info (``_assign_worker_ranks``)."""
    infos = [json.loads(r) for r in roles]
    sizes: dict[str, int] = defaultdict(int)
    for info in infos:
        sizes[info["role"]] += int(info["local_world_size"])
    total, base = sum(sizes.values()), 0
    role_base: dict[str, int] = defaultdict(int)
    out = {}
    for i, info in enumerate(infos):
        role, local = info["role"], int(info["local_world_size"])
        out[f"{ASSIGNED_RANKS_PREFIX}{i}"] = json.dumps([base, total, role_base[role], sizes[role]]).encode()
        base += local
        role_base[role] += local
    return out


class TorchAgents(Agents[Agent]):
    """The agents, with nothing kept beyond what torch's agent keeps."""

    agent_class = Agent
