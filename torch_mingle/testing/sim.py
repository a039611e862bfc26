"""Many ``Node``s on an ``InMemoryNetwork`` with a fake clock: the code that ships, simulated.

Every simulated node is the production ``_node.Node`` (discovery core, leader's term,
follower's session) with a ``SimNet`` in place of the real loop. Used by the unit tests
(elections, rounds and failover under loss, duplication, delay, partitions, deaths and
freezes) and by the benchmarks (elections and rendezvous of thousands of nodes).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch_mingle._ballot import NodeState
from torch_mingle._board import Board
from torch_mingle._claims import Dest, Event, Role, Timing
from torch_mingle._evidence import Evidence
from torch_mingle._frames import from_leader_stream, from_node
from torch_mingle._jobs import Job, OpenStore
from torch_mingle._node import Node
from torch_mingle._protocol import Discovery
from torch_mingle._ready import (
    ArriveRequested,
    Connected,
    ConnectionAccepted,
    ConnectionClosed,
    DatagramReceived,
    FramesReceived,
    Input,
    JoinRequested,
    LeaveRequested,
    ShutdownRequested,
    Started,
    StateNotRecorded,
    Ticket,
    TimerFired,
    WorkDone,
    apply,
)
from torch_mingle._record import field, record
from torch_mingle._records import JobEnd
from torch_mingle._settings import Beats, NodeSettings, RoundRules
from torch_mingle._view import Diagnostics
from torch_mingle._wire import Codec, Datagram, FrameReader, Invalid
from torch_mingle.testing.net import Delivery, InMemoryNetwork, RouteHook

STORE_OPEN_S = 0.002


class _SharedDecodeCodec(Codec):
    """A keyless codec that decodes each multicast datagram once for all the nodes receiving it.

    The simulation hands the same ``bytes`` object to every receiver; decoding it N times is
    where an N-node simulation spends its time. Only used without a key (no replay state).
    """

    def __init__(self, memo: dict[int, tuple[bytes, Datagram | Invalid]]) -> None:
        super().__init__(None)
        self._memo = memo

    def decode(self, data: bytes, wall_ms: int | None = None) -> Datagram | Invalid:
        hit = self._memo.get(id(data))
        if hit is not None and hit[0] is data:
            return hit[1]
        result = super().decode(data, wall_ms)
        self._memo[id(data)] = (data, result)
        return result


class SimNet:
    """The ``Net`` of one simulated node: everything goes through the shared in-memory network."""

    def __init__(self, sim: Simulation, node: SimNode) -> None:
        self.sim = sim
        self.owner = node
        self.readers: dict[int, FrameReader] = {}
        #: Every stream end this process opened or accepted (a restarted process on the same
        #: host never reads its predecessor's).
        self.ends: set[int] = set()
        #: The node's ids of the connections it opened, and the network's ends of them (the ids
        #: of those it accepted are the ends themselves).
        self.end_of: dict[int, int] = {}
        self.conn_of: dict[int, int] = {}
        self.cuts: list[tuple[str, tuple[int, ...], bool, str | None]] = []

    @property
    def _now(self) -> float:
        return self.sim.now

    def send_datagram(self, data: bytes, dest: Dest) -> None:
        self.sim.net.send(self.owner.addr, data, dest, self._now)

    def listen(self, ip: str) -> int:
        self.sim.net.unlisten(self.owner.addr)
        return self.sim.net.listen(self.owner.addr, self.owner.addr[0])

    def stop_listening(self) -> None:
        self.sim.net.unlisten(self.owner.addr)

    def connect(self, conn: int, ip: str, port: int) -> None:
        end = self.sim.net.connect(self.owner.addr, ip, port, self._now)
        self.readers[end] = FrameReader(from_leader_stream)
        self.ends.add(end)
        self.end_of[conn], self.conn_of[end] = end, conn

    def send(self, conn: int, data: bytes) -> None:
        self.sim.net.stream_send(self.end_of.get(conn, conn), data, self._now)

    def close(self, conn: int) -> None:
        end = self.end_of.pop(conn, conn)
        self.conn_of.pop(end, None)
        self.readers.pop(end, None)
        self.sim.net.stream_close(end, self._now)

    def submit(self, job: Job, tag: int) -> None:
        result = self.sim.next_port() if isinstance(job, OpenStore) else None
        self.sim.later(
            STORE_OPEN_S, self.owner, lambda now: self.sim.step_node(self.owner, [WorkDone(job, tag, result)])
        )

    def abort_connections_to(self, ip: str, ports: Sequence[int], *, ended: bool = False) -> None:
        # What the agent, woken by this cut, would read on the board at that moment.
        board = self.owner.board
        trouble = board.diagnostics().trouble if board is not None else None
        self.cuts.append((ip, tuple(ports), ended, trouble))

    def local_ip_towards(self, ip: str) -> str:
        return str(self.owner.addr[0])

    def discovery_port_towards(self, ip: str) -> int:
        return self.owner.addr[1]

    def describe(self) -> str:
        return f"simulated interface {self.owner.addr[0]}"

    def persist(self, state: NodeState) -> bool:
        """The node's state file: kept per node id, for a new process of it (``Simulation.restart``)."""
        self.sim.saved[self.owner.node.settings.node_id] = state
        return True


