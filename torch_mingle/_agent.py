"""What torch's agent thread decides around its node: one ``next_rendezvous()`` as pure steps.

How it works. The node answers a join (``_view``: ``Joined``, ``TimedOut``, ``JobOver``); what
the agent's thread then does is I/O of its own: a client of the round's store, a probe of the
data path to its peers, a short look at whether the round broke meanwhile. What each outcome
means, and what comes next, is decided here: the workers start in the round (``Deliver``), the
node asks again (the round broke meanwhile, or its store cannot be reached while the leader
still answers), or the call fails with its reason (``Fail``), or exits 0 (a spare of a job that
finished, ``ExitClean``). ``JoinFlow`` is one ``next_rendezvous()``: ``step(event, now)`` takes
what the last action came to and returns the next action, as torch's own
``_RendezvousJoinOp`` returns an action for its executor. The handler carries the actions out
on torch's thread, the simulator's agents (``testing.agents``) in simulated time: the fault
swarm runs this policy, not a model of it. ``nodes_waiting`` is what ``num_nodes_waiting()``
answers while the workers run.

Pure: no thread, clock, socket or torch (time comes in as ``now``).
"""

from __future__ import annotations

import enum
import itertools

from torch_mingle._claims import Claim
from torch_mingle._errors import StateError
from torch_mingle._keys import RoundKey
from torch_mingle._record import assert_never, record
from torch_mingle._records import History
from torch_mingle._view import Diagnostics, JobOver, Joined, Misconfigured, TimedOut

#: Tries at the round's store while the leader still answers: a connect that fails then is
#: load (a store busy with a burst of joins), not a lost leader. Each try waits longer.
STORE_CONNECT_ATTEMPTS = 3
#: After a failed data path probe, how long to look for the round breaking instead (a peer
#: that died or left just after the round formed refuses too): then the node joins again.
DATA_PATH_GRACE_S = 1.0
#: Peers each node probes in a large round (every peer when the round is at most this + 1).
MAX_PROBES = 16


class Failure(enum.Enum):
    """Why a ``next_rendezvous()`` fails; the handler raises the matching error."""

    SHUT = "shut"  # the handler was shut down
    CLOSED = "closed"  # the job is closed, or failed
    TIMEOUT = "timeout"  # join_timeout ran out
    HEALTH = "health"  # the health check kept failing
    DATA_PATH = "data_path"  # this node cannot reach a peer of its round
    STATE = "state"  # the node answered something it must not (a bug), or failed the join
    CONFIG = "config"  # the job's leader refused this node's settings


# ------------------------------------------------------------------ what to do next


@record
class CheckHealth:
    """Run the site's health check; it passes, or keeps failing until ``until`` (the caller's clock)."""

    until: float


@record
class AskJoin:
    """Ask the node for a place in the next round, for at most ``timeout_s``."""

    timeout_s: float


@record
class ConnectStore:
    """Open a client of the joined round's store, bounded by ``timeout_s`` (try ``attempt``)."""

    attempt: int
    timeout_s: float


@record
class TellStoreUnreachable:
    """Tell the node that the round's store of ``claim``'s leader cannot be reached (then ask again)."""

    claim: Claim
    why: str


@record
class ProbePeers:
    """Check the data path from ``rank`` to the ranks ``peers`` of the joined round (``peers_to_probe``)."""

    rank: int
    peers: tuple[int, ...]


@record
class WatchBreak:
    """Wait up to ``grace_s`` for the node to say that round ``key`` broke."""

    key: RoundKey
    grace_s: float


@record
class Deliver:
    """The workers start: this node is ``rank`` of ``world_size`` in the joined round."""

    joined: Joined
    rank: int
    world_size: int


@record
class Fail:
    """``next_rendezvous()`` fails with ``why``; ``close``: tell the node the job failed first."""

    kind: Failure
    why: str
    close: bool = False


@record
class ExitClean:
    """The job finished without needing this node (a spare): the agent exits 0."""

    why: str


