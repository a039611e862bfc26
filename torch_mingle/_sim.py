"""Run many ``Discovery`` cores on an ``InMemoryNetwork`` with a fake clock.

Used by the unit tests (convergence under loss, duplication, delay and partitions) and by
the scale benchmark (time to one leader and datagrams per node for thousands of nodes).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import cast

from torch_mingle._protocol import BecomeLeader, Dest, Discovery, Event, Role, Timing
from torch_mingle._transport import InMemoryNetwork, RouteHook
from torch_mingle._wire import Codec, Datagram, Invalid


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


@dataclass
class SimNode:
    index: int
    addr: tuple[str, int]
    core: Discovery
    start_at: float
    started: bool = False
    alive: bool = True
    events: list[tuple[float, Event]] = field(default_factory=list)
    timer_queued: float | None = None


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
    ) -> None:
        self.rng = random.Random(seed)
        self.job = job
        self.timing = timing or Timing()
        self.key = key
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
        self._timers: list[tuple[float, int]] = []
        self._starts: list[tuple[float, int]] = []
        self._decode_memo: dict[int, tuple[bytes, Datagram | Invalid]] = {}
        for _ in range(n):
            self.add_node(self.rng.uniform(0.0, start_spread_s))

    def add_node(self, start_at: float, *, job: str | None = None) -> SimNode:
        index = len(self.nodes)
        node_id = self.rng.getrandbits(64) or 1
        addr = (f"10.{index // 65536}.{index // 256 % 256}.{index % 256}", 40000 + index % 20000)
        codec = Codec(self.key) if self.key is not None else _SharedDecodeCodec(self._decode_memo)
        core = Discovery(
            job or self.job,
            node_id,
            timing=self.timing,
            codec=codec,
            rng=random.Random(node_id),
            wall_offset_s=1.7e9,
        )
        node = SimNode(index=index, addr=addr, core=core, start_at=start_at)
        self.nodes.append(node)
        self._by_addr[addr] = node
        heapq.heappush(self._starts, (start_at, index))
        return node

    def kill(self, node: SimNode) -> None:
        node.alive = False
        node.core.stop()
        if node.addr in self.net.members:
            self.net.detach(node.addr)

    # ------------------------------------------------------------------ running

    def _flush(self, node: SimNode) -> None:
        for _ in range(4):
            for data, dest in node.core.datagrams_to_send(self.now):
                self.net.send(node.addr, data, dest, self.now)
            events = node.core.events()
            if not events:
                break
            for ev in events:
                node.events.append((self.now, ev))
                if isinstance(ev, BecomeLeader):
                    node.core.leader_ready(self.now, node.addr[0], 29500)
        timer = node.core.next_timer()
        if timer is not None and timer != node.timer_queued:
            node.timer_queued = timer
            heapq.heappush(self._timers, (timer, node.index))

    def _next_time(self) -> float | None:
        while self._timers:
            t, i = self._timers[0]
            node = self.nodes[i]
            if node.alive and node.started and node.core.next_timer() == t:
                break
            heapq.heappop(self._timers)
        candidates = [x for x in (self.net.next_delivery(),) if x is not None]
        if self._timers:
            candidates.append(self._timers[0][0])
        if self._starts:
            candidates.append(self._starts[0][0])
        return min(candidates) if candidates else None

    def step(self, until: float) -> bool:
        t = self._next_time()
        if t is None or t > until:
            self.now = until
            return False
        self.now = max(self.now, t)
        while self._starts and self._starts[0][0] <= self.now:
            _, i = heapq.heappop(self._starts)
            node = self.nodes[i]
            if node.alive:
                node.started = True
                self.net.attach(node.addr)
                node.core.start(self.now)
                self._flush(node)
        for dst, data, src in self.net.pop_due(self.now):
            node = self._by_addr[dst]
            if node.alive and node.started:
                node.core.receive_datagram(data, cast(Dest, src), self.now)
                self._flush(node)
        while self._timers and self._timers[0][0] <= self.now:
            t, i = heapq.heappop(self._timers)
            node = self.nodes[i]
            if node.alive and node.started and node.core.next_timer() == t:
                node.timer_queued = None
                node.core.handle_timer(self.now)
                self._flush(node)
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

    # --------------------------------------------------------------- inspection

    def live(self, job: str | None = None) -> list[SimNode]:
        """Started, living nodes of ``job`` (default: the simulation's job)."""
        job = job or self.job
        return [n for n in self.nodes if n.alive and n.started and n.core.job == job]

    def leaders(self) -> list[SimNode]:
        return [n for n in self.live() if n.core.role is Role.LEADING]

    def converged(self) -> bool:
        live = self.live()
        if not live or len(live) < sum(1 for n in self.nodes if n.alive and n.core.job == self.job):
            return False
        leaders = self.leaders()
        if len(leaders) != 1:
            return False
        claim = leaders[0].core.leader.claim if leaders[0].core.leader else None
        return all(n.core.leader is not None and n.core.leader.claim == claim for n in live)

    def datagrams_per_node(self) -> float:
        return sum(n.core.stats.sent for n in self.nodes) / max(1, len(self.nodes))
