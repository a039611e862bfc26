"""Runs one scenario: the production ``Node`` of every host in the simulator, torch's agents
reduced to what the rendezvous sees of them, the scenario's faults, and the invariants.

The agents act as torch's elastic agent does: ``next_rendezvous`` (a join), then the round
runs until ``num_nodes_waiting() > 0`` (polled every ``MONITOR_S``) or a worker fails, and
the agent joins again; at the end each arrives at the exit barrier and shuts down. An agent
whose join times out shuts down (torch's launcher does, and that closes the job); SIGTERM
leaves; a crash does nothing. Every check runs after every monitor step (``MONITOR_S`` of
simulated time); the first violation stops the run.

Invariants (``INVARIANTS``; each one is shown failing on a deliberately broken rule by
``tests/swarm/test_swarm.py``):

* ``one-round``: no two rounds of the job train at the same time: a round trains from the
  moment every member's agent runs it until the first member stops running it (it joins
  again, dies, leaves, or its workers finish). The one exception is causal: a round may
  train beside a training round of another lineage (``_Round.lineage``: what a first round
  founds) only if none of its members could have heard of that lineage, directly or through
  anything any node sent it, transitively (``Simulation.track_knowledge``), and no node is a
  member of a round of each (a member counted in a round it never heard of is still in that
  job): islands that never heard of each other. A lineage's later rounds are judged so too,
  not only its first: a term that heard of another line's round forms nothing beside it
  (``OtherTerms.unaccounted``). Each member is judged by what it knew at its
  accept, or, for a round formed from a base before its accept, when the round formed
  (``knew_at_accept``). A new process under a node's id knows what its
  state file kept and what its node knew as its joins went out (the rule "what a node heard of
  is on the disk before it joins" covers that; ``_record_heard``). And once a node was a
  member of a round of each of two lineages, they are one job: no round of one trains beside
  a round of the other, first rounds or not (the lineage that continues after they met is
  not the fork, so long as the other stops).
* ``ranks``: a round's ranks are 0..n-1, each node once; rank 0 is the leader that formed
  it, and the store is at rank 0's address.
* ``world``: ``next_rendezvous()`` (the handler's policy, ``_agent.JoinFlow``) gives the node
  its rank and its round's size, and torch's rank exchange through the round's store (under
  ``AgentStore``'s rules: ``_world``) starts every member's workers at the ranks of its place
  in a world of the round's every worker, stand-ins included; a refusal by ``_world.checked``
  fails it too (it says "a bug in torch_mingle").
* ``success``: an agent exits 0 without having trained only as a spare of a job whose work
  finished (an agent whose workers ran shut down cleanly).
* ``false-failure``: no agent fails for a fault that heals: a data path check that failed
  while its round held (every cut here cuts the control plane too, so the round breaks
  first), or a store call of the rank exchange that failed before the node said its round
  broke.
* ``rank-order``: where hosts have places, a job's first round's ranks read as a ring from
  rank 0 visit the members' places in ascending order exactly once around; a round formed from
  another keeps its members' ranks (``_rounds.keep_ranks``: but rank 0, the leader's, and ranks
  past the new end) and gives the free ones to newcomers in place order.
* ``token``: the fencing token (epoch, round) handed to workers only grows: per agent, and
  from one training round to the next (the round number too: it grows across terms). No two
  rounds that train share a token, but rounds of causally isolated lineages (as ``one-round``
  judges them), and a term (epoch, leader) is led by one process only (``_record_terms``).
* ``secret``: a host without the secret never has a connection the leader identified: so it
  is never in a round, never evicts a member, never makes ``num_nodes_waiting()`` non-zero.
* ``quorum``: a round formed from a base round was accepted by a majority of that base's
  voters, counted from what happened, not from what any node concluded: every member of the
  base votes unless it said it leaves while that base was the newest round it was in or voted
  for (its leave, or its accept of this very round, is the truth). Quorum is what keeps two
  successors of one round from forming on two sides of a partition; this checks the
  arithmetic the moment it is used, before a fork needs a second side to show it.
* ``successors``: two proposals of different terms, formed from one base round, that each won
  a majority of that base's voters (so each may have formed, whatever its leader did next):
  the leader of the one proposed later knew of the other (its ``covers`` name it or a later
  proposal of its term, or a proposal that accounted for it in turn). This is the claim
  ``_rounds`` makes for its quorum ("the second one's leader knew of the first"), checked
  when the second wins, not when a fork trains. Proposed later, not won later: a frozen voter
  may complete the older proposal's majority after the newer one formed (seed 3035215), and
  the newer one, which accounted for it, is its successor. And the step of that claim at
  each vote: a node's vote for a proposal of another term than its previous vote, built on a
  base older than that vote, names it (or a later proposal of its term) in ``covers``; built
  on a base numbered as that vote or above, the base's chain (its bases and what each
  covered, transitively) or the covers knew of it, unless it won no majority by then (if it
  wins one later, the check above judges it). No number excuses it: a base of another line
  numbered as high says nothing of it (seed 64005782: a round taken in as a rival and named
  nowhere). Its previous vote is the truth's, across its processes, not what its state file kept.
* ``memory``: at each vote, every round the node voted for and heard formed (what a node
  hears of names only rounds that formed: ``Heard``) is accounted for by its state: its
  history is that round or a later one, or its vote is for it or names it among its lines. A
  node that forgot it (its next vote replaced the only record of it) leaves a term that heard
  of the round with none of its members to account for it, and no quorum forms again (seed
  30071042). And from the truth, at each vote, as a round forms and when a new process of a
  node starts: every round that formed with the node's vote is kept by its state (as above,
  or among the votes of other terms its later votes replaced, ``Ballot.earlier``) until the
  node votes for a later proposal of the same term, whose leader forms none of the earlier
  one once it made it (seed 40003081: a covering vote of another term replaced the record of
  a round that formed after all). A round formed once its leader's book took it, whether or
  not an agent ran it (a leader cut off as it forms one delivers it to no agent: its voters
  keep it all the same).
* ``bounded-wait``: every agent call returns within its bound (docs/faults.md#every-wait-and-its-bound),
  and so does each of the handler's own waits (a store try, the probe, the look for a broken
  round) and torch's rank exchange (``join_timeout`` from the delivery).
* ``recovery``: after the last fault heals, if a majority of the last round's voters are
  alive and at least ``min_nodes`` agents are, every live agent is in one round (or parked
  as a spare beside a full one) within ``recovery_bound_s()``. A member whose leave a live
  leader of that round heard is no voter (``_left_before``). So too a majority of each round
  of another line that a live leader knows a joiner was in (``OtherTerms.rivals``).
* ``resources``: per-node state (peers, suspects, store ports, connections, pending joins,
  what a leader keeps per node, remembered nonces) stays under bounds that do not grow with
  time, rounds or the ids ever seen: the ids that are part of the job now (alive within
  ``LINGER_S``, or members of a leader's round), or a cache's fixed cap. The long seeds
  (``scenario.LONG_SHARE``: an hour of churn, hosts replaced under new ids) are where a slow
  leak would show.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.swarm import scenario as sc
from torch_mingle._agent import ExitClean, Fail, Failure
from torch_mingle._claims import Timing
from torch_mingle._keys import age
from torch_mingle._leader import LeaderTerm
from torch_mingle._places import natural_key
from torch_mingle._ports import ROUND_STORES_KEPT
from torch_mingle._protocol import MAX_CANDIDATES, MAX_PEERS, MAX_SUSPECTS
from torch_mingle._ready import HealthJudged
from torch_mingle._records import JobEnd, Round, node_hex
from torch_mingle._rounds import MAX_HOLD_DOUBLINGS, Form
from torch_mingle._view import Joined
from torch_mingle._wire import (
    MAX_REMEMBERED_NONCES,
    Announce,
    Codec,
    Datagram,
    Resign,
    derive_key,
    encode_frame,
)
from torch_mingle.testing.agents import Agent, Agents, Phase
from torch_mingle.testing.net import DROP, FIN, GARBLE, RESET, Delivery, Impairment
from torch_mingle.testing.sim import SimNode, Simulation

MONITOR_S = 0.1
ROGUE_ADDR = ("10.255.0.1", 29477)
SECRET = b"the swarm's shared secret"
#: What torchrun's agent gives a node to leave (SIGTERM) and to report its exit barrier.
LEAVE_TIMEOUT_S = min(sc.CLOSE_TIMEOUT_S, 15.0)
ARRIVE_TIMEOUT_S = min(5.0, sc.INTERVAL_S * sc.ATTEMPTS)
#: Scheduling slack on top of a bound: the agent's own poll (``MONITOR_S``) and the loop.
SLACK_S = 2 * MONITOR_S + 0.05
#: How long a node id that no process runs under any longer may still be in other nodes'
#: tables (``resources``): the longest fault (a partition or a freeze holds a dead node's
#: connection open), its heartbeat timeout and its close, with room.
LINGER_S = 30.0
#: How long the swarm lets a job run in peace after recovery before it finishes.
DWELL_S = 1.0
#: A bad link spoils sends for this long before it goes dark (``_do_garble``).
GARBLE_FOR_S = 0.05
#: A fault of the moment a vote goes out strikes this long after it (the accept is on the wire).
VOTE_OUT_S = 0.0005
#: How long after a round starts training ``close_at_training`` powers off a member: its
#: workers run by then (the rank exchange takes milliseconds here).
CLOSE_RUNS_S = 0.3

INVARIANTS = (
    "one-round", "quorum", "successors", "ranks", "world", "success", "false-failure", "rank-order",
    "token", "secret", "memory", "bounded-wait", "recovery", "resources", "book",
)  # fmt: skip


def local_world_size(seed: int) -> int:
    """How many workers each agent of a seed runs (``--nproc_per_node``, the same on every host)."""
    return 1 + (seed >> 3) % 3


def timing() -> Timing:
    return Timing.for_keep_alive(sc.ELECTION_WINDOW_S, sc.INTERVAL_S, sc.ATTEMPTS)


def recovery_bound_s(hosts: int) -> float:
    """The bound on "every live node is in one round" after the last fault heals (docs/faults.md):
    detection on both sides, one successor wait per member passed over, a suspicion to run
    out, the last call, and the longest hold of a returning node (``rejoin_delay`` doubled
    for each time it was dropped, at most ``MAX_HOLD_DOUBLINGS`` times)."""
    t = timing()
    detect = 2 * t.leader_timeout_s
    elect = (hosts + 1) * t.successor_wait_s + t.claim_wait_s + t.suspect_ttl_s
    hold = sc.REJOIN_DELAY_S * 2**MAX_HOLD_DOUBLINGS
    return float(detect + elect + sc.LAST_CALL_S + hold + 1.0)


class Violation(Exception):
    def __init__(self, invariant: str, detail: str, at: float) -> None:
        super().__init__(f"{invariant} at {at:.3f}s: {detail}")
        self.invariant = invariant
        self.detail = detail
        self.at = at


@dataclass
class Outcome:
    scenario: sc.Scenario
    violation: Violation | None
    sim_s: float
    node_s: float
    faults: Counter[str]
    checks: int
    rounds: int
    isolated_overlaps: int
    recovered_after_s: float | None


#: How long after the others' first round past the island's trains one of its members' workers
#: fail (``_nudge``): they run by then.
NUDGE_S = 0.3
#: How long after the others' power loss a ``last_word`` leader freezes: past the heartbeat
#: timeout, so it counted them lost.
LAST_WORD_LOST_S = 2.5


@dataclass
class _Island:
    """An ``overheard`` fault's island (``World._overhear``): its event, the cut that keeps it
    apart now, and whether the others' first leader lost power already."""

    event: sc.Event
    cut: int
    powered_off: bool = False
    #: With ``OVERHEARD_AFTER``: a member of the others' first round numbered that or above had
    #: its workers fail, so that their next proposal is formed from it.
    nudged: bool = False


