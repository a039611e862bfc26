"""A simulated network segment on a fake clock: datagrams and TCP-like streams between hosts.

How it works
------------
Every delivery (a datagram, a connection accepted or connected, stream bytes, a close) is
pushed on one time-ordered queue; ``Simulation`` pops what is due and hands it to the node at
its destination. A seeded RNG draws latencies, losses and duplicates, so a run replays
exactly from its seed.

What the field does to packets, each switchable at any moment:

* **Loss, duplication, reordering, delay spikes** of datagrams: globally (``drop``,
  ``duplicate``, ``latency_s``) and per host (``impair``); reordering comes from the random
  latencies. Stream bytes are never lost: a lost segment is retransmitted, which delays it.
* **Cuts** between any two hosts, in one or both directions (``block``/``unblock``), either
  **silent** (a cable cut, a firewall that drops: datagrams vanish, stream bytes and closes
  wait until the cut heals and are then retransmitted, a connect gets no answer) or
  **resetting** (a firewall that rejects with a TCP reset, a NAT that lost its flow table:
  datagrams vanish, a stream's sender gets a reset on its next send, a connect is refused).
  ``partition(groups)`` is the symmetric silent split of older tests.
* **A crashed process** (``detach``): its listeners vanish (connects are refused) and its
  kernel closes its connections (each peer reads the close).
* **A host that lost power** (``power_off``): nothing answers any more; the peers' segments
  vanish and their connects time out. When a new process starts on that host
  (``attach``), its kernel answers the old connections' segments with a reset.
* **A slow reader or writer** (``stall``): stream bytes to or from a host take longer.
* **A reset of one host's connections** (``reset_connections``), as a middlebox that drops
  its state does: both ends see a reset, and what was in flight on them is lost.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable

from torch_mingle._claims import Dest
from torch_mingle._record import field, record

#: A segment lost behind a silent cut is retransmitted this long after the cut heals.
RETRANSMIT_S = 0.2
#: A stream segment lost to loss (``impair``) is retransmitted this much later.
LOSS_RETRANSMIT_S = (0.2, 0.6)
DROP, RESET = "drop", "reset"
#: A cut by something that closes connections both ways (a proxy, a sidecar, a NAT that closes
#: what it cannot route): a connect is accepted and closed, a send closes both ends (FIN).
FIN = "fin"
FIN_REASON = "closed by the peer (a proxy on the path closed it)"
#: A cut by a middlebox that mangles what crosses it and then passes nothing (a failing
#: proxy, a NAT or firewall that rewrites a flow it lost): each connection's first send across
#: it arrives spoiled (the receiver sees a protocol error, ``Evidence.BROKEN``), the rest waits
#: as behind a silent cut; connects wait too.
GARBLE = "garble"
#: Where a garbled send is spoiled: past a frame's length (``_wire.FRAME_HEADER``), so the
#: receiver reads a frame that is not JSON rather than waiting for bytes that never come.
GARBLE_AT = 4


def _spoiled(data: bytes) -> bytes:
    """``data`` with the frame's first body byte corrupted (``GARBLE_AT``)."""
    return data[:GARBLE_AT] + b"\xff" + data[GARBLE_AT + 1 :]


@record
class Route:
    """What the network does with one datagram: deliver after each delay (none: dropped)."""

    delays: tuple[float, ...]


RouteHook = Callable[[object, object, bytes, random.Random], Route | None]


@record
class Delivery:
    """Something the network hands to the host at ``dst`` (``Simulation`` dispatches it).

    ``kind``: ``datagram`` (data from ``src``), ``accepted`` / ``connected`` (stream end ``end``
    is open), ``data`` (bytes on ``end``), ``closed`` (``end`` ended; ``refused`` if nothing
    listened, ``reset`` if the other side's kernel or a firewall reset it), ``call`` (a
    simulation action held for a frozen host).
    """

    kind: str
    dst: object
    end: int = 0
    data: bytes = b""
    src: object = None
    refused: bool = False
    reason: str = ""
    reset: bool = False
    #: The end's generation when this was sent: a reset of the end voids what was in flight.
    gen: int = 0
    #: What the sender knew when it sent it (``InMemoryNetwork.knows_of``): causal history.
    knows: object = None