Action = (
    CheckHealth
    | AskJoin
    | ConnectStore
    | TellStoreUnreachable
    | ProbePeers
    | WatchBreak
    | Deliver
    | Fail
    | ExitClean
)


# ------------------------------------------------------------------ what the last action came to


@record
class Began:
    """``next_rendezvous()`` was called; the handler was ``shut``, the job ``closed`` with ``failure``."""

    shut: bool = False
    closed: bool = False
    failure: str = ""


@record
class HealthChecked:
    ok: bool
    why: str = ""
    #: The handler was shut down while the check ran.
    shut: bool = False


@record
class Answered:
    """The node's answer to the join (``Joined``, ``TimedOut``, ``JobOver``), or the error it failed with."""

    outcome: object
    error: str = ""


@record
class StoreOpened:
    pass


@record
class StoreFailed:
    why: str
    #: The node already says the round broke (its leader lost, a newer round): no more tries.
    broke: bool


@record
class Told:
    pass


@record
class Probed:
    ok: bool
    #: Why the job failed, as the node last said ("" while it did not).
    failure: str = ""


@record
class BreakSeen:
    broke: bool
    failure: str = ""
    #: The job closed meanwhile (it finished, or a node shut down).
    closed: bool = False


Event = Began | HealthChecked | Answered | StoreOpened | StoreFailed | Told | Probed | BreakSeen


class JoinFlow:
    """One ``next_rendezvous()``: each ``step`` takes the outcome of the last action, returns the next."""

    def __init__(
        self,
        node_id: int,
        job: str,
        *,
        join_timeout_s: float,
        store_timeout_s: float,
        health_check: bool = False,
        had_round: bool = False,
    ) -> None:
        self.node_id = node_id
        self.job = job
        self.join_timeout_s = join_timeout_s
        self.store_timeout_s = store_timeout_s
        self.health_check = health_check
        #: This agent ran a round of the job before this call.
        self.had_round = had_round
        self.started = 0.0
        self.joined: Joined | None = None
        self.rank = 0
        self.attempt = 0

    def step(self, event: Event, now: float) -> Action:
        match event:
            case Began(shut=True):
                return Fail(Failure.SHUT, "this handler was shut down; create a new one")
            case Began(closed=True, failure=failure):
                why = f": {failure}" if failure else ""
                return Fail(Failure.CLOSED, f"the rendezvous of job {self.job!r} is closed{why}")
            case Began():
                self.started = now
                return self._ask(now)
            case HealthChecked(shut=True):
                return Fail(Failure.SHUT, "this handler was shut down; create a new one")
            case HealthChecked(ok=True):
                return AskJoin(self._left(now))
            case HealthChecked(why=why):
                return Fail(Failure.HEALTH, why)
            case Answered(error=error) if error:
                return Fail(Failure.STATE, error)
            case Answered(outcome=outcome):
                return self._answered(outcome, now)
            case StoreOpened():
                return self._probe()
            case StoreFailed(why=why, broke=broke):
                joined = self.current()
                if broke or self.attempt >= STORE_CONNECT_ATTEMPTS:
                    return TellStoreUnreachable(joined.claim, why)
                self.attempt += 1
                return ConnectStore(self.attempt, self.store_timeout_s * self.attempt)
            case Told():
                return self._ask(now)
            case Probed(ok=True, failure=failure):
                if failure:  # another member's check failed while this one ran
                    return Fail(Failure.CLOSED, f"the job failed: {failure}")
                joined = self.current()
                return Deliver(joined, self.rank, joined.round.world_size)
            case Probed():
                return WatchBreak(History.of(self.current().round).key, DATA_PATH_GRACE_S)
            case BreakSeen(broke=True, failure=""):
                return self._ask(now)  # a peer was lost as the round formed: the next one
            case BreakSeen(closed=True, failure=""):
                # Its peers exited with the job, which did not fail: no path to blame.
                return Fail(Failure.CLOSED, f"job {self.job!r} closed while this node checked its data path")
            case BreakSeen():
                return Fail(Failure.DATA_PATH, "", close=True)
            case _:
                assert_never(event)

    def _ask(self, now: float) -> Action:
        self.joined, self.attempt = None, 0
        if self.health_check:
            return CheckHealth(self.started + self.join_timeout_s)
        return AskJoin(self._left(now))

    def _left(self, now: float) -> float:
        return max(0.001, self.join_timeout_s - (now - self.started))

    def _probe(self) -> ProbePeers:
        return ProbePeers(self.rank, tuple(peers_to_probe(self.current().round.world_size, self.rank)))

    def current(self) -> Joined:
        """The answer the flow goes on with (between a ``Joined`` and the next join)."""
        if self.joined is None:
            raise StateError("the agent's join flow has no round to go on with")
        return self.joined

    def _answered(self, outcome: object, now: float) -> Action:
        if isinstance(outcome, TimedOut):
            return Fail(Failure.TIMEOUT, outcome.why)
        if isinstance(outcome, Misconfigured):
            return Fail(Failure.CONFIG, outcome.why)
        if isinstance(outcome, JobOver):
            return job_over(outcome, self.had_round, self.job)
        if not isinstance(outcome, Joined):
            return Fail(Failure.STATE, f"unexpected answer to a join: {outcome!r}")
        rank = outcome.round.rank_of(self.node_id)
        if rank is None:
            return Fail(
                Failure.STATE, f"round {outcome.round.number} was answered to a node it does not hold"
            )
        self.joined, self.rank, self.had_round = outcome, rank, True
        if outcome.client is not None:
            return self._probe()  # a client of its store was connected while the join waited
        self.attempt = 1
        return ConnectStore(1, self.store_timeout_s)