@dataclass
class _Round:
    key: tuple[int, int, int]  # (epoch, leader, number)
    members: tuple[int, ...]
    #: Each round is formed from a base round (``Round.base``); a first round starts a lineage of
    #: its own: before its first round a job is a set of strangers, and a side of a network
    #: split at start-up cannot tell itself from a new job (docs/faults.md#what-does-not-survive).
    #: Rounds of two lineages may train at the same time only where no member of the later
    #: one could have heard of the other (counted: ``isolated_overlaps``); else it is a fork.
    lineage: int = 0
    delivered: set[int] = field(default_factory=set)
    training_since: float | None = None
    ended: bool = False


@dataclass
class _Agent(Agent):
    """torch's agent (``testing.agents``), with what the harness checks of it."""

    #: The fencing tokens (epoch, round) of the rounds it ran, in order (``token``).
    tokens: list[tuple[int, int]] = field(default_factory=list)
    thawed_at: float = 0.0


class World(Agents[_Agent]):
    agent_class = _Agent

    def __init__(self, scenario: sc.Scenario, *, inherit_identity: bool = True) -> None:
        self.sc = scenario
        self.inherit_identity = inherit_identity
        self.rng = random.Random(scenario.seed ^ 0x5EED)
        self.sim = Simulation(
            0,
            seed=scenario.seed,
            timing=timing(),
            key=derive_key(SECRET) if scenario.secret else None,
            min_nodes=scenario.min_nodes,
            max_nodes=scenario.max_nodes,
            last_call_timeout_s=sc.LAST_CALL_S,
            rejoin_delay_s=sc.REJOIN_DELAY_S,
            expect_all=True,
        )
        self.sim.after_step = self._check_book_of
        Agents.__init__(
            self,
            self.sim,
            join_timeout_s=sc.JOIN_TIMEOUT_S,
            close_timeout_s=sc.CLOSE_TIMEOUT_S,
            leave_timeout_s=LEAVE_TIMEOUT_S,
            arrive_timeout_s=ARRIVE_TIMEOUT_S,
            local_world_size=local_world_size(scenario.seed),
        )
        self.rounds: dict[tuple[int, int, int], _Round] = {}
        #: Each proposal a node accepted, by its key: the round it was formed from, its members.
        self.accepted: dict[tuple[int, int, int], tuple[tuple[int, int, int] | None, tuple[int, ...]]] = {}
        #: Who accepted each proposal (by node id), and each node that said it leaves, with the
        #: newest round it was in or voted for when it did (``quorum``).
        self.acceptors: dict[tuple[int, int, int], set[int]] = {}
        #: Each node's last vote (by node id, across its processes) (``successors``).
        self.last_vote: dict[int, tuple[int, int, int]] = {}
        #: The proposals each node id voted for, in order, across its processes (``memory``).
        self.voted: dict[int, list[tuple[int, int, int]]] = {}
        self.said_left: dict[int, tuple[int, int, int] | None] = {}
        #: Per base round, the proposals formed from it that won a majority of its voters, each
        #: with the proposals its leader accounted for (``successors``).
        self.won: dict[
            tuple[int, int, int], list[tuple[tuple[int, int, int], frozenset[tuple[int, int, int]]]]
        ] = {}
        #: What each member knew when it accepted each proposal (``one-round``, ``token``): a
        #: round is judged by what its members had heard when they committed to it (their last
        #: accept before it formed), or, for a round formed from a base, when it formed, for a
        #: member whose accept came after (its accept decided nothing: seed 1567, a member whose
        #: leader's frames came late heard of an island after its round had formed on the
        #: others' votes, before the round reached it).
        self.knew_at_accept: dict[tuple[int, int, int], dict[int, frozenset[object]]] = {}
        #: Per term (epoch, leader) that closed the job, whether the close that did it was a
        #: failure, by what happened (the closing agent failed, or its round could not start).
        self.term_failed: dict[tuple[int, int], bool] = {}
        #: What each node id knew when its joins went out (``_record_heard``), across its processes.
        self.joined_knowing: dict[int, frozenset[object]] = {}
        #: The process that led each term (epoch, leader) (``token``).
        self.term_process: dict[tuple[int, int], SimNode] = {}
        #: The proposals each proposal's leader accounted for, by its key.
        self.covers: dict[tuple[int, int, int], frozenset[tuple[int, int, int]]] = {}
        #: The rounds a leader's book formed, by key (``_check_book_of``).
        self._formed: set[tuple[int, int, int]] = set()
        #: The proposals that won what forms them (``isolate_at_won`` fires at the first accept
        #: that makes one win).
        self._won_seen: set[tuple[int, int, int]] = set()
        #: When each proposal was first accepted: the order in which they were proposed.
        self.proposed_at: dict[tuple[int, int, int], float] = {}
        self.trained: list[_Round] = []
        self._lineages = itertools.count(1)
        #: The members of every round of each lineage that an agent ran (``one-round``).
        self.lineage_members: dict[int, set[int]] = {}
        #: Rounds of two causally isolated lineages that trained at the same time (counted).
        self.isolated_overlaps = 0
        self.faults: Counter[str] = Counter()
        self.checks = 0
        self._actions: list[tuple[float, int, Callable[[], object]]] = []
        #: Faults armed for the moment a vote goes out (``_voted``).
        self._triggers: list[sc.Event] = []
        #: The ``overheard`` islands still cut off, until the others propose their first round.
        self._overheard: list[_Island] = []
        self._seq = itertools.count()
        self._cut_ids = itertools.count(1)
        #: When each node id (a process of it) was last seen alive, and each id a rogue used
        #: last: the ids that are part of the job now (``resources``).
        self.alive_at: dict[int, float] = {}
        self.rogue_ids: dict[int, float] = {}
        self.rogue_ends: set[int] = set()
        self.captured: list[bytes] = []
        self.recovered_at: float | None = None
        #: When the last fault ends: the scenario's last event, or later where a fault of a
        #: moment that waits for it (``power_at_switch``) fired late.
        self.heal = scenario.heal_at
        self.finishing = False
        #: Since when nothing happened to the job (a fault, an agent starting, a member leaving),
        #: and how many faults are under way: recovery is expected after ``recovery_bound_s``.
        self._quiet_since = 0.0
        self._disturbances = 0
        #: What the agents did (time, host, what): printed with a violation when replayed with -v.
        self.trace: list[tuple[float, int, str]] = []
        self._rogue_mimic = False
        self._rogue_claims: dict[int, LeaderTerm] = {}  # the rogue's stream ends, to the term it calls
        self.sim.observe(ROGUE_ADDR, self._rogue_receive)
        self.sim.track_knowledge()
        for host, start in enumerate(scenario.starts):
            self._spawn(host, start)
        for event in scenario.events:
            self._at(event.at, functools.partial(self._fire, event))

    # ------------------------------------------------------------ running

    def run(self) -> Outcome:
        violation = None
        bound = recovery_bound_s(self.sc.hosts)
        try:
            while True:
                heal = self.heal  # (a fault of a moment that fired late moves it)
                hard_stop = heal + bound + sc.JOIN_TIMEOUT_S + 4 * sc.CLOSE_TIMEOUT_S + 10.0
                now = self.sim.now
                target = now + MONITOR_S
                if self._actions and self._actions[0][0] < target:
                    target = max(now, self._actions[0][0])
                self.sim.run_until(target)
                while self._actions and self._actions[0][0] <= self.sim.now:
                    _, _, fn = heapq.heappop(self._actions)
                    fn()
                self.tick()
                self._check(heal, bound)
                if self._all_exited() and self.sim.now >= heal:
                    break
                if self.sim.now > hard_stop:
                    self._check_all_ended()
                    break
        except Violation as exc:
            violation = exc
        node_s = sum(max(0.0, self.sim.now - a.node.start_at) for a in self.agents)
        return Outcome(
            self.sc,
            violation,
            self.sim.now,
            node_s,
            self.faults,
            self.checks,
            len(self.trained),
            self.isolated_overlaps,
            None if self.recovered_at is None else self.recovered_at - self.heal,
        )

    def _check_all_ended(self) -> None:
        pending = [a for a in self.agents if a.phase is not Phase.EXITED and a.node.alive]
        if pending:
            running = ", ".join(f"host {a.host} {a.phase.value}" for a in pending)
            raise Violation("bounded-wait", f"agents still running at the end: {running}", self.sim.now)

    def _at(self, t: float, fn: Callable[[], object]) -> None:
        heapq.heappush(self._actions, (t, next(self._seq), fn))

    def _all_exited(self) -> bool:
        return all(a.phase is Phase.EXITED for a in self.agents)

    # ------------------------------------------------------------ agents

    def _spawn(self, host: int, at: float, *, node_id: int | None = None) -> _Agent:
        if host in self.by_host:
            node = self.sim.restart(self.by_host[host].node, at, node_id=node_id)
        else:
            node = self.sim.add_node(at, node_id=node_id, place=self._place(host))
        self._record_accepts(node)
        self._record_terms(node)
        self._record_leaves(node)
        self._record_heard(node)
        ballot = node.node.ballot
        kept = [h.key for h in (ballot.history, ballot.accepted, *ballot.earlier) if h is not None]
        for key in (*kept, *ballot.heard.keys):  # its state file's: it knows them
            lineage = self._lineage_known(key)
            if lineage is not None:
                self.sim.learn(node, ("lineage", lineage))
        for key in self._to_keep(node.core.node_id):  # what its predecessors kept (``memory``)
            self._check_named(node, key, heard=False)
        for fact in self.joined_knowing.get(node.core.node_id, frozenset()):
            self.sim.learn(node, fact)  # what its node heard as it joined: the rule puts it on disk
        agent = self.start(host, node, at)
        self.alive_at[node.core.node_id] = at
        self._quiet_since = max(self._quiet_since, at)
        self._note(agent, f"starts node {node_hex(node.core.node_id)[:6]}")
        return agent

    def _record_heard(self, node: SimNode) -> None:
        """What the node's process knew each time its join went out, or it heard more while its
        join waited (``Joining.remember_heard``, the moments the rule "what a node heard of is on
        the disk before it joins" speaks of): the node heard it, whatever its state file kept,
        and a new process under its id knows it too (``one-round`` judges it by that)."""
        joining = node.node.joining
        inner = joining.remember_heard

        def remember(joiner: Any) -> None:
            inner(joiner)
            if joining.open() is not None:
                node_id = node.core.node_id
                self.joined_knowing[node_id] = self.joined_knowing.get(node_id, frozenset()) | self.sim.knows(
                    node
                )

        joining.remember_heard = remember  # type: ignore[method-assign, assignment]

    def _record_accepts(self, node: SimNode) -> None:
        """Every proposal the node accepts, with the round it was formed from: a round may form
        from a proposal that formed and reached no agent (its leader was lost at once)."""
        inner = node.node.vote

        def accept(rnd: Round, base: int, covers: frozenset[tuple[int, int, int]]) -> bool:
            ok = inner(rnd, base, covers)
            if ok:
                key = (rnd.epoch, rnd.members[0], rnd.number)
                before = self.last_vote.get(node.core.node_id)
                self._check_left(node, rnd)
                self._check_vote(node.core.node_id, key, base, covers, rnd.base)
                self.accepted.setdefault(key, (rnd.base, rnd.members))
                self.covers.setdefault(key, covers)
                self.proposed_at.setdefault(key, self.sim.now)
                self.acceptors.setdefault(key, set()).add(node.core.node_id)
                self.voted.setdefault(node.core.node_id, []).append(key)
                knew = self.knew_at_accept.setdefault(key, {})
                if key not in self._formed or node.core.node_id not in knew:  # (see ``_check_book_of``)
                    knew[node.core.node_id] = self.sim.knows(node)
                self._check_successors(key, rnd.base, covers)
                self._check_memory(node)
                # A vote for another term's proposal replaced, by what happened, not by what the
                # node kept of it (``Ballot.earlier``): the moment comes whatever the rule does.
                replaced = before is not None and before[:2] != key[:2] and before != key
                won = key not in self._won_seen and self._may_have_formed(key)
                if won:
                    self._won_seen.add(key)
                self._voted(
                    node,
                    switched=replaced and self._matters(before),
                    won=key if won else None,
                    successor=key if replaced and rnd.base == before else None,
                )
            return ok

        node.node.vote = accept  # type: ignore[method-assign]

    def _record_leaves(self, node: SimNode) -> None:
        """Each node that leaves (SIGTERM or ``shutdown()``), with the newest round it was in or
        voted for, as its process handles it (a frozen process handles its SIGTERM once thawed,
        if it still lives then) (``quorum``)."""
        for name in ("_request_leave", "_request_shutdown"):
            inner = getattr(node.node, name)

            def leave(*args: Any, inner: Callable[..., None] = inner, **kw: Any) -> None:
                key = node.node.own_key()
                inner(*args, **kw)
                if node.node.ballot.left:  # (recorded: its leave may go out)
                    self.said_left.setdefault(node.core.node_id, key)

            setattr(node.node, name, leave)

    def _record_terms(self, node: SimNode) -> None:
        """Every term the process leads: a term (epoch, node id) is one process's, or two could
        hand out the same fencing token (``token``); a restarted process that forgot the epochs
        its node led would lead one of them again."""
        inner = node.node._start_term

        def lead(port: int, now: float) -> None:
            inner(port, now)
            term = node.node.term
            if term is None or term.claim.leader != node.core.node_id:
                return
            epoch = term.claim.epoch
            propose = term._propose

            def proposing(form: Form, port: int, now: float) -> None:
                self._proposing(form)
                propose(form, port, now)

            term._propose = proposing  # type: ignore[method-assign]
            close_job = term.close_job

            def closing(by: int, end: JobEnd, now: float) -> None:
                was_closed = term.book.closed
                close_job(by, end, now)
                if not was_closed and term.book.closed:
                    truth = end.stops_round or self.shut_failed.get(by, False)
                    self.term_failed.setdefault((term.claim.epoch, term.claim.leader), truth)

            term.close_job = closing  # type: ignore[method-assign]
            first = self.term_process.setdefault((epoch, term.claim.leader), node)
            if first is not node:
                raise Violation(
                    "token",
                    f"epoch {epoch} of node {node_hex(term.claim.leader)[:6]} led by two of its processes "
                    f"(incarnations {first.node.settings.incarnation} and {node.node.settings.incarnation}): "
                    "their rounds' tokens (epoch, round) can repeat",
                    self.sim.now,
                )

        node.node._start_term = lead  # type: ignore[method-assign]

    # ------------------------------------------------------------ the agents' hooks

    def failed(self, agent: _Agent, fail: Fail) -> None:
        if fail.kind is Failure.DATA_PATH:
            raise Violation(
                "false-failure",
                f"host {agent.host}: the job failed on its data path check, but every cut in the swarm "
                "cuts the control plane too: the round must break (and the node join again) first",
                self.sim.now,
            )
        if fail.kind is Failure.STATE:  # the node answered what it must not, or lost the call
            raise Violation(
                "bounded-wait", f"host {agent.host}: next_rendezvous() failed: {fail.why}", self.sim.now
            )

    def exited_clean(self, agent: _Agent, clean: ExitClean) -> None:
        """``success``: an agent exits 0 without having trained only as a spare of a job that
        finished its work (an agent whose workers ran shut down cleanly), never when the job
        failed or never ran."""
        self.checks += 1
        view = agent.node.core.leader
        fate = self.term_failed.get((view.claim.epoch, view.claim.leader)) if view is not None else None
        if self.finished_at is None or fate:  # (a failure whose close was lost does not end the job)
            state = "its leader's term closed it as failed" if fate else "no agent's workers finished"
            why = f"host {agent.host} exits 0 ({clean.why}), but {state}"
            raise Violation("success", why, self.sim.now)

    def exchange_failed(self, agent: _Agent, why: str) -> None:
        raise Violation(
            "false-failure",
            f"host {agent.host}: {why}, and the agent fails, but every cut in the swarm heals and "
            "cuts the control plane too: the node must say the round broke first",
            self.sim.now,
        )

    def refused(self, agent: _Agent, why: str) -> None:
        raise Violation("world", f"host {agent.host}: its ranks were refused: {why}", self.sim.now)

    def workers_started(self, agent: _Agent, base: int, world: int) -> None:
        """``world``: an agent's workers start at the ranks of its place in its round, in a world
        of the round's every worker: never a world of their own, whatever broke meanwhile."""
        deliver = agent.deliver
        assert deliver is not None
        local = agent.local_world_size
        want = (deliver.rank * local, len(deliver.joined.round.members) * local)
        self.checks += 1
        if (base, world) != want:
            stood = (
                " (stand-ins: the round broke first)" if agent.exchange and agent.exchange.stood_in else ""
            )
            raise Violation(
                "world",
                f"host {agent.host}: its {local} worker(s) start at rank {base} of a world of {world}"
                f"{stood}, but it is rank {deliver.rank} of {_show(agent.round)}: ranks {want[0]}.. "
                f"of {want[1]}",
                self.sim.now,
            )
        self._note(agent, f"workers start at rank {base} of {world}")

    def noted(self, agent: _Agent, what: str) -> None:
        if what == "joins again" and agent.round is not None:
            what += f" (ends {_show(agent.round)})"
        self._note(agent, what)

    def _note(self, agent: _Agent | None, what: str) -> None:
        self.trace.append((self.sim.now, agent.host if agent is not None else -1, what))

    def round_ended(self, agent: _Agent, rnd: Any) -> None:
        rnd.ended = True

    def round_number(self, agent: _Agent) -> int | None:
        return agent.round.key[2] if agent.round is not None else None

    def delivered(self, agent: _Agent, joined: Joined) -> None:
        now = self.sim.now
        rnd, claim = joined.round, joined.claim
        members = rnd.members
        where = f"round {rnd.number} (epoch {rnd.epoch}) delivered to host {agent.host}"
        self.checks += 1
        if len(set(members)) != len(members) or agent.node_id not in members:
            raise Violation("ranks", f"{where}: members {[node_hex(m) for m in members]}", now)
        deliver = agent.deliver
        if deliver is None or (deliver.rank, deliver.world_size) != (
            members.index(agent.node_id),
            len(members),
        ):
            got = (deliver.rank, deliver.world_size) if deliver is not None else None
            raise Violation("world", f"{where}: next_rendezvous() gave (rank, world size) {got}", now)
        if members[0] != claim.leader or rnd.epoch != claim.epoch:
            raise Violation("ranks", f"{where}: rank 0 is {node_hex(members[0])}, formed by {claim}", now)
        leader_hosts = {a.node.addr[0] for a in self.agents if a.node_id == members[0]}
        if rnd.store_ip not in leader_hosts:
            raise Violation("ranks", f"{where}: store at {rnd.store_ip}, rank 0 on {leader_hosts}", now)
        self._check_rank_order(where, rnd, now)
        token = (rnd.epoch, rnd.number)
        self.checks += 1
        if agent.tokens and token <= agent.tokens[-1]:
            raise Violation("token", f"{where}: token {token} after {agent.tokens[-1]} on that agent", now)
        agent.tokens.append(token)
        key = (rnd.epoch, claim.leader, rnd.number)
        log = self.rounds.get(key)
        if log is None:
            log = self.rounds[key] = _Round(key, members, self._lineage_of(rnd.base))
            # A round may form with no accept (its base's voters all left): its base is known.
            self.accepted.setdefault(key, (rnd.base, rnd.members))
            self.lineage_members.setdefault(log.lineage, set()).update(members)
            self._check_quorum(key, rnd.base, where)
            self._check_kept(key)
        elif log.members != members:
            raise Violation("ranks", f"{where}: members differ from the same round's elsewhere", now)
        log.delivered.add(agent.node_id)
        self.sim.learn(agent.node, ("lineage", log.lineage))
        self._note(agent, f"runs {_show(log)}")
        agent.round = log
        if log.delivered == set(members) and not log.ended:
            self._training(log)
            self._close_at_training(log)

    def _votes(self, key: tuple[int, int, int], base: tuple[int, int, int]) -> tuple[set[int], int] | None:
        """The voters of ``base``, from the truth (``quorum``), and how many of them accepted
        proposal ``key``; None where no node ran or accepted ``base``."""
        known = self.rounds.get(base)
        if known is None and base not in self.accepted:
            return None
        members = set(known.members if known is not None else self.accepted[base][1])
        accepted = self.acceptors.get(key, set())
        voters = {m for m in members if self._votes_on(m, base)}
        voters |= accepted & members  # its accept of this round came before any leave
        return voters, len(voters & accepted)

    def _votes_on(self, member: int, base: tuple[int, int, int]) -> bool:
        """Whether ``member`` of ``base`` votes on its successor, by what happened: unless it said
        it leaves while ``base`` or an older round was the newest it was in or voted for (it left
        before ``base`` formed, and never accepted it: a leader that took it in from a join sent
        before its leave has no vote of it to wait for)."""
        if member not in self.said_left:
            return True
        said = self.said_left[member]
        return said is not None and age(said) > age(base)

    def _check_left(self, node: SimNode, rnd: Round) -> None:
        """``quorum`` at each vote: a node that said it leaves votes on no successor of the round
        its leave took it out of, in any process of its id: the leader that got the leave counts
        it gone, and another that counts its vote could form a second round from the same base
        (a new process of it is a new node: ``Ballot.leave``)."""
        me = node.core.node_id
        if me in self.said_left and rnd.base is not None and not self._votes_on(me, rnd.base):
            said = self.said_left[me]
            raise Violation(
                "quorum",
                f"node {node_hex(me)[:6]} (incarnation {node.node.settings.incarnation}) accepted "
                f"{_key((rnd.epoch, rnd.members[0], rnd.number))} from {_key(rnd.base)} after it said "
                f"it leaves {_key(said) if said is not None else 'before any round'}: "
                "a vote its leave took away",
                self.sim.now,
            )

    def _check_vote(
        self,
        node: int,
        key: tuple[int, int, int],
        base: int,
        covers: frozenset[tuple[int, int, int]],
        base_key: tuple[int, int, int] | None = None,
    ) -> None:
        """``successors`` at each vote (module doc): the step of the quorum's proof that two
        winning proposals share a voter whose second vote accounted for its first. The node's
        previous vote is the truth's (every process of its id), not its state file's."""
        before = self.last_vote.get(node)
        self.last_vote[node] = key
        if before is None or before[:2] == key[:2]:
            return  # none, or the same term's
        self.checks += 1
        if before[2] <= base:
            # Numbered as the base or below: its base's chain, or what the proposal covers, knew
            # of it, or it has not won its voters (if it wins later, ``_check_successors`` judges it).
            if base_key is not None and self._accounted_for(
                frozenset({base_key}) | covers, before, bases=True
            ):
                return
            if not self._may_have_formed(before):
                return
            raise Violation(
                "successors",
                f"{node_hex(node)[:6]} voted for {_key(key)} (from {_key(base_key) if base_key else 'none'})"
                f" after it voted for {_key(before)}, which won its voters, and neither that base's chain "
                f"nor the proposal's covers ({sorted(_key(c) for c in covers) or 'nothing'}) knew of it",
                self.sim.now,
            )
        if not any(e == before[0] and l_ == before[1] and n >= before[2] for e, l_, n in covers):
            raise Violation(
                "successors",
                f"{node_hex(node)[:6]} voted for {_key(key)} (from round {base}) after it voted for "
                f"{_key(before)}, which that proposal's leader did not account for (covers "
                f"{sorted(_key(c) for c in covers) or 'nothing'})",
                self.sim.now,
            )

    def _check_memory(self, node: SimNode) -> None:
        """``memory`` (module doc), after a vote: the rounds the node heard formed that it voted
        for are named by its state (its history or a later one, its vote, or its vote's lines);
        and the ones it must keep (``_to_keep``) are kept (so too among its ``earlier``)."""
        me = node.core.node_id
        heard = node.node.heard().keys
        for key in self.voted.get(me, ()):
            if key in heard:  # a heard round formed (``Heard``): named, not only kept
                self._check_named(node, key, heard=True)
        for key in self._to_keep(me):
            self._check_named(node, key, heard=False)

    def _to_keep(self, node: int) -> list[tuple[int, int, int]]:
        """The rounds that formed that ``node`` voted for and must keep (``memory``): each one
        until it votes for a later proposal of the same term (a leader forms none of its
        proposals once it made a later one: that one rests on the round or a later one)."""
        out, later_terms = [], set()
        for key in reversed(self.voted.get(node, ())):
            if key[:2] not in later_terms and self._did_form(key):
                out.append(key)
            later_terms.add(key[:2])
        return out

    def _check_kept(self, key: tuple[int, int, int]) -> None:
        """``memory`` (module doc), as round ``key`` forms: each live process that voted for it
        and must keep it (``_to_keep``) keeps it."""
        voters = self.acceptors.get(key, ())
        for agent in self.agents:
            if agent.node_id in voters and agent.node.alive and key in self._to_keep(agent.node_id):
                self._check_named(agent.node, key, heard=False)

    def _check_named(self, node: SimNode, key: tuple[int, int, int], *, heard: bool) -> None:
        ballot = node.node.ballot
        history, vote = ballot.history, ballot.accepted
        earlier = () if heard else ballot.earlier
        self.checks += 1
        if history is not None and age(history.key) >= age(key):
            return
        if vote is not None and (vote.key == key or key in vote.lines):
            return
        if any(h.key == key for h in earlier):
            return
        raise Violation(
            "memory",
            f"node {node_hex(node.core.node_id)[:6]} voted for {_key(key)}, which formed"
            f"{' and it heard so' if heard else ''}, but its state names history "
            f"{_key(history.key) if history else 'none'} and vote {_key(vote.key) if vote else 'none'}"
            + (f" and earlier {', '.join(_key(h.key) for h in earlier)}" if earlier else ""),
            self.sim.now,
        )

    def _check_successors(
        self,
        key: tuple[int, int, int],
        base: tuple[int, int, int] | None,
        covers: frozenset[tuple[int, int, int]],
    ) -> None:
        """``successors`` (module doc), when proposal ``key`` has just won its base's voters."""
        if base is None:
            return
        counted = self._votes(key, base)
        won = self.won.setdefault(base, [])
        if counted is None or any(k == key for k, _ in won):
            return
        voters, have = counted
        if voters and 2 * have <= len(voters):
            return
        self.checks += 1
        for other, other_covers in won:
            if other[:2] == key[:2]:
                continue  # its own term's: a leader forms none of its proposals once it made a later one
            first, (later, later_covers) = other, (key, covers)
            if self.proposed_at[other] > self.proposed_at[key]:
                first, (later, later_covers) = key, (other, other_covers)
            if not self._accounted_for(later_covers, first):
                raise Violation(
                    "successors",
                    f"epoch {key[0]} round {key[2]} (leader {node_hex(key[1])[:6]}) won a majority of the "
                    f"voters of epoch {base[0]} round {base[2]}, as epoch {other[0]} round {other[2]} "
                    f"(leader {node_hex(other[1])[:6]}) did before it, and the leader of epoch {later[0]} "
                    f"round {later[2]}, proposed later, did not know of epoch {first[0]} round {first[2]}",
                    self.sim.now,
                )
        won.append((key, covers))

    def _did_form(self, key: tuple[int, int, int]) -> bool:
        """Whether round ``key`` formed: an agent runs it, or its leader's book took it as its
        current round (a leader cut off as it forms a round may deliver it to no agent, and its
        voters must keep it all the same)."""
        return key in self.rounds or key in self._formed

    def _may_have_formed(self, key: tuple[int, int, int]) -> bool:
        """Whether proposal ``key`` won what forms it, by now: a majority of its base's voters
        (``won``), or for a round of no base every member's accept, and a majority of the voters
        of each proposal and rival round it covers; or it formed."""
        if self._did_form(key):
            return True
        base, members = self.accepted.get(key, (None, ()))
        if base is None:
            won = bool(members) and set(members) <= self.acceptors.get(key, set())
        else:
            won = any(k == key for k, _ in self.won.get(base, ()))
        return won and all(self._has_majority_of(key, c) for c in self.covers.get(key, ()))

    def _has_majority_of(self, key: tuple[int, int, int], other: tuple[int, int, int]) -> bool:
        """Whether proposal ``key`` has the accepts of a majority of ``other``'s voters (True
        where nobody ran or accepted ``other``: unknown counts as won)."""
        counted = self._votes(key, other)
        if counted is None:
            return True
        voters, have = counted
        return not voters or 2 * have > len(voters)

    def _accounted_for(
        self, covers: frozenset[tuple[int, int, int]], target: tuple[int, int, int], *, bases: bool = False
    ) -> bool:
        """Whether a leader that accounted for ``covers`` knew of proposal ``target``: one of them
        is it or a later proposal of its term, or accounted for it in turn (transitively);
        ``bases``: each one's base counts as accounted for too (a chain of rounds)."""
        seen: set[tuple[int, int, int]] = set()
        todo = list(covers)
        while todo:
            e, l_, n = todo.pop()
            if (e, l_) == target[:2] and n >= target[2]:
                return True
            if (e, l_, n) in seen:
                continue
            seen.add((e, l_, n))
            for k, c in self.covers.items():
                if k[:2] == (e, l_) and k[2] <= n:
                    todo.extend(c)
            if bases:
                for k, (b, _) in self.accepted.items():
                    if k[:2] == (e, l_) and k[2] <= n and b is not None:
                        todo.append(b)
        return False

    def _check_quorum(self, key: tuple[int, int, int], base: tuple[int, int, int] | None, where: str) -> None:
        """``quorum`` (module doc): the voters of ``base``, from the truth, and who accepted."""
        if base is None:
            return  # a first round: no base to win
        self.checks += 1
        counted = self._votes(key, base)
        if counted is None:
            return  # (``_lineage_of`` reports a base nobody ran)
        voters, have = counted
        if voters and 2 * have <= len(voters):
            raise Violation(
                "quorum",
                f"{where}: formed from epoch {base[0]} round {base[2]} with the accepts of {have} of "
                f"its {len(voters)} voters ({', '.join(node_hex(v)[:6] for v in sorted(voters))})",
                self.sim.now,
            )

    def _place(self, host: int) -> str:
        """A host's place in rank order: a rack of three hosts, then the host (natural order)."""
        return f"rack{host % 3}/h{host}" if self.sc.places else ""

    def _check_rank_order(self, where: str, rnd: Round, now: float) -> None:
        """A job's first round: a ring of places; a round formed from another: its members keep
        their ranks (``_rounds.keep_ranks``): each member of the base whose rank the round still
        has (but rank 0, the leader's) holds it, and newcomers take the free ranks in place order."""
        members = rnd.members
        host_of = {a.node_id: a.host for a in self.agents}
        if rnd.base is None:
            if not self.sc.places:
                return
            self.checks += 1
            ring = [natural_key(self._place(host_of[m])) for m in members]
            descents = sum(ring[i] > ring[(i + 1) % len(ring)] for i in range(len(ring)))
            if descents > 1:
                hosts = [host_of[m] for m in members]
                raise Violation(
                    "rank-order", f"{where}: hosts {hosts} in rank order, not a ring of places", now
                )
            return
        held = self._members_of(rnd.base)
        if held is None:
            raise Violation(
                "rank-order", f"{where}: formed from {rnd.base}, a round nobody formed or accepted", now
            )
        self.checks += 1
        before = {node: rank for rank, node in enumerate(held)}
        for rank, node in enumerate(members[1:], 1):
            kept = before.get(node)
            if kept is not None and 0 < kept < len(members) and kept != rank:
                raise Violation(
                    "rank-order", f"{where}: {node_hex(node)} was rank {kept} of {rnd.base}, now {rank}", now
                )
        if self.sc.places:
            new = [natural_key(self._place(host_of[m])) for m in members[1:] if m not in before]
            if new != sorted(new):
                raise Violation("rank-order", f"{where}: newcomers out of place order", now)

    def _members_of(self, key: tuple[int, int, int]) -> tuple[int, ...] | None:
        """The members of a round the harness saw formed or accepted (None: neither)."""
        log, proposed = self.rounds.get(key), self.accepted.get(key)
        if log is not None:
            return log.members
        return proposed[1] if proposed is not None else None

    def _lineage_of(self, base: tuple[int, int, int] | None) -> int:
        """A round continues the lineage of the round it was formed from (``Round.base``); a
        first round (no base) starts a lineage of its own."""
        if base is None:
            return next(self._lineages)
        known = self.rounds.get(base)
        if known is None and base in self.accepted:
            return self._lineage_of(self.accepted[base][0])  # formed, maybe, and delivered to nobody
        if known is None:
            raise Violation(
                "ranks",
                f"a round formed from epoch {base[0]} round {base[2]}, which no node ran",
                self.sim.now,
            )
        return known.lineage

    def _lineage_known(self, key: tuple[int, int, int]) -> int | None:
        """The lineage of a round (or a proposal) by its key, if one of the job's rounds."""
        known = self.rounds.get(key)
        if known is not None:
            return known.lineage
        if key in self.accepted:
            base = self.accepted[key][0]
            return self._lineage_known(base) if base is not None else None
        return None

    def _nudge(self, log: _Round) -> None:
        """With ``OVERHEARD_AFTER``: once the others' first round numbered that or above trains
        (beside the island, none of its members), one of its members' workers fail, so that
        their next proposal is formed from a round numbered past the island's (``_overhear``)."""
        for island in self._overheard:
            after = int(island.event.args[4]) if len(island.event.args) > 4 else 0  # type: ignore[call-overload]
            ids = self._ids(set(island.event.args[0]))  # type: ignore[call-overload]
            if island.nudged or not after or log.key[2] < after or ids & set(log.members):
                continue
            island.nudged = True
            member = next(a for a in self.agents if a.node_id == log.members[-1])
            fail = sc.Event(self.sim.now + NUDGE_S, "workers_fail", member.host)
            self._at(fail.at, functools.partial(self._fire, fail))

    def _training(self, log: _Round) -> None:
        now = self.sim.now
        self._nudge(log)
        self.checks += 3
        training = self._rounds_training()
        others = [r for r in training if r.lineage == log.lineage]
        process = {a.node_id: a.node for a in self.agents}  # the newest process of each node id
        founds = not any(r.lineage == log.lineage for r in self.trained)  # the lineage's first round
        for beside in (r for r in training if r.lineage != log.lineage):
            # A round beside one of another lineage that shares a node with it (the node was
            # counted in a round of each): one job split in two, whatever anyone heard. The
            # first round of a lineage, or a later one: once the lineages met in a node, they
            # are one job, and a round of each may not train at once (``OtherTerms.rivals``).
            both = self.lineage_members[log.lineage] & self.lineage_members[beside.lineage]
            if both:
                raise Violation(
                    "one-round",
                    f"{_show(log)} trains beside {_show(beside)} (training since "
                    f"{beside.training_since:.3f}s), and {', '.join(node_hex(m)[:6] for m in sorted(both))} "
                    "is a member of a round of each lineage: a fork",
                    now,
                )
            # A later round of a lineage too: a term that heard of another line's round forms
            # nothing beside it until one of its members joins (``OtherTerms.unaccounted``).
            heard = self._heard_of(log, beside.lineage, process)
            if heard:
                raise Violation(
                    "one-round",
                    f"{_show(log)} trains beside {_show(beside)} (training since "
                    f"{beside.training_since:.3f}s), a round of another lineage that its member(s) "
                    f"{', '.join(node_hex(m)[:6] for m in heard)} could have heard of: a fork",
                    now,
                )
            self.isolated_overlaps += 1
        if others:
            other = others[0]
            raise Violation(
                "one-round",
                f"rounds {_show(other)} (training since {other.training_since:.3f}s) and {_show(log)} "
                "train at the same time",
                now,
            )
        token = (log.key[0], log.key[2])
        for r in self.trained:
            shared = (r.key[0], r.key[2]) == token and r.key != log.key  # judged as ``one-round`` does
            if shared and (r.lineage == log.lineage or (founds and self._heard_of(log, r.lineage, process))):
                raise Violation(
                    "token",
                    f"{_show(log)} trains under the token {token} of {_show(r)}, a round its members "
                    "could have heard of: fencing cannot tell them apart",
                    now,
                )
        lineage = [r for r in self.trained if r.lineage == log.lineage]
        if lineage:
            last = lineage[-1]
            new, old = (log.key[0], log.key[2]), (last.key[0], last.key[2])
            if new <= old or log.key[2] <= last.key[2]:
                raise Violation("token", f"{_show(log)} trains after {_show(last)}: the token went back", now)
        log.training_since = now
        self.trained.append(log)

    def _heard_of(self, log: _Round, lineage: int, process: dict[int, SimNode]) -> list[int]:
        """The members of round ``log`` that had heard of ``lineage`` when they accepted it, or
        when it formed from its base before they did (``knew_at_accept``: what one hears after,
        as a thawed leader reading what came while it was frozen, is not what it founded the
        round on); for a member that did neither, what it knows now."""
        at_accept = self.knew_at_accept.get(log.key, {})
        return [
            m
            for m in log.members
            if ("lineage", lineage) in (at_accept[m] if m in at_accept else self.sim.knows(process[m]))
        ]

    # ------------------------------------------------------------ checks

    def _check(self, heal: float, bound: float) -> None:
        now = self.sim.now
        for agent in self.agents:
            if agent.phase is Phase.EXITED or not agent.node.alive or not agent.node.started:
                continue
            if agent.phase is Phase.RUNNING and not agent.in_exchange and not self.waits_for_peers(agent):
                continue
            if agent.node.frozen:
                agent.thawed_at = now
                continue
            self.checks += 1
            start = max(agent.since, agent.thawed_at)
            if now > start + agent.bound_s + SLACK_S:
                what = agent.phase.value + (f" ({type(agent.action).__name__})" if agent.action else "")
                if agent.exchange is not None and agent.in_exchange:
                    what = f"in torch's rank exchange ({agent.exchange.stage.value})"
                elif self.waits_for_peers(agent):
                    what = (
                        "running workers that wait for a member's that never started (nothing restarted them)"
                    )
                raise Violation(
                    "bounded-wait",
                    f"host {agent.host} ({agent.node.node.label}) {what} since {start:.3f}s, "
                    f"bound {agent.bound_s:g}s",
                    now,
                )
        self._check_rogue()
        if int(now / MONITOR_S) % 10 == 0:
            self._check_resources()
        if not self.finishing:
            self._check_recovery(heal, bound)

    def _check_book_of(self, sim_node: SimNode) -> None:
        """After every step of a node: what its leader's book keeps to answer in O(1) agrees
        with a count from scratch over its state (``RoundBook.check``, the ledger's too)."""
        term = sim_node.node.term if sim_node.alive and sim_node.started else None
        if term is None:
            return
        self.checks += 1
        problems = term.book.check()
        if problems:
            raise Violation(
                "book", f"{sim_node.node.label} {term.claim}: {'; '.join(problems)}", self.sim.now
            )
        rnd = term.book.current
        if rnd is not None and rnd.base is not None and rnd.key not in self._formed:
            # What the members that did not accept it yet know as it forms (``knew_at_accept``):
            # a majority of its base's voters formed it. A first round forms only once every
            # member accepted it: each accept decides it, and is what it is judged by.
            self._formed.add(rnd.key)
            self.accepted.setdefault(rnd.key, (rnd.base, rnd.members))  # its base, for the chain
            knew = self.knew_at_accept.setdefault(rnd.key, {})
            live = {a.node_id: a.node for a in self.agents if a.node.alive}
            for m in rnd.members:
                if m not in knew and m in live:
                    knew[m] = self.sim.knows(live[m])
            self._check_kept(rnd.key)

    def _check_rogue(self) -> None:
        if not self.rogue_ends:
            return
        self.checks += 1
        for node in self.sim.nodes:
            term = node.node.term
            if not node.alive or term is None:
                continue
            for conn, member in term.conns.items():
                if conn in self.rogue_ends and member.node is not None:
                    raise Violation(
                        "secret",
                        f"the leader on {node.addr[0]} identified a connection of a host without the "
                        f"secret as node {node_hex(member.node)}",
                        self.sim.now,
                    )

    def _check_recovery(self, heal: float, bound: float) -> None:
        """The live agents must be in one round once the network has been quiet for ``bound``:
        after the last fault healed, and in every quiet stretch before (the job's start too)."""
        now = self.sim.now
        self.checks += 1
        live = self._live()
        converged = bool(live) and not self.closed and self._in_one_round(live)
        if now >= heal and (not live or self.closed or converged):
            self._finish(check_again=bool(live) and not self.closed)
            return
        quiet_for = now - max(self._quiet_since, heal if now >= heal else 0.0)
        if converged or self.closed or not live or self._disturbed or quiet_for <= bound:
            return
        current = self.trained[-1] if self.trained else None
        if self._may_recover(current, live):
            states = ", ".join(
                f"host {a.host} {a.phase.value}"
                + (
                    f" in {_show(a.round)}"
                    if a.round
                    else f" ({a.node.board.diagnostics().status if a.node.board else None})"
                )
                for a in live
            )
            raise Violation(
                "recovery",
                f"the network was quiet for {quiet_for:.1f}s (bound {bound:.1f}s) and the live agents "
                f"are not in one round: {states}",
                now,
            )
        if now >= heal:
            self._finish(check_again=False)  # the job cannot go on: its agents end within their bounds

    def _live(self) -> list[_Agent]:
        return [
            a
            for a in self.agents
            if a.phase in (Phase.JOINING, Phase.RUNNING)
            and a.node.alive
            and a.node.started
            and not a.node.frozen
        ]

    def _in_one_round(self, live: list[_Agent]) -> bool:
        """Every live agent runs the last round that trained, or waits as a spare beside it (full)."""
        training = [r for r in self.trained if not r.ended]
        if len(training) != 1:
            return False
        current = training[0]
        members = set(current.members)
        full = len(current.members) >= self.sc.max_nodes
        return all(
            (a.phase is Phase.RUNNING and a.round is current)
            or (full and a.phase is Phase.JOINING and a.node_id not in members)
            for a in live
        )

    def _may_recover(self, last: _Round | None, live: list[_Agent]) -> bool:
        """Whether the job can form a round: at least ``min_nodes`` agents live, and a majority of
        the members of the newest round of each lineage that still has live members (whichever
        a leader counts from) alive, and one such lineage at least. A member that left (SIGTERM)
        counts as a voter that is not alive, unless its leave reached a live leader that still
        runs that round (``_left_before``): that leader must go on without its vote."""
        if len(live) < self.sc.min_nodes:
            return False
        alive = {a.node_id for a in live}
        # What the live nodes can know formed: a round delivered to one of them (its state file
        # has it). A round delivered only to nodes that are gone is, for them, a proposal they
        # accepted, no more: they cannot tell it from one that never formed.
        known = [r for r in self.rounds.values() if r.delivered & alive]
        newest: dict[int, _Round] = {}
        for r in known:
            if r.lineage not in newest or r.key[2] > newest[r.lineage].key[2]:
                newest[r.lineage] = r
        # A proposal a node accepted, at least as new as every round a live node knows formed,
        # may have formed (its leader had the votes and was lost before it told anyone): a
        # leader that heard of it may not go on without a majority of its members either
        # (``RoundBook.uncertain``), whether or not it formed. "At least": a term on another
        # side of a partition may propose a round of the same number as the one that ran.
        ran = max((r.key[2] for r in known), default=0)
        for key, (_, members) in self.accepted.items():
            formed = self.rounds.get(key)
            if formed is not None and formed.delivered & alive:
                continue
            if key[2] >= ran and 2 * len(alive & set(members)) <= len(members):
                return False
        # A round of another line that a live leader knows a joiner was in (``OtherTerms.rivals``:
        # two lines of the job met in a node) may go on where its members are, as far as any
        # live node can tell: a majority of its voters too.
        for node in self.sim.nodes:
            term = node.node.term
            if node.alive and not node.frozen and term is not None:
                book = term.book
                for h in book.rivals():
                    rival = book.ledger.voters_of(h.members, h.key)
                    if rival and 2 * len(alive & rival) <= len(rival):
                        return False
                # A round of the job it heard of and whose members it does not know
                # (``OtherTerms.unaccounted``): only one of them, joining, tells who votes.
                stranger = book.others.unaccounted(
                    book.base(), [*book.uncertain(), *book.rivals()], (book.epoch, book.leader)
                )
                if stranger is not None and not alive & set(self._members_of(stranger) or ()):
                    return False
        if not newest:
            return True  # no round yet: the first one needs no majority of anything
        some = False
        for r in newest.values():
            voters = set(r.members) - self._left_before(r)
            if not voters:
                some = True  # every voter left by its word: nobody's vote is missing
                continue
            if voters & alive:
                if 2 * len(voters & alive) <= len(voters):
                    return False
                some = True
        return some  # the newest round of every lineage gone for good: nobody may tell

    def _left_before(self, r: _Round) -> set[int]:
        """Members of ``r`` whose leave a live leader heard while ``r`` was its current round, and
        that said they leave ``r`` (it was the newest round they were in or voted for): only
        their word takes their votes (``_evidence``), and that leader had it."""
        heard: set[int] = set()
        for node in self.sim.nodes:
            term = node.node.term
            if node.alive and not node.frozen and term is not None and term.book.current_key() == r.key:
                heard |= {m for m in term.book.ledger.left & set(r.members) if self.said_left.get(m) == r.key}
        return heard

    def _finish(self, *, check_again: bool) -> None:
        """The job finishes after ``DWELL_S`` (its agents arrive at the exit barrier and shut
        down); ``check_again``: only if every live agent is still in one round by then."""
        self.finishing = True
        self._at(self.sim.now + DWELL_S, functools.partial(self._finish_now, check_again))

    def _finish_now(self, check_again: bool) -> None:
        live = self._live()
        if check_again and live and not self.closed and not self._in_one_round(live):
            self.finishing = False  # it changed meanwhile: recovery goes on, under the same bound
            return
        if self.recovered_at is None:
            self.recovered_at = self.sim.now - DWELL_S
        self.finished = True
        for agent in self.agents:
            self.arrive_if_running(agent)

    def _check_resources(self) -> None:
        """Every table a node keeps per peer is bounded by the nodes that are part of the job now
        (alive within ``LINGER_S``, or members of the round a leader runs), never by every id ever
        seen: a long seed replaces hosts under new ids, and what the job has forgotten must go."""
        now = self.sim.now
        for agent in self.agents:
            if agent.node.alive:
                self.alive_at[agent.node_id] = now
        rogues = {n for n, at in self.rogue_ids.items() if now - at <= LINGER_S}
        recent = rogues | self._alive_since(now - LINGER_S)
        ids = len(recent)
        for sim_node in self.sim.nodes:
            if not sim_node.alive or not sim_node.started:
                continue
            node, core = sim_node.node, sim_node.node.core
            sizes: dict[str, tuple[int, int]] = {
                # Caches of every id heard (any datagram, forged ones too, without a secret),
                # kept in order of use: their caps are the bound.
                "peers": (len(core.peers), MAX_PEERS),
                "candidates": (len(core._candidates), MAX_CANDIDATES),
                "suspects": (len(core._suspects), ids + 8),
                "suspected claims": (len(core._suspected_claims), MAX_SUSPECTS),
                "store ports": (node.cuts.remembered(), 4 * (ROUND_STORES_KEPT + 1)),
                "connects ahead": (len(node.ahead.pending), 8),
                "arrivals": (len(node.requests.arrivals), 4),
                "nonces": (core.codec.remembered, MAX_REMEMBERED_NONCES),
                "readers": (len(sim_node.net.readers) if sim_node.net else 0, 2 * ids + 8),
            }
            if node.term is not None:
                sizes.update(_term_sizes(node.term, ids, len(rogues | self._kept_by(node.term.book, now))))
            self.checks += len(sizes)
            for what, (size, bound) in sizes.items():
                if size > bound:
                    raise Violation("resources", f"{node.label} holds {size} {what}, more than {bound}", now)

    def _alive_since(self, t: float) -> set[int]:
        return {n for n, at in self.alive_at.items() if at >= t}

    def _kept_by(self, book: Any, now: float) -> set[int]:
        """The ids a leader's book may keep now: its round's members and those of the round it
        was formed from, and every node alive since that round formed (joiners, spares, its
        own drops), with ``LINGER_S`` of room. Not the ids of rounds before: a job that runs for
        months, its hosts replaced under new ids, must forget them (``_forget_strangers``)."""
        kept = {book.leader}
        since = 0.0
        if book.current is not None:
            kept |= set(book.current.members)
            base = self.accepted.get(book.current.base) if book.current.base is not None else None
            kept |= set(base[1]) if base is not None else set()
            since = book.formed_at
        return kept | self._alive_since(min(now, since) - LINGER_S)

    # ------------------------------------------------------------ faults

    def _fire(self, e: sc.Event) -> None:
        agent = self.by_host.get(e.node) if e.node >= 0 else None
        node = agent.node if agent is not None else None
        usable = node is not None and node.alive and node.started
        handler = getattr(self, f"_do_{e.kind}")
        if e.node >= 0 and not usable and e.kind not in ("partition",):
            self.faults[f"{e.kind} (no-op)"] += 1
            return
        self.faults[e.kind] += 1
        self._quiet_since = self.sim.now
        if e.dur and e.kind in sc.FAULT_KINDS and e.kind not in sc.TRIGGERS:  # (what one fires counts)
            self._disturbances += 1
            self._at(e.ends, self._calm)
        self._note(
            agent,
            f"FAULT {e.kind}{' ' + str(list(e.args)) if e.args else ''}{f' for {e.dur:g}s' if e.dur else ''}",
        )
        handler(e, agent)

    @property
    def _disturbed(self) -> bool:
        """A fault is under way (a cut, a freeze, a slow link...)."""
        return self._disturbances > 0

    def _calm(self) -> None:
        self._disturbances -= 1
        self._quiet_since = self.sim.now

    # ------------------------------------------------------------ faults of a moment

    def _do_power_at_accept(self, e: sc.Event, agent: _Agent | None) -> None:
        self._triggers.append(e)

    _do_partition_at_accept = _do_sigterm_at_accept = _do_power_at_switch = _do_power_at_accept
    _do_newcomer_at_propose = _do_sigterm_at_propose = _do_isolate_at_won = _do_power_at_accept
    _do_power_at_successor = _do_power_at_accept

    def _do_close_at_training(self, e: sc.Event, agent: _Agent | None) -> None:
        """Armed: it fires at once if a round trains now, else as the next one starts."""
        self._triggers.append(e)
        now = self._rounds_training()
        if now:
            self._close_at_training(max(now, key=lambda r: r.training_since))  # type: ignore[arg-type,return-value]

    def _rounds_training(self) -> list[_Round]:
        """The rounds that train now (they started and have not ended)."""
        return [r for r in self.rounds.values() if r.training_since is not None and not r.ended]

    def _matters(self, key: tuple[int, int, int] | None) -> bool:
        """Whether the proposal ``key`` formed or may still form (its term's process lives and
        leads it)."""
        if key is None:
            return False
        if self._did_form(key):
            return True
        process = self.term_process.get(key[:2])
        term = process.node.term if process is not None and process.alive else None
        return term is not None and (term.claim.epoch, term.claim.leader) == key[:2]

    def _voted(
        self,
        node: SimNode,
        *,
        switched: bool,
        won: tuple[int, int, int] | None = None,
        successor: tuple[int, int, int] | None = None,
    ) -> None:
        """``node`` accepted a proposal (``switched``: it replaced its vote for a proposal of
        another term that formed or may still form, ``_matters``, which it must keep until it
        hears whether it formed, ``Ballot.earlier``; ``won``: the proposal, if this accept made
        it win what forms it; ``successor``: the proposal, if it is built on the node's last vote,
        of another term): an armed fault of that moment fires right after its vote went
        out (in simulated time, not at the harness's next step: the window is milliseconds)."""
        now = self.sim.now
        host = next(a.host for a in self.agents if a.node is node)
        for trigger in list(self._triggers):
            if now > trigger.at + sc.TRIGGER_S and (trigger.kind != "power_at_switch" or self.finishing):
                self._triggers.remove(trigger)  # (a switch is rare: that one waits for it)
            elif (
                trigger.at <= now
                and trigger.node in (-1, host)
                and trigger.kind in sc.AT_ACCEPT
                and (switched or trigger.kind != "power_at_switch")
                and (won is not None or trigger.kind != "isolate_at_won")
                and (successor is not None or trigger.kind != "power_at_successor")
            ):
                target = host
                # The leader of the proposal that won, or of the successor, where it is one of theirs.
                lead = {"isolate_at_won": won, "power_at_successor": successor}.get(trigger.kind)
                if lead is not None:
                    target = next((a.host for a in self.agents if a.node_id == lead[1] and a.node.alive), -1)
                    if target < 0:
                        continue  # its leader is gone already
                self._fired(trigger)
                fault = self._fault_of(trigger, target)
                self.heal = max(self.heal, fault.ends)
                self.sim.later(VOTE_OUT_S, node, lambda _now, f=fault: self._fire(f))

    def _close_at_training(self, log: _Round) -> None:
        """``CLOSE_SHARE``: as the round ``log`` trains, an armed ``close_at_training`` powers
        off one of its members once the workers run, and ``args[0]`` seconds later
        (before that loss is noticed) its leader's agent, done, calls ``shutdown()``."""
        now = self.sim.now
        for trigger in list(self._triggers):
            if trigger.kind != "close_at_training" or trigger.at > now:
                continue
            alive = {a.node_id: a.host for a in self.agents if a.node.alive}
            lost = next((alive[m] for m in log.members[1:] if m in alive), None)
            closer = alive.get(log.members[0])
            if lost is None or closer is None:
                continue  # (it waits for a round with a member to lose and a leader to close it)
            self._fired(trigger)
            at = now + CLOSE_RUNS_S
            after = at + float(trigger.args[0])  # type: ignore[arg-type]
            self._at(at, functools.partial(self._fire, sc.Event(at, "power", lost)))
            self._at(after, functools.partial(self._fire, sc.Event(after, "shutdown", closer)))

    def _fired(self, trigger: sc.Event) -> None:
        """A fault of a moment, armed, meets its moment: it is no longer armed, and counts fired."""
        self._triggers.remove(trigger)
        self.faults[f"{trigger.kind} (fired)"] += 1

    def _proposing(self, form: Form) -> None:
        """A term is about to send out the proposal ``form``: an armed ``newcomer_at_propose``
        cuts off a member that the proposal's base did not hold (``NEWCOMER_SHARE``), an armed
        ``sigterm_at_propose`` sends SIGTERM to a member that waits for it (``LEAVE_SHARE``),
        before the proposal leaves."""
        now = self.sim.now
        self._overhear(form)
        for trigger in list(self._triggers):
            if trigger.kind not in sc.AT_PROPOSE or trigger.at > now:
                continue
            if now > trigger.at + sc.TRIGGER_S:
                self._triggers.remove(trigger)
                continue
            if trigger.kind == "sigterm_at_propose":
                leaver = self._joiner_of(form)
                if leaver is not None:
                    self._fired(trigger)
                    self._fire(sc.Event(now, "sigterm", leaver))
                continue
            newcomer = self._newcomer(form)
            if newcomer is not None:
                self._fired(trigger)
                cut, restart_after, down = (float(a) for a in trigger.args)  # type: ignore[arg-type]
                self._fire(sc.Event(now, "newcomer_cut", newcomer, dur=cut, args=(restart_after, down)))

    def _do_overheard(self, e: sc.Event, agent: _Agent | None) -> None:
        """Hosts cut off from the job's start (``OVERHEARD_SHARE``): an island that may found a
        job of its own; ``_overhear`` opens its datagrams to one voter later."""
        island = _Island(e, next(self._cut_ids))
        self.sim.net.block(island.cut, self._island_pairs(e), DROP)
        self._overheard.append(island)
        self._at(e.ends, lambda: self.sim.net.unblock(island.cut, self.sim.now))

    def _island_pairs(self, e: sc.Event, ear: object = None) -> list[tuple[object, object]]:
        """The paths an ``overheard`` cut stops: each way between the island and the others,
        but from the island to ``ear``."""
        island = set(e.args[0])  # type: ignore[call-overload]
        inside: list[object] = [self._addr(h) for h in island]
        outside: list[object] = [self._addr(h) for h in range(self.sc.hosts) if h not in island]
        out = [(a, b) for a in inside for b in outside if b != ear]
        return out + [(b, a) for a in inside for b in outside]

    def _overhear(self, form: Form) -> None:
        """The others propose their first round (``OVERHEARD_SHARE``). If the island formed
        none yet, their leader's host loses power as it proposes (``args``: for how long; its
        nodes elect another, and the island forms first). Once it formed one, at the proposal
        that opens it (their first; with ``OVERHEARD_AFTER``, their first formed from a round
        numbered that or above): the island's clocks step back past the replay window, this
        proposal's first voter that waits (not the leader) gets the island's datagrams from now
        on, one way (nothing of its leader's does), and its leader's frames reach it late
        (``args``): it hears of the island's round by datagrams too stale to follow, after its
        join went out and before its vote."""
        now = self.sim.now
        for island in list(self._overheard):
            e = island.event
            ids = self._ids(set(e.args[0]))  # type: ignore[call-overload]
            after = int(e.args[4]) if len(e.args) > 4 else 0  # type: ignore[call-overload]
            if now >= e.ends or (not after and any(not set(r.members) & ids for r in self.rounds.values())):
                self._overheard.remove(island)  # (healed, or the others formed one already)
                continue
            if ids & set(form.members):
                continue
            hosts = {a.node_id: a.host for a in self.agents if a.node.alive}
            voter, leader = self._joiner_of(form), hosts.get(form.members[0])
            if voter is None or leader is None:
                continue
            late, hold, skew = (float(a) for a in e.args[1:4])  # type: ignore[arg-type]
            formed = any(set(r.members) <= ids for r in self.rounds.values())
            # Their first proposal does not form (once): the island forms first, and with
            # ``OVERHEARD_AFTER`` their line starts at round 2, above the island's round 1.
            if form.base_key is None and not island.powered_off and (not formed or after):
                island.powered_off = True
                self._fire(sc.Event(now, "power", leader, dur=hold, args=("restart",)))
                continue
            if not formed:
                continue
            if (form.base_key is not None) != bool(after) or (after and form.base_key[2] < after):  # type: ignore[index]
                continue
            self._overheard.remove(island)
            ear, lead = self._addr(voter), self._addr(leader)
            self.sim.net.unblock(island.cut, now)
            island.cut = next(self._cut_ids)
            self.sim.net.block(island.cut, self._island_pairs(e, ear), DROP)
            self.sim.net.slow[(lead, ear)] = late
            self._at(e.ends, functools.partial(self.sim.net.slow.pop, (lead, ear), None))
            for h in e.args[0]:  # type: ignore[attr-defined]
                node = self.by_host[h].node
                self.sim.step_clock(node, -skew)
                self._at(e.ends, functools.partial(self.sim.step_clock, node, skew))
            self.faults["overheard (fired)"] += 1
            self._note(self.by_host[voter], f"overhears the island; its leader's frames {late}s late")

    def _ids(self, hosts: set[int]) -> set[int]:
        return {self.by_host[h].node.core.node_id for h in hosts}

    def _joiner_of(self, form: Form) -> int | None:
        """The host of a member of the proposal ``form`` that is not its leader and waits for a
        round (the lowest node id); None if there is none."""
        waiting = [a for a in self.agents if a.node.alive and a.phase is Phase.JOINING]
        hosts = {a.node.core.node_id: a.host for a in waiting}
        return next((hosts[m] for m in sorted(form.members[1:]) if m in hosts), None)

    def _newcomer(self, form: Form) -> int | None:
        """The host of a member of the proposal ``form`` that its base round did not hold (the
        lowest node id); None for a first round (each member votes), an unknown base or none new."""
        if form.base_key is None:
            return None
        log, proposed = self.rounds.get(form.base_key), self.accepted.get(form.base_key)
        if log is None and proposed is None:
            return None
        held = log.members if log is not None else proposed[1]  # type: ignore[index]
        hosts = {a.node.core.node_id: a.host for a in self.agents if a.node.alive}
        return next((hosts[m] for m in sorted(set(form.members) - set(held)) if m in hosts), None)

    def _fault_of(self, trigger: sc.Event, host: int) -> sc.Event:
        """The fault a trigger fires now, on the host that voted (or whose proposal won)."""
        at = self.sim.now + VOTE_OUT_S
        if trigger.kind == "partition_at_accept":
            *cut, dur = trigger.args
            return sc.Event(at, "partition", dur=float(dur), args=tuple(cut))  # type: ignore[arg-type]
        if trigger.kind == "sigterm_at_accept":
            return sc.Event(at, "sigterm", host)
        if trigger.kind == "isolate_at_won":  # ``host``: the leader of the proposal that won
            return sc.Event(at, "isolate", host, dur=float(trigger.args[0]))  # type: ignore[arg-type]
        return sc.Event(at, "power", host, dur=float(trigger.args[0]), args=("restart",))  # type: ignore[arg-type]

    def _do_last_word(self, e: sc.Event, _: _Agent | None) -> None:
        """``LAST_WORD_SHARE``: every host but the leader's loses power, the leader's freezes
        (``dur``) once it counted them lost, its agent is shut down halfway through the freeze,
        and one of the others comes back as a new node ``args[0]`` seconds before the thaw."""
        now = self.sim.now
        leaders = [a for a in self.agents if a.node.alive and a.node.started and a.node.node.leading]
        others = [a for a in self.agents if a.node.alive and a.node.started and a not in leaders[:1]]
        if not leaders or not others:
            return
        self.faults["last_word (fired)"] += 1
        leader, back = leaders[0], min(others, key=lambda a: a.host)
        for agent in others:
            self._fire(sc.Event(now, "power", agent.host))
        # It freezes once it counted them lost: then its term has no member left to tell.
        frozen, thaw = now + LAST_WORD_LOST_S, now + LAST_WORD_LOST_S + e.dur
        self._at(frozen, lambda: self._fire(sc.Event(frozen, "freeze", leader.host, dur=e.dur)))
        self._at(frozen + e.dur / 2, lambda: self._fire(sc.Event(self.sim.now, "shutdown", leader.host)))
        self._at(thaw - float(e.args[0]), lambda: self._respawn(back, fresh=True))  # type: ignore[arg-type]

    def _do_crash(self, e: sc.Event, agent: _Agent) -> None:
        self.sim.kill(agent.node)
        self.exit(agent, "crashed")
        if e.args:
            self._at(e.ends, lambda: self._respawn(agent, fresh="fresh" in e.args))

    def _do_power(self, e: sc.Event, agent: _Agent) -> None:
        self.sim.power_off(agent.node)
        self.exit(agent, "powered off")
        if e.args:
            self._at(e.ends, lambda: self._respawn(agent, fresh="fresh" in e.args))

    def _do_restart(self, e: sc.Event, agent: _Agent) -> None:
        self.sim.kill(agent.node)
        self.exit(agent, "restarted")
        self._at(e.ends, lambda: self._respawn(agent))

    def _respawn(self, old: _Agent, *, fresh: bool = False) -> None:
        """A new agent on ``old``'s host; ``fresh``: as a new node (its state is gone)."""
        if self.by_host.get(old.host) is old:
            inherit = old.node.core.node_id if self.inherit_identity and not fresh else None
            self._spawn(old.host, self.sim.now, node_id=inherit)

    def _do_unfit(self, e: sc.Event, agent: _Agent) -> None:
        """The agent's health check fails, and passes again at the end (``HealthJudged``);
        a frozen agent runs no check: it learns of it when it thaws."""
        node = agent.node
        if node.frozen:
            return  # a frozen agent runs no check

        def fit_again() -> None:
            if node.alive and node.frozen:
                self._at(self.sim.now + 0.25, fit_again)  # it checks again once thawed
            elif node.alive:
                self.sim.step_node(node, [HealthJudged(unfit=False)])

        self.sim.step_node(node, [HealthJudged(unfit=True)])
        self._at(e.ends, fit_again)

    def _do_freeze(self, e: sc.Event, agent: _Agent) -> None:
        self.sim.freeze(agent.node)
        self._at(e.ends, lambda: self._thaw(agent))

    def _thaw(self, agent: _Agent) -> None:
        if agent.node.frozen:
            self.sim.thaw(agent.node)
            agent.thawed_at = self.sim.now

    def _do_partition(self, e: sc.Event, agent: _Agent | None) -> None:
        mode, oneway, groups = e.args
        assert isinstance(groups, list)
        addrs = [[self._addr(h) for h in group] for group in groups]
        pairs: list[tuple[object, object]] = []
        for i, side in enumerate(addrs):
            for j, other in enumerate(addrs):
                if i != j and (not oneway or i == 0):
                    pairs.extend((a, b) for a in side for b in other)
        cut = next(self._cut_ids)
        self.faults[f"partition by {mode}"] += 1
        self.sim.net.block(cut, pairs, {"reset": RESET, "fin": FIN, "garble": GARBLE}.get(str(mode), DROP))
        self._at(e.ends, lambda: self.sim.net.unblock(cut, self.sim.now))

    def _do_isolate(self, e: sc.Event, agent: _Agent) -> None:
        me = agent.node.addr
        others = [self._addr(h) for h in range(self.sc.hosts) if h != agent.host]
        cut = next(self._cut_ids)
        self.sim.net.block(cut, [(me, o) for o in others] + [(o, me) for o in others], DROP)
        self._at(e.ends, lambda: self.sim.net.unblock(cut, self.sim.now))

    def _do_newcomer_cut(self, e: sc.Event, agent: _Agent) -> None:
        """A new member cut off as its round is proposed, its agent restarted meanwhile
        (``NEWCOMER_SHARE``)."""
        restart_after, down = (float(a) for a in e.args)  # type: ignore[arg-type]
        self._do_isolate(e, agent)
        restart = sc.Event(self.sim.now + restart_after, "restart", agent.host, dur=down)
        self._at(restart.at, lambda: self._fire(restart))

    def _do_garble(self, e: sc.Event, agent: _Agent) -> None:
        """The host's link goes bad: its next sends, either way, arrive corrupted, then nothing
        does until it heals (``GARBLE_SHARE``)."""
        me = agent.node.addr
        self.sim.net.garbled[me] = int(e.args[0])  # type: ignore[call-overload]
        self._at(self.sim.now + GARBLE_FOR_S, lambda: self._do_isolate(e, agent))
        self._at(e.ends, functools.partial(self.sim.net.garbled.pop, me, None))

    def _do_impair(self, e: sc.Event, agent: _Agent) -> None:
        drop, dup, spike = e.args
        addr = agent.node.addr
        self.sim.net.impaired[addr] = Impairment(float(drop), float(dup), (0.0, float(spike)))  # type: ignore[arg-type]
        self._at(e.ends, functools.partial(self.sim.net.impaired.pop, addr, None))

    def _do_stall(self, e: sc.Event, agent: _Agent) -> None:
        addr = agent.node.addr
        self.sim.net.stalled[addr] = float(e.args[0])  # type: ignore[arg-type]
        self._at(e.ends, functools.partial(self.sim.net.stalled.pop, addr, None))

    def _do_reset_conns(self, e: sc.Event, agent: _Agent) -> None:
        self.sim.net.reset_connections(agent.node.addr, self.sim.now)

    def _do_clock(self, e: sc.Event, agent: _Agent) -> None:
        step = float(e.args[0])  # type: ignore[arg-type]
        self.sim.step_clock(agent.node, step)
        self._at(e.ends, functools.partial(self.sim.step_clock, agent.node, -step))

    def _do_workers_fail(self, e: sc.Event, agent: _Agent) -> None:
        """Its workers fail and torch's agent restarts them: only workers that started (in
        torch's rank exchange the agent has none, and cannot re-join from there)."""
        if agent.phase is Phase.RUNNING and not agent.in_exchange:
            self.rejoin(agent)

    def _do_sigterm(self, e: sc.Event, agent: _Agent) -> None:
        if agent.phase in (Phase.JOINING, Phase.RUNNING):
            self.preempt(agent)

    def _do_preempt(self, e: sc.Event, agent: _Agent) -> None:
        """A spot preemption (``PREEMPT_SHARE``): the notice, then the host down before its agent
        is done, and started again by its scheduler."""
        if agent.phase not in (Phase.JOINING, Phase.RUNNING):
            return
        self.preempt(agent)
        down = sc.Event(self.sim.now + float(e.args[0]), "power", agent.host, dur=e.dur, args=("restart",))  # type: ignore[arg-type]
        self._at(down.at, lambda: self._fire(down))

    def _do_shutdown(self, e: sc.Event, agent: _Agent) -> None:
        """The agent calls ``shutdown()``: its workers finished (the job is done), or, in its
        rendezvous or before its workers could train, it was stopped (the launcher shuts down
        on the way out of the error)."""
        if self.workers_ran(agent):
            self.shut(agent)
        elif agent.phase in (Phase.JOINING, Phase.RUNNING):
            self.shut(agent, failed="its agent was stopped before its workers could train")

    def _addr(self, host: int) -> tuple[str, int]:
        return self.by_host[host].node.addr

    # ------------------------------------------------------------ the hostile host

    def _rogue_receive(self, d: Delivery) -> None:
        if d.kind == "datagram":
            self.captured.append(d.data)
            if len(self.captured) > 200:
                del self.captured[:100]
        elif d.kind == "connected":
            self._rogue_speak(d.end)

    def _do_forge(self, e: sc.Event, agent: _Agent | None) -> None:
        count = int(e.args[0])  # type: ignore[call-overload]
        wrong = Codec(derive_key(b"not the secret")) if self.sc.secret else None
        unsigned = Codec(None)
        for _ in range(count):
            pick = self.rng.random()
            if pick < 0.4 or not self.captured:
                data = self.rng.randbytes(self.rng.randint(0, 300))
            elif pick < 0.7:
                raw = self.rng.choice(self.captured)
                data = raw[: self.rng.randint(0, len(raw) - 1)]
            elif wrong is not None:
                # Well-formed, but signed with another key or not at all: a host without the secret.
                epoch = self.rng.randint(1, 50)
                body: Announce | Resign = (
                    Announce(epoch=epoch, store_ip=ROGUE_ADDR[0], store_port=9, established=True)
                    if pick < 0.85
                    else Resign(epoch=epoch)
                )
                sent_ms = int((self.sim.now + 1.7e9) * 1000)
                dgram = Datagram(self.sim.job, self._rogue_id(), body, sent_ms, self.rng.getrandbits(64))
                data = (wrong if pick < 0.95 else unsigned).encode(dgram)
            else:
                data = self.rng.randbytes(40)
            self.sim.net.send(ROGUE_ADDR, data, self._rogue_dest(), self.sim.now)

    def _do_replay(self, e: sc.Event, agent: _Agent | None) -> None:
        for _ in range(int(e.args[0])):  # type: ignore[call-overload]
            if self.captured:
                data = self.rng.choice(self.captured)
                self.sim.net.send(ROGUE_ADDR, data, self._rogue_dest(), self.sim.now)

    def _rogue_dest(self) -> tuple[str, int] | None:
        if self.rng.random() < 0.5:
            return None
        return self._addr(self.rng.randrange(self.sc.hosts))

    def _do_rogue(self, e: sc.Event, agent: _Agent | None) -> None:
        """Connects to every leader's control port it heard announced (the announcements are
        signed, not encrypted) and speaks the protocol without knowing the secret."""
        self._rogue_mimic = bool(e.args[0])
        for node in self.sim.nodes:
            view = node.core.leader
            if node.alive and node.node.term is not None and view is not None and view.is_self:
                end = self.sim.net.connect(ROGUE_ADDR, node.addr[0], view.store_port, self.sim.now)
                self.rogue_ends.add(end + 1)  # the leader's end of it
                self._rogue_claims[end] = node.node.term
                self._at(e.ends, functools.partial(self._rogue_hang_up, end))

    def _rogue_hang_up(self, end: int) -> None:
        self.sim.net.stream_close(end, self.sim.now)

    def _rogue_speak(self, end: int) -> None:
        term = self._rogue_claims.get(end)
        if term is None:
            return
        members = [a.node_id for a in self.agents if a.node.alive and a.node_id != term.claim.leader]
        node = self.rng.choice(members) if self._rogue_mimic and members else self._rogue_id()
        frames = [
            encode_frame(
                "hello",
                node=node_hex(node),
                epoch=term.claim.epoch,
                leader=node_hex(term.claim.leader),
                ip=ROGUE_ADDR[0],
                ahead=True,
            ),
            encode_frame("join", id=1, ip=ROGUE_ADDR[0], timeout_s=30, remaining_s=30),
            encode_frame("hb"),
            encode_frame(self.rng.choice(("leave", "close", "bye", "hb")), why="rogue"),
        ]
        for frame in frames:
            self.sim.net.stream_send(end, frame, self.sim.now)

    def _rogue_id(self) -> int:
        node = self.rng.getrandbits(64) or 1
        self.rogue_ids[node] = self.sim.now
        return node