@record
class Impairment:
    """Datagram loss and duplication, and extra latency (datagrams and stream bytes), for one host."""

    drop: float = 0.0
    duplicate: float = 0.0
    extra_s: tuple[float, float] = (0.0, 0.0)


@record(frozen=False)
class _End:
    id: int
    owner: object
    peer: int
    open: bool = True
    last_at: float = 0.0
    #: Bytes (with what their sender knew then), and a close (None), sent behind a silent cut:
    #: retransmitted when it heals.
    held: list[tuple[bytes, object] | None] = field(default_factory=list)
    #: Its host lost power: the peer's segments get no answer (a reset once the host is back).
    dead: bool = False
    gen: int = 0


class InMemoryNetwork:
    """A simulated segment on a fake clock (see the module doc)."""

    def __init__(
        self,
        *,
        seed: int = 0,
        latency_s: tuple[float, float] = (0.0002, 0.002),
        drop: float = 0.0,
        duplicate: float = 0.0,
        route_hook: RouteHook | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.latency_s = latency_s
        self.drop = drop
        self.duplicate = duplicate
        self.route_hook = route_hook
        self.members: dict[object, None] = {}  # insertion-ordered set
        self._queue: list[tuple[float, int, Delivery]] = []
        self._seq = 0
        self._side: dict[object, int] = {}
        #: Directed cuts: (from, to) -> {cut id: DROP or RESET}.
        self._blocks: dict[tuple[object, object], dict[int, str]] = {}
        self._listeners: dict[tuple[str, int], object] = {}
        self._ends: dict[int, _End] = {}
        self._next_end = 0
        self._next_port = 40000
        #: Hosts (by address) that lost power.
        self.dark: set[object] = set()
        self.impaired: dict[object, Impairment] = {}
        #: Extra latency of stream bytes to or from a host (a slow reader or writer).
        self.stalled: dict[object, float] = {}
        #: Extra latency of stream bytes from one host to another (one direction of a slow path).
        self.slow: dict[tuple[object, object], float] = {}
        #: Hosts whose link corrupts stream bytes: how many more sends to or from each it spoils
        #: (a bad NIC or middlebox; the receiver sees a protocol error, ``Evidence.BROKEN``).
        self.garbled: dict[object, int] = {}
        #: The ends whose send a ``GARBLE`` cut spoiled already (one per connection and cut).
        self._spoilt: set[tuple[int, int]] = set()
        #: Connects waiting behind a silent cut: (client end, server end, target).
        self._pending_connects: list[tuple[int, int, object]] = []
        self.datagrams_sent = 0
        self.deliveries = 0
        self.multicast = True
        #: What a host knows as it sends (``Simulation.knowledge``): every datagram and every
        #: stream byte carries it to its receiver, so that a test can tell what could have been
        #: heard by whom, transitively. None: not tracked.
        self.knows_of: Callable[[object], object] | None = None

    def attach(self, addr: object) -> None:
        """A process on ``addr`` opens its sockets (on a host that lost power: it is back)."""
        self.members[addr] = None
        self.dark.discard(addr)

    def detach(self, addr: object, now: float = 0.0) -> None:
        """``addr``'s process died: its listeners vanish, its kernel closes its connections."""
        self.members.pop(addr, None)
        self._unlisten_all(addr)
        for end in list(self._ends.values()):
            if end.owner == addr and end.open:
                end.open = False
                self._close_peer(end, now, "closed by the peer (its process died)")

    def power_off(self, addr: object) -> None:
        """``addr``'s host lost power: nothing it had answers any more, and nothing says so."""
        self.members.pop(addr, None)
        self._unlisten_all(addr)
        self.dark.add(addr)
        for end in self._ends.values():
            if end.owner == addr and end.open:
                end.open, end.dead = False, True

    # ------------------------------------------------------------ cuts

    def partition(self, *groups: Iterable[object]) -> None:
        """A symmetric silent split: traffic passes only inside a group (and not at all for a
        host in none)."""
        self._side = {addr: n for n, group in enumerate(groups) for addr in group}

    def block(self, cut: int, pairs: Iterable[tuple[object, object]], mode: str = DROP) -> None:
        """Cut ``cut`` stops traffic from each ``a`` to ``b`` of ``pairs`` (silently or with resets)."""
        for pair in pairs:
            self._blocks.setdefault(pair, {})[cut] = mode

    def unblock(self, cut: int, now: float) -> None:
        """Cut ``cut`` heals: what waited behind it is retransmitted."""
        self._spoilt = {mark for mark in self._spoilt if mark[1] != cut}
        for pair in [p for p, cuts in self._blocks.items() if cut in cuts]:
            del self._blocks[pair][cut]
            if not self._blocks[pair]:
                del self._blocks[pair]
        self._release(now)

    def heal(self, now: float = 0.0) -> None:
        """Every cut heals."""
        self._side = {}
        self._blocks = {}
        self._release(now)

    def cut_mode(self, a: object, b: object) -> str | None:
        """How traffic from ``a`` to ``b`` is cut (``DROP``, ``RESET``, ``FIN``, ``GARBLE``), or None."""
        if self._side and self._side.get(a, -1) != self._side.get(b, -2):
            return DROP
        cuts = self._blocks.get((a, b))
        if not cuts:
            return None
        modes = cuts.values()
        return RESET if RESET in modes else FIN if FIN in modes else GARBLE if GARBLE in modes else DROP

    def cut(self, a: object, b: object) -> bool:
        return self.cut_mode(a, b) is not None

    # ------------------------------------------------------------ datagrams

    def _route(self, src: object, dst: object, data: bytes) -> Route:
        if self.cut(src, dst):
            return Route(delays=())
        if self.route_hook is not None:
            hooked = self.route_hook(src, dst, data, self.rng)
            if hooked is not None:
                return hooked
        drop, duplicate, extra = self.drop, self.duplicate, 0.0
        for host in (src, dst):
            imp = self.impaired.get(host)
            if imp is not None:
                drop = 1.0 - (1.0 - drop) * (1.0 - imp.drop)
                duplicate = max(duplicate, imp.duplicate)
                extra += self.rng.uniform(*imp.extra_s)
        if self.rng.random() < drop:
            return Route(delays=())
        low, high = self.latency_s
        delays = [self.rng.uniform(low, high) + extra]
        if self.rng.random() < duplicate:
            delays.append(self.rng.uniform(low, high) * 2 + extra)
        return Route(delays=tuple(delays))

    def send(self, src: object, data: bytes, dest: Dest, now: float) -> None:
        """A datagram from ``src`` to ``dest`` (None: every other member, as multicast)."""
        self.datagrams_sent += 1
        if dest is None and not self.multicast:
            return
        targets = [m for m in self.members if m != src] if dest is None else [dest]
        knows = self.knows_of(src) if self.knows_of is not None else None
        for dst in targets:
            if dst not in self.members:
                continue
            for delay in self._route(src, dst, data).delays:
                self._push(now + delay, Delivery("datagram", dst, data=data, src=src, knows=knows))

    # ------------------------------------------------------------ streams

    def listen(self, owner: object, ip: str) -> int:
        self._next_port += 1
        self._listeners[(ip, self._next_port)] = owner
        return self._next_port

    def unlisten(self, owner: object) -> None:
        self._unlisten_all(owner)

    def _unlisten_all(self, owner: object) -> None:
        for key in [k for k, o in self._listeners.items() if o == owner]:
            del self._listeners[key]

    def connect(self, owner: object, ip: str, port: int, now: float) -> int:
        """Open a stream to ``ip:port``; returns this side's end (outcome: ``connected`` or ``closed``)."""
        client, server = self._next_end, self._next_end + 1
        self._next_end += 2
        self._ends[client] = _End(id=client, owner=owner, peer=server)
        target = self._listeners.get((ip, port))
        latency = self._latency()
        if target is None or target not in self.members:
            if any(isinstance(a, tuple) and a and a[0] == ip for a in self.dark):
                return client  # the host lost power: no answer, the client's own timeout decides
            self._refuse(client, owner, now + latency)
            return client
        self._ends[server] = _End(id=server, owner=target, peer=client)
        mode = self.cut_mode(owner, target) or self.cut_mode(target, owner)
        if mode == RESET:
            del self._ends[server]
            self._refuse(client, owner, now + latency)
        elif mode == FIN:
            del self._ends[server]  # the proxy accepts it, then closes it: the peer never hears
            end = self._ends[client]
            end.open = False
            self._push(now + latency, Delivery("connected", owner, end=client, gen=end.gen))
            self._push(
                now + 2 * latency, Delivery("closed", owner, end=client, reason=FIN_REASON, gen=end.gen)
            )
        elif mode in (DROP, GARBLE):
            self._pending_connects.append((client, server, target))  # SYNs retried after the heal
        else:
            self._handshake(client, server, target, now, latency)
        return client

    def _refuse(self, client: int, owner: object, at: float) -> None:
        self._ends[client].open = False
        self._push(at, Delivery("closed", owner, end=client, refused=True, reason="refused"))

    def _handshake(self, client: int, server: int, target: object, now: float, latency: float) -> None:
        owner = self._ends[client].owner
        self._push(now + latency, Delivery("accepted", target, end=server, src=owner))
        self._push(now + 2 * latency, Delivery("connected", owner, end=client))
        # Nothing arrives on an end before it is open (TCP: the handshake comes first).
        self._ends[server].last_at = now + latency
        self._ends[client].last_at = now + 2 * latency

    def stream_send(self, end_id: int, data: bytes, now: float) -> None:
        end = self._ends.get(end_id)
        if end is None or not end.open:
            return
        peer = self._ends.get(end.peer)
        if peer is None:
            return
        knows = self.knows_of(end.owner) if self.knows_of is not None else None
        if end.held:
            end.held.append((data, knows))  # behind what already waits: TCP keeps the order
            return
        if peer.dead:
            if peer.owner not in self.dark:  # the host is back: its kernel knows no such connection
                self._reset(end, now, "connection reset by peer (its host restarted)")
            return  # the host lost power: retransmitted into the void until the peer gives up
        mode = self.cut_mode(end.owner, peer.owner)
        if mode == GARBLE and peer.open and len(data) > GARBLE_AT and self._spoil(end, peer):
            self._deliver_data(end, peer, _spoiled(data), now, knows)
            return
        if mode in (DROP, GARBLE):
            end.held.append((data, knows))
            return
        if mode == RESET:
            self._reset(end, now, "connection reset by peer (a firewall on the path rejects it)")
            return
        if mode == FIN:
            self._fin(end, now)
            self._fin(peer, now)
            return
        if not peer.open:
            return
        for host in (end.owner, peer.owner):
            left = self.garbled.get(host, 0)
            if left > 0 and len(data) > GARBLE_AT:
                self.garbled[host] = left - 1
                data = _spoiled(data)
                break
        self._deliver_data(end, peer, data, now, knows)

    def _spoil(self, end: _End, peer: _End) -> bool:
        """Whether a ``GARBLE`` cut spoils this send of ``end``: the first of each connection
        under each cut between the two hosts (both ways: the other end's first send too)."""
        cuts = self._blocks.get((end.owner, peer.owner), {})
        marks = {(end.id, cut) for cut, mode in cuts.items() if mode == GARBLE}
        if not marks or marks <= self._spoilt:
            return False
        self._spoilt |= marks
        return True

    def _deliver_data(self, end: _End, peer: _End, data: bytes, now: float, knows: object) -> None:
        delay = self._latency() + self.stalled.get(end.owner, 0.0) + self.stalled.get(peer.owner, 0.0)
        if self.slow:
            delay += self.slow.get((end.owner, peer.owner), 0.0)
        for host in (end.owner, peer.owner):
            imp = self.impaired.get(host)
            if imp is not None:
                delay += self.rng.uniform(*imp.extra_s)
                if imp.drop and self.rng.random() < imp.drop:
                    delay += self.rng.uniform(*LOSS_RETRANSMIT_S)
        at = max(now + delay, peer.last_at)
        peer.last_at = at
        self._push(at, Delivery("data", peer.owner, end=end.peer, data=data, gen=peer.gen, knows=knows))

    def stream_close(self, end_id: int, now: float) -> None:
        end = self._ends.get(end_id)
        if end is None or not end.open:
            return
        end.open = False
        if end.held:
            end.held.append(None)
            return
        self._close_peer(end, now, "closed by the peer")

    def reset_connections(self, addr: object, now: float) -> None:
        """Every connection of ``addr`` is reset at both ends; what was in flight on them is lost."""
        for end in list(self._ends.values()):
            peer = self._ends.get(end.peer)
            if end.owner != addr or peer is None:
                continue
            for e in (end, peer):
                e.held.clear()
                if e.open:
                    self._reset(e, now, "connection reset by peer (a middlebox dropped the connection)")

    def _reset(self, end: _End, now: float, reason: str) -> None:
        end.open = False
        end.gen += 1
        end.held.clear()
        at = max(now + self._latency(), end.last_at)
        self._push(at, Delivery("closed", end.owner, end=end.id, reason=reason, reset=True, gen=end.gen))

    def _fin(self, end: _End, now: float) -> None:
        """A proxy on the path closes ``end`` (what it sent is lost with the connection)."""
        if not end.open or end.dead:
            return
        end.open = False
        end.held.clear()
        at = max(now + self._latency(), end.last_at)
        self._push(at, Delivery("closed", end.owner, end=end.id, reason=FIN_REASON, gen=end.gen))

    def _close_peer(self, end: _End, now: float, reason: str) -> None:
        peer = self._ends.get(end.peer)
        if peer is None or not peer.open or peer.dead:
            return
        mode = self.cut_mode(end.owner, peer.owner)
        if mode in (DROP, GARBLE):
            end.held.append(None)
            return
        if mode == RESET:
            return  # the close is rejected on the way; the peer learns when it sends
        peer.open = False
        at = max(now + self._latency(), peer.last_at)
        self._push(at, Delivery("closed", peer.owner, end=end.peer, reason=reason, gen=peer.gen))

    def _release(self, now: float) -> None:
        """A cut healed: retransmit what waited behind the cuts that are gone."""
        for end in self._ends.values():
            if not end.held:
                continue
            peer = self._ends.get(end.peer)
            if peer is None or self.cut_mode(end.owner, peer.owner) is not None:
                continue
            held, end.held = end.held, []
            at = now + RETRANSMIT_S
            for item in held:
                if item is None:
                    self._close_peer(end, at, "closed by the peer")
                elif peer.open and not peer.dead:
                    self._deliver_data(end, peer, item[0], at, item[1])
        waiting, self._pending_connects = self._pending_connects, []
        for client, server, target in waiting:
            owner = self._ends[client].owner
            if self.cut(owner, target) or self.cut(target, owner):
                self._pending_connects.append((client, server, target))
            elif self._ends[client].open and target in self.members:
                self._handshake(client, server, target, now + RETRANSMIT_S, self._latency())

    def end_gen(self, end_id: int) -> int:
        end = self._ends.get(end_id)
        return end.gen if end is not None else -1

    # ------------------------------------------------------------ the queue

    def _latency(self) -> float:
        low, high = self.latency_s
        return self.rng.uniform(low, high)

    def _push(self, at: float, delivery: Delivery) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, delivery))

    def next_delivery(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def pop_due(self, now: float) -> list[Delivery]:
        out = []
        while self._queue and self._queue[0][0] <= now:
            _, _, delivery = heapq.heappop(self._queue)
            self.deliveries += 1
            out.append(delivery)
        return out