@record(frozen=False)
class SimNode:
    index: int
    addr: tuple[str, int]
    node: Node
    start_at: float
    net: SimNet | None = None
    #: What the agent's thread reads of the node (``_board``).
    board: Board | None = None
    #: Its wall clock, ahead of the simulation's (``Simulation.step_clock``).
    wall_offset_s: float = 1.7e9
    started: bool = False
    alive: bool = True
    frozen: bool = False
    held: list[Delivery] = field(default_factory=list)
    events: list[tuple[float, Event]] = field(default_factory=list)
    timer_queued: float | None = None
    #: The process's ticket ids, from 1 as in the handler (``handler._ticket_ids``): a restarted
    #: process on the host numbers its calls from 1 again, as a real one does.
    tickets: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def core(self) -> Discovery:
        return self.node.core


class Simulation:
    """A job of ``n`` nodes starting at random times in ``[0, start_spread_s]``."""

    def __init__(
        self,
        n: int,
        *,
        seed: int = 0,
        job: str = "sim",
        start_spread_s: float = 0.0,
        drop: float = 0.0,
        duplicate: float = 0.0,
        latency_s: tuple[float, float] = (0.0002, 0.002),
        timing: Timing | None = None,
        route_hook: RouteHook | None = None,
        key: bytes | None = None,
        min_nodes: int = 1,
        max_nodes: int | None = None,
        last_call_timeout_s: float = 1.0,
        rejoin_delay_s: float = 30.0,
        expect_all: bool = False,
        quorum: bool = True,
    ) -> None:
        self.rng = random.Random(seed)
        self.quorum = quorum
        self.expect_all = expect_all
        self.job = job
        self.timing = timing or Timing()
        self.key = key
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes or max(n, min_nodes)
        self.last_call_timeout_s = last_call_timeout_s
        self.rejoin_delay_s = rejoin_delay_s
        self.net = InMemoryNetwork(
            seed=self.rng.getrandbits(32),
            latency_s=latency_s,
            drop=drop,
            duplicate=duplicate,
            route_hook=route_hook,
        )
        self.now = 0.0
        self.nodes: list[SimNode] = []
        self._by_addr: dict[object, SimNode] = {}
        self._heap: list[tuple[float, int, int, Any]] = []  # (time, seq, node index, action)
        self._seq = 0
        self._ports = itertools.count(50000)
        self._decode_memo: dict[int, tuple[bytes, Datagram | Invalid]] = {}
        self._observers: dict[object, Any] = {}
        #: Called with each node after every step of it (the swarm checks its leader's book).
        self.after_step: Callable[[SimNode], None] | None = None
        #: What each delivery handed in carries of its sender's knowledge, until read (``_observer``).
        self._knows: dict[int, object] = {}
        #: What each process (by index) heard of, transitively (``track_knowledge``); None: off.
        self.knowledge: dict[int, frozenset[object]] | None = None
        #: Each node's state file, by node id (what a restart under the same id reads back).
        self.saved: dict[int, NodeState] = {}
        for _ in range(n):
            self.add_node(self.rng.uniform(0.0, start_spread_s))

    def add_node(
        self,
        start_at: float,
        *,
        job: str | None = None,
        node_id: int | None = None,
        addr: tuple[str, int] | None = None,
        place: str = "",
        incarnation: int = 1,
    ) -> SimNode:
        """A node starting at ``start_at``; ``addr``: a host's address that an earlier process had
        (a restart on the same host); ``place``: where it sorts in rank order; ``incarnation``:
        which process of its node id it is (``_identity``)."""
        index = len(self.nodes)
        node_id = node_id or self.rng.getrandbits(64) or 1
        addr = addr or (f"10.{index // 65536}.{index // 256 % 256}.{index % 256}", 29477)
        codec = Codec(self.key) if self.key is not None else _SharedDecodeCodec(self._decode_memo)
        core = Discovery(
            job or self.job,
            node_id,
            timing=self.timing,
            codec=codec,
            # Each process draws its own nonces, as production's (seeded from the OS) do: a
            # restarted process that repeated its predecessor's would have its datagrams dropped
            # as replays by every node that heard the old one. The first keeps the seed it had.
            rng=random.Random(node_id if incarnation == 1 else (node_id << 32) | incarnation),
            wall_offset_s=1.7e9,
            expected_nodes=self.max_nodes if self.expect_all else 0,
        )
        t = self.timing
        settings = NodeSettings(
            job=job or self.job, node_id=node_id,
            rules=RoundRules(self.min_nodes, self.max_nodes, self.last_call_timeout_s, self.rejoin_delay_s,
                             quorum=self.quorum),
            beats=Beats(t.beacon_interval_s, t.leader_timeout_s, min(5.0, t.leader_timeout_s)),
            discovery_warning_s=0.0,
            bind_ip=addr[0], advertised_ip=addr[0], label=f"[sim {index}]", place=place,
            incarnation=incarnation,
        )  # fmt: skip
        sim_node = SimNode(index=index, addr=addr, node=None, start_at=start_at)  # type: ignore[arg-type]
        sim_node.net = SimNet(self, sim_node)
        sim_node.board = Board(Diagnostics(node_id=f"{node_id:016x}", job=settings.job, role="idle"))
        sim_node.node = Node(settings, core, sim_node.net, state=self.saved.get(node_id))
        sim_node.node.observe = self._observer(sim_node)
        sim_node.node.trace = lambda now, ev, n=sim_node: n.events.append((now, ev))
        self.nodes.append(sim_node)
        self._by_addr[addr] = sim_node
        self._push(start_at, sim_node, "start")
        return sim_node

    # ------------------------------------------------------------ faults

    def kill(self, node: SimNode) -> None:
        """The node's process dies: its sockets close, its timers stop."""
        node.alive = False
        self.net.detach(node.addr, self.now)

    def power_off(self, node: SimNode) -> None:
        """The node's host loses power: nothing it had answers any more, and nothing says so."""
        node.alive = False
        self.net.power_off(node.addr)

    def restart(self, old: SimNode, at: float, *, node_id: int | None = None) -> SimNode:
        """A new process of the agent on ``old``'s host, starting at ``at`` (``old`` is dead by
        then); under ``old``'s node id it reads what ``old`` saved (``_identity``), one
        incarnation later, unless ``old`` left the job (then it is a new node)."""
        was = old.node.settings
        if node_id is not None and node_id in self.saved and self.saved[node_id].left:
            node_id = None  # it left: a new node (``Identity.claim``)
        incarnation = was.incarnation + 1 if node_id == was.node_id else 1
        return self.add_node(at, node_id=node_id, addr=old.addr, place=was.place, incarnation=incarnation)

    def track_knowledge(self) -> None:
        """From now on, every datagram and stream byte carries what its sender knew as it sent
        it (facts given to ``learn``), and its receiver knows that too once it reads it: the
        causal history that tells an isolated island from a node that could have heard."""
        self.knowledge = {}
        self.net.knows_of = self._knows_of_host

    def learn(self, node: SimNode, fact: object) -> None:
        """``node``'s process knows ``fact`` from now on (and tells whomever it sends to)."""
        if self.knowledge is not None:
            self.knowledge[node.index] = self.knows(node) | {fact}

    def knows(self, node: SimNode) -> frozenset[object]:
        return self.knowledge.get(node.index, frozenset()) if self.knowledge is not None else frozenset()

    def _knows_of_host(self, addr: object) -> frozenset[object]:
        node = self._by_addr.get(addr)
        return self.knows(node) if node is not None and node.alive else frozenset()

    def _absorb(self, node: SimNode, knows: object) -> None:
        if self.knowledge is not None and isinstance(knows, frozenset) and knows:
            mine = self.knows(node)
            if not knows <= mine:
                self.knowledge[node.index] = mine | knows

    def step_clock(self, node: SimNode, seconds: float) -> None:
        """The node's wall clock steps (NTP, a VM resumed): what signed datagrams carry."""
        node.wall_offset_s += seconds

    def observe(self, addr: tuple[str, int], receive: Any) -> None:
        """A host that is not a node (a hostile peer): ``receive(delivery)`` gets what reaches ``addr``."""
        self._observers[addr] = receive
        self.net.attach(addr)

    def freeze(self, node: SimNode) -> None:
        """SIGSTOP: the node's sockets stay open, but it reads, sends and decides nothing."""
        node.frozen = True

    def thaw(self, node: SimNode) -> None:
        """SIGCONT: what arrived meanwhile is read now, and its timers fire late."""
        node.frozen = False
        held, node.held = node.held, []
        if not node.alive:
            return  # killed while frozen (a restart of its host): a dead process reads nothing
        for delivery in held:  # one at a time, as they would have come
            self._dispatch(node, [delivery])
        self._schedule_timer(node)

    # ------------------------------------------------------------ requests

    def join(self, node: SimNode, timeout_s: float = 60.0) -> Ticket:
        """``next_rendezvous()`` on ``node``: the ticket resolves as the simulation runs."""
        ticket = Ticket("join", next(node.tickets), timeout_s=timeout_s)
        self._call(node, lambda now: self.step_node(node, [JoinRequested(ticket)]))
        return ticket

    def leave(
        self, node: SimNode, close_timeout_s: float = 5.0, *, why: str = "finished", failed: bool = False
    ) -> Ticket:
        """``shutdown()`` on ``node``; ``failed``: its agent failed (``why``)."""
        ticket = Ticket("shutdown", next(node.tickets), timeout_s=close_timeout_s)
        shutdown = ShutdownRequested(ticket, close_timeout_s, JobEnd(why, failed=failed))
        self._call(node, lambda now: self.step_node(node, [shutdown]))
        return ticket

    def arrive(self, node: SimNode, round_number: int, timeout_s: float = 5.0) -> Ticket:
        """torch's agent enters the exit barrier of round ``round_number`` on ``node``."""
        ticket = Ticket("arrive", next(node.tickets), timeout_s=timeout_s)
        self._call(node, lambda now: self.step_node(node, [ArriveRequested(ticket, round_number)]))
        return ticket

    def preempt(self, node: SimNode, timeout_s: float = 15.0) -> Ticket:
        """SIGTERM to ``node``'s agent: it leaves the job at once (``MingleRendezvousHandler.leave``)."""
        ticket = Ticket("leave", next(node.tickets), timeout_s=timeout_s)
        ticket.deadline = self.now + timeout_s  # as the handler's ``_ask`` sets it
        self._call(node, lambda now: self.step_node(node, [LeaveRequested(ticket)]))
        return ticket

    def next_port(self) -> int:
        return next(self._ports)

    def later(self, delay: float, node: SimNode, fn: Any) -> None:
        self._push(self.now + delay, node, fn)

    # ------------------------------------------------------------ running

    def step(self, until: float) -> bool:
        t = self._next_time()
        if t is None or t > until:
            self.now = max(self.now, until)
            return False
        self.now = max(self.now, t)
        # As the real loop does: what one wake-up brought each node is handed in, and flushed,
        # together; the nodes take their turns in the order their first delivery came.
        batches: dict[int, tuple[SimNode, list[Delivery]]] = {}
        for delivery in self.net.pop_due(self.now):
            target = self._by_addr.get(delivery.dst)
            if target is None and delivery.dst in self._observers:
                self._observers[delivery.dst](delivery)
                continue
            if target is not None and target.alive and target.started:
                if target.frozen:
                    target.held.append(delivery)
                    continue
                batches.setdefault(target.index, (target, []))[1].append(delivery)
        for target, deliveries in batches.values():
            self._dispatch(target, deliveries)
        while self._heap and self._heap[0][0] <= self.now:
            _, _, index, action = heapq.heappop(self._heap)
            node = self.nodes[index]
            if not node.alive:
                continue
            if action == "start":
                node.started = True
                self.net.attach(node.addr)
                self.step_node(node, [Started()])
            elif action == "timer":
                if node.frozen:
                    node.timer_queued = None  # thaw() schedules its timers again
                    continue
                if node.timer_queued is None or node.timer_queued > self.now:
                    continue
                node.timer_queued = None
                self.step_node(node, [TimerFired()])
            elif node.frozen:
                node.held.append(Delivery("call", node.addr, src=action))  # runs when thawed
                continue
            else:
                action(self.now)
            self._schedule_timer(node)
        if self.net.next_delivery() is None:
            self._decode_memo.clear()  # nothing in flight refers to these datagrams any more
        return True

    def run_until(self, t: float) -> None:
        while self.step(t):
            pass

    def run_until_converged(self, deadline: float, *, check_every_s: float = 0.001) -> float | None:
        """Run until every started node agrees on one leader; returns that time or None."""
        while self.now < deadline:
            self.run_until(min(deadline, self.now + check_every_s))
            if self.converged():
                return self.now
        return None

    def run_until_done(self, tickets: Sequence[Ticket], deadline: float) -> bool:
        """Run until every ticket is resolved (True) or ``deadline`` passes (False)."""
        while self.now < deadline:
            if all(t.done for t in tickets):
                return True
            if not self.step(deadline):
                break
        return all(t.done for t in tickets)

    # --------------------------------------------------------------- inspection

    def live(self, job: str | None = None) -> list[SimNode]:
        """Started, living nodes of ``job`` (default: the simulation's job)."""
        job = job or self.job
        return [n for n in self.nodes if n.alive and n.started and n.core.job == job]

    def leaders(self) -> list[SimNode]:
        return [n for n in self.live() if n.core.role is Role.LEADING]

    def converged(self) -> bool:
        live = [n for n in self.live() if not n.frozen]
        if not live or len(live) < sum(
            1 for n in self.nodes if n.alive and not n.frozen and n.core.job == self.job
        ):
            return False
        leaders = [n for n in live if n.core.role is Role.LEADING]
        if len(leaders) != 1:
            return False
        claim = leaders[0].core.leader.claim if leaders[0].core.leader else None
        return all(n.core.leader is not None and n.core.leader.claim == claim for n in live)

    def datagrams_per_node(self) -> float:
        return sum(n.core.stats.sent for n in self.nodes) / max(1, len(self.nodes))

    # ------------------------------------------------------------ internals

    def step_node(self, node: SimNode, inputs: list[Input]) -> None:
        """Step ``node`` with ``inputs``, carry its ``Ready`` out on the simulated network (as
        the loop does on sockets), and step it again with what that brought back."""
        net, board = node.net, node.board
        assert net is not None and board is not None  # noqa: S101
        while inputs and node.alive:
            ready = node.node.step(inputs, self.now, wall_s=self.now + node.wall_offset_s)
            try:
                inputs = apply(ready, net, board)
            except StateNotRecorded as exc:
                board.fail(exc)  # as the loop does: the node stops, its sockets close
                self.kill(node)
                return
            if self.after_step is not None:
                self.after_step(node)
        self._schedule_timer(node)

    def _dispatch(self, node: SimNode, deliveries: list[Delivery]) -> None:
        """What reached ``node`` in one wake-up, handed in together (a call runs alone)."""
        net = node.net
        assert net is not None  # noqa: S101
        inputs: list[Input] = []
        for d in deliveries:
            if node.frozen:  # (a fault that an earlier delivery set off)
                node.held.append(d)
                continue
            if d.kind == "call":
                self.step_node(node, inputs)
                inputs = []
                d.src(self.now)  # type: ignore[operator]
                continue
            event = self._input_of(net, d)
            if event is not None:
                self._knows[id(event)] = d.knows
                inputs.append(event)
        if node.alive:
            self.step_node(node, inputs)

    def _input_of(self, net: SimNet, d: Delivery) -> Input | None:
        """The node's input for delivery ``d`` (None: nothing its process can read)."""
        if d.kind in ("connected", "data", "closed") and (
            d.end not in net.ends or self.net.end_gen(d.end) != d.gen
        ):
            return None  # a connection of an earlier process on this host, or bytes voided by a reset
        conn = net.conn_of.get(d.end, d.end)
        if d.kind == "datagram":
            return DatagramReceived(d.data, d.src)  # type: ignore[arg-type]
        if d.kind == "accepted":
            net.readers[d.end] = FrameReader(from_node)
            net.ends.add(d.end)
            source = d.src[0] if isinstance(d.src, tuple) and d.src else ""
            return ConnectionAccepted(d.end, str(source))
        if d.kind == "connected":
            return Connected(conn)
        if d.kind == "data":
            reader = net.readers.get(d.end)
            return FramesReceived(conn, reader.feed(d.data)) if reader is not None else None
        if d.kind == "closed" and (net.readers.pop(d.end, None) is not None or d.refused):
            net.end_of.pop(conn, None)
            net.conn_of.pop(d.end, None)
            seen = Evidence.REFUSED if d.refused else Evidence.RESET if d.reset else Evidence.CLOSED
            return ConnectionClosed(conn, d.reason, seen)
        return None

    def _observer(self, node: SimNode) -> Any:
        """What ``node`` learns of what it reads, as it reads it (``track_knowledge``)."""

        def observe(event: object) -> None:
            knows = self._knows.pop(id(event), None)
            if knows is not None:
                self._absorb(node, knows)

        return observe

    def _call(self, node: SimNode, fn: Any) -> None:
        self._push(self.now, node, fn)

    def _push(self, at: float, node: SimNode, action: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, node.index, action))

    def _schedule_timer(self, node: SimNode) -> None:
        if not node.alive or not node.started or node.frozen:
            return
        timer = node.node.next_timer()
        queued = node.timer_queued
        if timer is not None and (queued is None or queued < self.now or timer < queued):
            node.timer_queued = timer
            self._push(timer, node, "timer")

    def _next_time(self) -> float | None:
        candidates = [x for x in (self.net.next_delivery(),) if x is not None]
        if self._heap:
            candidates.append(self._heap[0][0])
        return min(candidates) if candidates else None