def _term_sizes(term: LeaderTerm, ids: int, kept: int) -> dict[str, tuple[int, int]]:
    """A leader's tables: its joiners and connections are among the recent ids; what it keeps
    per node besides, among ``kept`` (``World._kept_by``)."""
    book = term.book
    return {
        "leader's connections": (len(term.conns), 2 * ids + 8),
        "pending joins": (len(book.pending), ids),
        "dead": (len(book.ledger.lost), kept),
        "left": (len(book.ledger.left), kept),
        "gone": (len(book.ledger.gone), kept),
        "drops": (len(book.ledger.drops), kept),
        "ips": (len(book.ips), kept),
        "restarts": (len(book.restarted_at), kept),
        "join deadlines": (len(term.desk.deadlines), 4 * (len(term._by_node) + 16)),
    }


def _show(r: _Round | None) -> str:
    if r is None:
        return "none"
    epoch, _, number = r.key
    return f"epoch {epoch} round {number} [{' '.join(node_hex(m)[:6] for m in r.members)}]"


def run(scenario: sc.Scenario, **kw: Any) -> Outcome:
    return World(scenario, **kw).run()


def _key(key: tuple[int, int, int]) -> str:
    epoch, leader, number = key
    return f"epoch {epoch} round {number} of {node_hex(leader)[:6]}"
