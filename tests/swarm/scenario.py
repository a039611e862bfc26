"""What one seed of the swarm runs: a cluster, a workload and a schedule of faults, all drawn
from the seed, so that a seed (and the events kept of it) replays exactly."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

#: Heartbeats of the simulated agents (``keep_alive_interval`` x ``keep_alive_max_attempt``).
INTERVAL_S, ATTEMPTS = 0.5, 3
ELECTION_WINDOW_S = 0.02
#: Longer than the heartbeat timeout, as torch's default (30 s) is against ours (15 s): a job's
#: survivors notice a lost leader before a round of newcomers waits out its last call.
LAST_CALL_S = 2.5
REJOIN_DELAY_S = 0.5
#: Longer than ``harness.recovery_bound_s``: a job that never forms is caught, not timed out.
JOIN_TIMEOUT_S = 45.0
CLOSE_TIMEOUT_S = 3.0
#: Faults start within this window of the job's start.
FAULTS_FROM_S, FAULTS_UNTIL_S = 0.5, 12.0

#: Fault kinds and how often each is drawn. ``rogue`` (a host without the secret that
#: connects to the leader's control port) only runs in clusters with a secret: without one,
#: any host on the segment may join by design (docs/security.md#without-a-secret).
KINDS: dict[str, int] = {
    "crash": 8,  # SIGKILL of the agent: connections closed by its kernel, datagrams unanswered
    "power": 4,  # the host loses power: silence
    "freeze": 10,  # SIGSTOP of the process tree, SIGCONT later
    "restart": 6,  # the agent dies and a new process starts on the same host
    "partition": 14,  # sides, silent or resetting, both ways or one way; heals later
    "isolate": 6,  # one host's link down (a silent cut from every other host)
    "impair": 6,  # datagram loss, duplication, delay spikes on one host's link
    "stall": 6,  # a slow reader or writer: one host's stream bytes arrive late
    "reset_conns": 5,  # a middlebox drops one host's connections: resets, frames in flight lost
    "clock": 4,  # one host's wall clock steps, and back
    "forge": 3,  # garbage and forged datagrams
    "replay": 3,  # datagrams seen earlier, sent again
    "rogue": 5,  # a host without the secret connects to the control port and sends any frame
    "workers_fail": 6,  # a worker fails: the agent re-joins at once
    "sigterm": 3,  # a preemption notice: the agent leaves gracefully
    "shutdown": 1,  # an agent's shutdown(): the job closes for every node
    "unfit": 3,  # the node's health check fails for a while: it leads no term meanwhile
    # Faults at the moment a vote goes out (the next accept of a proposal, within ``TRIGGER_S``),
    # where a rule about votes decides: the voter's host loses power and restarts (what it
    # recorded before the vote is all it knows), or a partition splits the voters mid-proposal.
    "power_at_accept": 4,
    "partition_at_accept": 5,
    "sigterm_at_accept": 2,  # the voter leaves right after its vote
}
#: Partitions that close connections with a FIN, both ways or one way (a proxy, a sidecar or
#: a NAT that closes what it cannot route): ``judge(CLOSED)`` under a split. Drawn apart from
#: ``KINDS``, as ``garble`` is.
FIN_SHARE = 0.3
FIN_SALT = 0xF1F1F1
#: Partitions by a middlebox that mangles what crosses it, then passes nothing (``net.GARBLE``):
#: each side reads a protocol error from the other, ``judge(BROKEN)`` under a split, at the
#: moment it matters (a split of the voters mid-proposal too). A share of the silent ones,
#: drawn apart from ``KINDS``.
GARBLE_CUT_SHARE = 0.5
GARBLE_CUT_SALT = 0x6A7C07
#: A link that goes bad (``garble``, in a share of the seeds): its next 1 to 3 stream sends,
#: either way, are corrupted (the receiver sees a protocol error), and then it drops everything
#: until it heals, as a failing NIC or middlebox does. Drawn apart from ``KINDS``.
GARBLE_SHARE = 0.3
GARBLE_SALT = 0x6A7B1E
#: A share of the seeds (``STARTUP_SHARE``, drawn apart from ``KINDS``) split the network the
#: moment the job's first round is proposed (a ``partition_at_accept`` armed from the start: a
#: switch that reboots as the job starts): a first round whose proposal reaches only some of
#: its members.
STARTUP_SHARE = 0.2
STARTUP_SALT = 0x57A27
#: A share of the seeds (``SWITCH_SHARE``, drawn apart: all of them, for the moment is rare,
#: about one seed in 2,000 meets it) power a host off right after a vote that replaced one for a
#: proposal of another term that formed or may still form, and that the node keeps until it
#: hears whether it formed (``power_at_switch``, armed from the start, waits for the first such
#: vote): what the node kept of the vote it replaced (``Ballot.earlier``) is what its next
#: process knows.
SWITCH_SHARE = 1.0
SWITCH_SALT = 0x5717C4
#: A share of the seeds with a secret (``OVERHEARD_SHARE``, drawn apart) cut ``min_nodes``
#: hosts off from the job's start (an island: it founds a job of its own; the others' first
#: leader loses power as it proposes if the island has not formed yet, so it does first).
#: Then, as the others propose their first round, the island's clocks step back past the
#: replay window and its datagrams reach one of the others' voters (one way), whose leader's
#: frames reach it late: the voter hears of the island's round by its stale datagrams (it
#: follows no leader of them) after its join went out and before it votes, and its leader does
#: not (seed 50005902: a round formed beside the island a member knew of).
OVERHEARD_SHARE = 0.6
#: Half of them open later: at the others' first proposal formed from a round numbered this or
#: above, so the island's round 1 is numbered below their base (seed 62037362: a leader took
#: it for an ancestor of its base and formed beside it).
OVERHEARD_AFTER = 2
OVERHEARD_SALT = 0x0BE7E4
#: A share of the seeds (``LAST_WORD_SHARE``, drawn apart) leave the job's leader, frozen, the
#: only node that knows of it: every other host loses power at once, the leader's agent is shut
#: down while it is frozen (the job ends), and one of the other hosts comes back as a new node
#: (its state gone) shortly before the leader thaws (``args``: how long before). All the new
#: node hears of the job is the leader's last word, its resignation (seed 62014562: it named
#: no round, and the new node founded epoch 1 round 1 again, the token of the job's first).
LAST_WORD_SHARE = 0.05
LAST_WORD_SALT = 0x1A5730
#: A share of the seeds (``WON_SHARE``, drawn apart) cut a leader off the moment a proposal of
#: its wins (the accept that gives it what it needs is on the wire): the round forms where its
#: leader is, and its voters never hear so. A majority of them may then vote for another
#: term's proposal that covers it, and that vote replaces the only record they have of a round
#: they were in (``Ballot.earlier`` keeps it; the ``power_at_switch`` of every seed tests what
#: the next process of such a voter kept of it).
WON_SHARE = 1.0
WON_SALT = 0x30A7E
#: A share of the seeds (``REGROUP_SHARE``, drawn apart) start split in two (a switch down as
#: the job starts: each side may found a job of its own), and when the split heals a second
#: one follows at once that moves one host across: a member of one side's round now reaches
#: only the other side, whose next round may count it while its old side goes on without it
#: (the two lines of one job meet in a node: ``OtherTerms.rivals``).
REGROUP_SHARE = 0.3
REGROUP_SALT = 0x2E6209
#: A share of the seeds of 6 hosts or more and ``min_nodes=1`` (``SHATTER_SHARE``, drawn
#: apart) start with every host cut off from every other (a switch down as the job starts):
#: each founds a job of its own. When that heals, one host still reaches the others but hears
#: none of them (a one-way cut): they hear of its round, and none of its members can join them
#: (seed 70007446: a node that heard of five islands kept four, and its term formed a round
#: beside the one it forgot).
SHATTER_SHARE = 0.5
SHATTER_SALT = 0x5A77E2
#: A share of the seeds (``SUCCESSOR_SHARE``, drawn apart) power off a leader the moment a
#: node votes for its proposal built on a round of another term that the node voted for (a
#: successor of the node's last vote): the successor may never form, and the next term may
#: know neither (seed 70000136: a third term covered only the successor and won the older
#: round's voters beside it; the node's vote for that round, replaced, must go with its join).
SUCCESSOR_SHARE = 0.3
SUCCESSOR_SALT = 0x5CC550
#: A share of the seeds (``CLOSE_SHARE``, drawn apart) close the job as a round trains
#: (``close_at_training``: the round that trains when it comes, or the next to start): one of
#: its members loses power once the workers run, and its leader's agent, its workers done,
#: calls ``shutdown()`` before that loss is noticed (``args``: how long after). The round must
#: break, not wait for the missing member (a ``shutdown`` among the faults of ``KINDS`` comes
#: in 1 seed in 20, rarely then).
CLOSE_SHARE = 0.1
CLOSE_SALT = 0xC105ED
#: A share of the seeds (``NEWCOMER_SHARE``, drawn apart) cut a new member off the moment a
#: round that counts it is proposed (the first vote for a proposal with a member its base did
#: not hold: a round counts a new member without its vote), and restart its agent while it is
#: cut off: the new process knows of the job only what the old one wrote down before it joined
#: (seed 8025425: it forgot, and founded a job of one beside the round).
NEWCOMER_SHARE = 0.15
NEWCOMER_SALT = 0x4E3C0E
#: A share of the seeds (``PREEMPT_SHARE``, drawn apart) preempt a host as a spot instance is:
#: a notice (SIGTERM: its agent leaves), then the host goes down before the agent is done
#: (``args``: how long after the notice) and its scheduler starts it again (``dur``): a leave
#: that reached the others but not the state file gives the new process a vote the others
#: count gone (seed 8038304).
PREEMPT_SHARE = 0.15
PREEMPT_SALT = 0x5E0771
#: A share of the seeds (``LEAVE_SHARE``, drawn apart) send a member SIGTERM the moment a
#: round that counts it is proposed: its leave and the proposal cross on the way, and the
#: proposal reaches a node that no longer votes (seeds 9001332, 9001558: it voted).
LEAVE_SHARE = 0.15
LEAVE_SALT = 0x1EA7E5
#: A share of the seeds (``LONG_SHARE``, drawn apart from ``KINDS``) run for an hour of
#: simulated time (``LONG_S``) under churn: a fault every ``CHURN_GAP_S``, no agent that
#: leaves for good (no SIGTERM, no shutdown), every host that crashes or loses power started
#: again (by its scheduler), some as a new node (``FRESH_SHARE``: a pod rescheduled
#: elsewhere, its state gone, a new node id). What a minute does not show: a slow leak, a
#: table that grows with every id ever seen, a job that recovers once but not the fortieth.
LONG_SHARE = 0.005
LONG_SALT = 0x10A6
LONG_S = 3600.0
CHURN_GAP_S = (20.0, 120.0)
FRESH_SHARE = 0.3
#: The faults of the churn: all but those that end the job or let an agent go for good.
CHURN_KINDS = tuple(k for k in KINDS if k not in ("shutdown", "sigterm", "sigterm_at_accept"))
#: What a long seed keeps of its first minute's faults: those of the churn, and those drawn
#: apart that let no agent go for good (a garble, the moments of a switch and a proposal, an
#: island): a fault of a moment that comes only after the first minute is tried there too.
KEPT_BY_LONG = frozenset(CHURN_KINDS) | {
    "garble",
    "power_at_switch",
    "newcomer_at_propose",
    "overheard",
    "isolate_at_won",
    "power_at_successor",
}
#: How long after its time a fault of a moment waits for that moment.
TRIGGER_S = 6.0
AT_ACCEPT = frozenset(k for k in KINDS if k.endswith("_at_accept")) | {
    "power_at_switch",
    "isolate_at_won",
    "power_at_successor",
}
AT_PROPOSE = frozenset({"newcomer_at_propose", "sigterm_at_propose"})
TRIGGERS = AT_ACCEPT | AT_PROPOSE | {"close_at_training"}
FAULT_KINDS = (
    frozenset(KINDS)
    | {"garble", "newcomer_cut", "power_at_switch", "overheard", "last_word", "isolate_at_won"}
    | {"power_at_successor", "close_at_training"}
) - {
    "workers_fail",
    "sigterm",
    "shutdown",
}
#: (``preempt`` is not one: its notice is a leave, and the power loss it brings counts itself.)


@dataclass(frozen=True)
class Event:
    """One fault or workload event: what, when, on which host, for how long, with what."""

    at: float
    kind: str
    node: int = -1
    dur: float = 0.0
    args: tuple[object, ...] = ()

    @property
    def ends(self) -> float:
        return self.at + self.dur


@dataclass(frozen=True)
class Scenario:
    seed: int
    hosts: int
    min_nodes: int
    max_nodes: int
    secret: bool
    #: When each host's first agent starts (late joiners start later).
    starts: tuple[float, ...]
    events: tuple[Event, ...]
    #: Indices of the generated events this run keeps (all of them, unless shrunk).
    kept: tuple[int, ...] = ()
    #: Each host has a place in rank order (``rank_order=topology``-like labels); else none.
    places: bool = False

    @property
    def heal_at(self) -> float:
        """When the last event has ended (the network whole, every frozen process thawed, the
        workload's last worker failure or restart done)."""
        return max([*(e.ends for e in self.events), max(self.starts)])

    def only(self, keep: Iterable[int]) -> Scenario:
        """The same scenario with only the events of these indices (of the full schedule)."""
        full = generate(self.seed)
        wanted = sorted(set(keep))
        return replace(full, events=tuple(full.events[i] for i in wanted), kept=tuple(wanted))

    def kept_indices(self) -> tuple[int, ...]:
        return self.kept or tuple(range(len(self.events)))

    def describe(self) -> str:
        shape = f"{self.hosts} hosts, min {self.min_nodes} max {self.max_nodes}"
        shape += ", secret" if self.secret else ", no secret"
        shape += ", places" if self.places else ""
        shape += ", long" if self.heal_at > FAULTS_UNTIL_S + max(CHURN_GAP_S) + TRIGGER_S + 10.0 else ""
        late = [f"{i}@{t:.1f}s" for i, t in enumerate(self.starts) if t > 1.0]
        if late:
            shape += f", late {' '.join(late)}"
        lines = [f"seed {self.seed}: {shape}"]
        for index, e in zip(self.kept_indices(), self.events, strict=True):
            args = f" {json.dumps(list(e.args))}" if e.args else ""
            dur = f" for {e.dur:.2f}s" if e.dur else ""
            node = f" host {e.node}" if e.node >= 0 else ""
            lines.append(f"  [{index}] {e.at:6.2f}s {e.kind}{node}{dur}{args}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        """A scenario written by ``to_json`` (a regression kept as it was found, whatever the
        generator draws for its seed today)."""
        data = json.loads(text)
        events = tuple(
            Event(e["at"], e["kind"], e["node"], e["dur"], tuple(e["args"])) for e in data.pop("events")
        )
        return cls(**{**data, "starts": tuple(data["starts"]), "kept": tuple(data["kept"])}, events=events)


def generate(seed: int) -> Scenario:
    """The scenario of ``seed``: 3 to 9 hosts, elastic or fixed, with or without spares and a
    secret, and 1 to 10 faults and workload events, several at once."""
    rng = random.Random(seed)
    hosts = rng.randint(3, 9)
    shape = rng.choice(("elastic", "elastic", "fixed", "spares"))
    if shape == "fixed":
        min_nodes = max_nodes = hosts
    elif shape == "spares":
        max_nodes = rng.randint(2, hosts - 1)
        min_nodes = rng.randint(1, max_nodes)
    else:
        max_nodes = hosts
        min_nodes = rng.randint(1, hosts)
    secret = rng.random() < 0.4
    starts = tuple(
        rng.uniform(1.0, 8.0) if rng.random() < 0.15 else rng.uniform(0.0, 0.3) for _ in range(hosts)
    )
    kinds = [k for k in KINDS if secret or k != "rogue"]
    weights = [KINDS[k] for k in kinds]
    events = [_event(rng, rng.choices(kinds, weights)[0], hosts) for _ in range(rng.randint(1, 10))]
    events = (
        _with_garbled_cuts(seed, _with_fins(seed, events))
        + _garbles(seed, hosts)
        + _startup(seed, hosts)
        + _regroup(seed, hosts)
        + _shatter(seed, hosts, min_nodes)
    )
    events += _newcomer(seed) + _preempt(seed, hosts) + _leave_at_propose(seed) + _switch(seed, hosts)
    events += _overheard(seed, hosts, min_nodes, secret) + _last_word(seed) + _won(seed) + _successor(seed)
    events += _close_at_training(seed)
    events = _long(seed, hosts, max_nodes, secret, events)
    events.sort(key=lambda e: e.at)
    # Places from the seed's parity, not from ``rng``: what the generator draws stays the same.
    return Scenario(seed, hosts, min_nodes, max_nodes, secret, starts, tuple(events), places=seed % 2 == 1)


def _with_fins(seed: int, events: list[Event]) -> list[Event]:
    """A share of the partitions close connections with a FIN (``FIN_SHARE``), drawn from a
    stream of their own: every other draw of the seed stays as it was."""
    rng = random.Random(seed ^ FIN_SALT)
    return [
        replace(e, args=("fin", *e.args[1:]))
        if e.kind in ("partition", "partition_at_accept") and rng.random() < FIN_SHARE
        else e
        for e in events
    ]


def _with_garbled_cuts(seed: int, events: list[Event]) -> list[Event]:
    """A share of the silent partitions mangle what crosses them first (``GARBLE_CUT_SHARE``),
    drawn from a stream of their own."""
    rng = random.Random(seed ^ GARBLE_CUT_SALT)
    return [
        replace(e, args=("garble", *e.args[1:]))
        if e.kind in ("partition", "partition_at_accept")
        and e.args[0] == "drop"
        and rng.random() < GARBLE_CUT_SHARE
        else e
        for e in events
    ]


def _garbles(seed: int, hosts: int) -> list[Event]:
    """``garble`` faults, drawn from a stream of their own (added after the others: the seeds
    drawn before it keep every other event they had)."""
    rng = random.Random(seed ^ GARBLE_SALT)
    if rng.random() >= GARBLE_SHARE:
        return []
    at = round(rng.uniform(FAULTS_FROM_S, FAULTS_UNTIL_S), 3)
    sends = rng.randint(1, 3)
    return [Event(at, "garble", rng.randrange(hosts), dur=round(rng.uniform(0.5, 6.0), 3), args=(sends,))]


def _startup(seed: int, hosts: int) -> list[Event]:
    """A split armed from the job's start (``STARTUP_SHARE``), from a stream of its own."""
    rng = random.Random(seed ^ STARTUP_SALT)
    if rng.random() >= STARTUP_SHARE:
        return []
    return [replace(_event(rng, "partition_at_accept", hosts), at=0.0)]


def _switch(seed: int, hosts: int) -> list[Event]:
    """A power loss at the first vote that replaces another term's (``SWITCH_SHARE``), from a
    stream of its own."""
    rng = random.Random(seed ^ SWITCH_SALT)
    if rng.random() >= SWITCH_SHARE:
        return []
    # Any host (none runs yet); no length of its own: its power loss ends by ``heal_at``.
    return [replace(_event(rng, "power_at_switch", hosts), at=0.0, node=-1, dur=0.0)]


def _overheard(seed: int, hosts: int, min_nodes: int, secret: bool) -> list[Event]:
    """Hosts cut off from the start, enough to found a job (``min_nodes``) and as many left,
    overheard by one of the others (``OVERHEARD_SHARE``, with a secret: the island's clocks
    step), from a stream of its own: ``args`` are the island's hosts, how late the others'
    leader's frames reach that node (below the heartbeat timeout: it stays), how long their
    first leader is down, how far the island's clocks step back, and the number the base of
    the others' proposal that opens it must reach (0: their first proposal)."""
    rng = random.Random(seed ^ OVERHEARD_SALT)
    if rng.random() >= OVERHEARD_SHARE or 2 * min_nodes > hosts or not secret:
        return []
    island = sorted(rng.sample(range(hosts), min_nodes))
    apart, late = round(rng.uniform(6.0, 10.0), 3), round(rng.uniform(0.6, 0.9), 3)
    hold, skew = round(rng.uniform(1.6, 3.0), 3), round(rng.uniform(40.0, 100.0), 1)
    # Half the islands are heard once the others formed past round 1 (``OVERHEARD_AFTER``).
    after = OVERHEARD_AFTER if rng.random() < 0.5 else 0
    return [Event(0.0, "overheard", dur=apart, args=(island, late, hold, skew, after))]


def _won(seed: int) -> list[Event]:
    """A leader cut off as a proposal of its wins (``WON_SHARE``), from a stream of its own:
    the event names no host (the leader when it comes); ``dur``: how long it is cut off."""
    rng = random.Random(seed ^ WON_SALT)
    if rng.random() >= WON_SHARE:
        return []
    at, cut = round(rng.uniform(FAULTS_FROM_S, FAULTS_UNTIL_S), 3), round(rng.uniform(3.0, 8.0), 3)
    return [Event(at, "isolate_at_won", -1, dur=TRIGGER_S + cut, args=(cut,))]


def _successor(seed: int) -> list[Event]:
    """A successor's leader powered off as a node votes for it (``SUCCESSOR_SHARE``), from a
    stream of its own: the event names no host (that leader when it comes); ``args``: how long
    it is down."""
    rng = random.Random(seed ^ SUCCESSOR_SALT)
    if rng.random() >= SUCCESSOR_SHARE:
        return []
    at, back = round(rng.uniform(FAULTS_FROM_S, FAULTS_UNTIL_S), 3), round(rng.uniform(0.5, 4.0), 3)
    return [Event(at, "power_at_successor", -1, dur=TRIGGER_S + back, args=(back,))]


def _close_at_training(seed: int) -> list[Event]:
    """The job closed as a round trains, with one of its members lost (``CLOSE_SHARE``), from a
    stream of its own: the event names no host (the round's when it comes)."""
    rng = random.Random(seed ^ CLOSE_SALT)
    if rng.random() >= CLOSE_SHARE:
        return []
    at, after = round(rng.uniform(FAULTS_FROM_S, FAULTS_UNTIL_S), 3), round(rng.uniform(0.0, 1.2), 3)
    return [Event(at, "close_at_training", -1, dur=TRIGGER_S, args=(after,))]


def _last_word(seed: int) -> list[Event]:
    """The job's frozen leader left alone, shut down, and a new node (``LAST_WORD_SHARE``),
    from a stream of its own: the event names no host (the leader when it comes)."""
    rng = random.Random(seed ^ LAST_WORD_SALT)
    if rng.random() >= LAST_WORD_SHARE:
        return []
    at, frozen = round(rng.uniform(FAULTS_FROM_S, FAULTS_UNTIL_S), 3), round(rng.uniform(3.0, 6.0), 3)
    return [Event(at, "last_word", -1, dur=frozen, args=(round(rng.uniform(0.2, 1.5), 3),))]


def _shatter(seed: int, hosts: int, min_nodes: int) -> list[Event]:
    """Every host apart from the job's start, then one that only speaks (``SHATTER_SHARE``),
    from a stream of its own."""
    rng = random.Random(seed ^ SHATTER_SALT)
    if rng.random() >= SHATTER_SHARE or hosts < 6 or min_nodes > 1:
        return []
    apart = round(rng.uniform(3.0, 6.0), 3)
    loner = rng.randrange(hosts)
    others = [h for h in range(hosts) if h != loner]
    speaks = round(rng.uniform(4.0, 10.0), 3)
    return [
        Event(0.0, "partition", dur=apart, args=("drop", False, [[h] for h in range(hosts)])),
        # One way: nothing of the others reaches the loner (``_do_partition``: side 0 to the rest).
        Event(apart, "partition", dur=speaks, args=("drop", True, [others, [loner]])),
    ]


def _regroup(seed: int, hosts: int) -> list[Event]:
    """A split from the job's start, then another that moves one host across (``REGROUP_SHARE``),
    from a stream of its own."""
    rng = random.Random(seed ^ REGROUP_SALT)
    if rng.random() >= REGROUP_SHARE:
        return []
    order = list(range(hosts))
    rng.shuffle(order)
    cut = rng.randint(1, hosts - 1)
    groups = [order[:cut], order[cut:]]
    first = round(rng.uniform(1.0, 6.0), 3)
    mode = rng.choice(("drop", "reset"))
    side = rng.randrange(2) if min(cut, hosts - cut) > 1 else (0 if cut > 1 else 1)
    mover = groups[side][-1]
    moved = [[h for h in g if h != mover] for g in groups]
    moved[1 - side].append(mover)
    return [
        Event(0.0, "partition", dur=first, args=(mode, False, groups)),
        Event(first, "partition", dur=round(rng.uniform(2.0, 8.0), 3), args=(mode, False, moved)),
    ]


def _newcomer(seed: int) -> list[Event]:
    """A new member cut off as its round is proposed, and restarted meanwhile (``NEWCOMER_SHARE``),
    from a stream of its own: ``args`` are when the restart comes into the cut and how long the
    host has no agent."""
    rng = random.Random(seed ^ NEWCOMER_SALT)
    if rng.random() >= NEWCOMER_SHARE:
        return []
    at = round(rng.uniform(0.0, FAULTS_UNTIL_S), 3)
    cut = round(rng.uniform(3.0, 8.0), 3)
    restart_after, down = round(rng.uniform(0.1, 2.0), 3), round(rng.uniform(0.2, 1.5), 3)
    return [Event(at, "newcomer_at_propose", dur=TRIGGER_S + cut, args=(cut, restart_after, down))]


def _preempt(seed: int, hosts: int) -> list[Event]:
    """A spot preemption: the notice, then the host down soon after (``PREEMPT_SHARE``), from a
    stream of its own."""
    rng = random.Random(seed ^ PREEMPT_SALT)
    if rng.random() >= PREEMPT_SHARE:
        return []
    at = round(rng.uniform(FAULTS_FROM_S, FAULTS_UNTIL_S), 3)
    down_after, back = round(rng.uniform(0.0, 1.5), 3), round(rng.uniform(0.5, 4.0), 3)
    return [Event(at, "preempt", rng.randrange(hosts), dur=back, args=(down_after,))]


def _leave_at_propose(seed: int) -> list[Event]:
    """SIGTERM to a member as a round that counts it is proposed (``LEAVE_SHARE``), from a
    stream of its own."""
    rng = random.Random(seed ^ LEAVE_SALT)
    if rng.random() >= LEAVE_SHARE:
        return []
    return [Event(round(rng.uniform(0.0, FAULTS_UNTIL_S), 3), "sigterm_at_propose", dur=TRIGGER_S)]


def _long(seed: int, hosts: int, max_nodes: int, secret: bool, events: list[Event]) -> list[Event]:
    """A long seed (``LONG_SHARE``, from a stream of its own: the seeds drawn before it keep
    every event they had): its first minute's faults, none that lets an agent go for good,
    then an hour of churn. Hosts come back as new nodes only where rounds have three members
    or more: one of two that never returns takes a vote the job can never win again (it
    waits, and ends at its join timeout, as it should: nothing left to run an hour)."""
    rng = random.Random(seed ^ LONG_SALT)
    if rng.random() >= LONG_SHARE:
        return events
    kinds = [k for k in CHURN_KINDS if secret or k != "rogue"]
    weights = [KINDS[k] for k in kinds]
    out = [_lasting(rng, e, fresh=False) for e in events if e.kind in KEPT_BY_LONG]
    at = FAULTS_UNTIL_S + rng.uniform(*CHURN_GAP_S)
    while at < LONG_S:
        e = replace(_event(rng, rng.choices(kinds, weights)[0], hosts), at=round(at, 3))
        if e.kind in ("partition", "partition_at_accept") and rng.random() < FIN_SHARE:
            e = replace(e, args=("fin", *e.args[1:]))
        out.append(_lasting(rng, e, fresh=rng.random() < FRESH_SHARE and max_nodes >= 3))
        at += rng.uniform(*CHURN_GAP_S)
    return out


def _lasting(rng: random.Random, e: Event, *, fresh: bool) -> Event:
    """``e``, with a host that crashes or loses power started again (``fresh``: as a new node)."""
    if e.kind not in ("crash", "power"):
        return e
    back = e.dur if e.args else round(rng.uniform(1.0, 6.0), 3)
    return replace(e, dur=back, args=("restart", "fresh") if fresh else ("restart",))


def _event(rng: random.Random, kind: str, hosts: int) -> Event:
    at = round(rng.uniform(FAULTS_FROM_S, FAULTS_UNTIL_S), 3)
    node = rng.randrange(hosts)
    if kind in ("crash", "power"):
        # Half the time the host runs a new agent later (the scheduler restarts it).
        back = round(rng.uniform(1.0, 6.0), 3) if rng.random() < 0.5 else 0.0
        return Event(at, kind, node, dur=back, args=("restart",) if back else ())
    if kind == "restart":
        return Event(at, kind, node, dur=round(rng.uniform(0.2, 4.0), 3))
    if kind == "freeze":
        return Event(at, kind, node, dur=round(rng.uniform(0.3, 6.0), 3))
    if kind == "partition":
        order = list(range(hosts))
        rng.shuffle(order)
        sides = rng.choice((2, 2, 3)) if hosts >= 3 else 2
        cuts = sorted(rng.sample(range(1, hosts), sides - 1))
        groups = [order[a:b] for a, b in zip([0, *cuts], [*cuts, hosts], strict=True)]
        mode = rng.choice(("drop", "reset"))
        oneway = rng.random() < 0.25
        return Event(at, kind, dur=round(rng.uniform(0.5, 8.0), 3), args=(mode, oneway, groups))
    if kind == "isolate":
        return Event(at, kind, node, dur=round(rng.uniform(0.5, 6.0), 3))
    if kind == "impair":
        drop = round(rng.choice((0.0, 0.2, 0.5)), 2)
        dup = round(rng.choice((0.0, 0.2)), 2)
        spike = round(rng.choice((0.0, 0.05, 0.5)), 2)
        return Event(at, kind, node, dur=round(rng.uniform(1.0, 6.0), 3), args=(drop, dup, spike))
    if kind == "stall":
        extra = round(rng.uniform(0.1, 3.0), 3)
        return Event(at, kind, node, dur=round(rng.uniform(0.5, 4.0), 3), args=(extra,))
    if kind == "clock":
        # NTP steps it back later (a clock off by more than the replay window for good would
        # keep a node with a secret out of its job for good: nothing to recover from).
        step = round(rng.choice((-1, 1)) * rng.uniform(1.0, 120.0), 1)
        return Event(at, kind, node, dur=round(rng.uniform(0.5, 8.0), 3), args=(step,))
    if kind in ("forge", "replay"):
        return Event(at, kind, args=(rng.randint(1, 20),))
    if kind == "unfit":
        return Event(at, kind, node, dur=round(rng.uniform(0.5, 6.0), 3))
    if kind in ("power_at_accept", "sigterm_at_accept", "power_at_switch"):
        back = round(rng.uniform(0.5, 4.0), 3)
        return Event(at, kind, rng.choice((-1, node)), dur=TRIGGER_S + back, args=(back,))
    if kind == "partition_at_accept":
        cut = _event(rng, "partition", hosts)
        return Event(at, kind, dur=TRIGGER_S + cut.dur, args=(*cut.args, cut.dur))
    if kind == "rogue":
        return Event(at, kind, node, dur=round(rng.uniform(0.5, 5.0), 3), args=(rng.random() < 0.5,))
    return Event(at, kind, node)  # workers_fail, sigterm, shutdown, reset_conns