def job_over(outcome: JobOver, had_round: bool, job: str) -> Fail | ExitClean:
    """What a closed job means for a node that asked to join it. Only a spare of a job that ran
    and finished exits 0 (its workers were never needed); a node whose job failed, or never
    formed, fails with the leader's reason."""
    why = outcome.end.why
    if outcome.end.failed:
        return Fail(Failure.CLOSED, f"the job failed: {why}")
    if outcome.was_waiting and not outcome.ran:
        return Fail(
            Failure.CLOSED,
            f"job {job!r} closed before any round formed ({why}): no node trained; this "
            "node's script never ran",
        )
    if outcome.was_waiting:
        return ExitClean(
            f"job {job!r} finished before this node was admitted ({why}): it was a spare the "
            "job never needed, and its script never ran; exiting 0 (docs/usage.md#exit-codes)"
        )
    if not had_round:
        return Fail(
            Failure.CLOSED,
            f"job {job!r} already finished ({why}): this node never saw it open; use a new "
            "--rdzv_id for a new run",
        )
    return Fail(Failure.CLOSED, f"the rendezvous of job {job!r} is closed: {why}; use a new --rdzv_id")


def peers_to_probe(world: int, rank: int, limit: int = MAX_PROBES) -> list[int]:
    """The ranks ``rank`` probes: all others in a round of at most ``limit + 1``; else its ring
    neighbours, then peers at distances 2, 4, 8, ... on either side (then the nearest ones
    not probed yet), ``limit`` in all."""
    if world - 1 <= limit:
        return [r for r in range(world) if r != rank]
    powers = [1 << k for k in range(world.bit_length())]
    out: list[int] = []
    for distance in itertools.chain(powers, range(3, world)):
        for peer in ((rank + distance) % world, (rank - distance) % world):
            if peer != rank and peer not in out:
                out.append(peer)
                if len(out) == limit:
                    return out
    return out


def nodes_waiting(key: RoundKey | None, closed: bool, diag: Diagnostics) -> int:
    """What ``num_nodes_waiting()`` answers to an agent whose workers run round ``key`` (None:
    none yet): > 0 restarts them for a new round. A job that closed and did not fail lets
    them finish; one that failed stops them (the next join fails with why)."""
    if key is None:
        return 0
    if closed and not diag.failure:
        return 0
    return diag.waiting_in(key)
