"""What the agent's thread sees of its node: the answers to its join (``Joined``,
``TimedOut``, ``JobOver``) and the node's snapshot (``Diagnostics``), which the node
publishes through its ``Ready`` and the agent reads on the board (``_board``)."""

from __future__ import annotations

from torch_mingle._claims import Claim, Stats
from torch_mingle._keys import RoundKey, age
from torch_mingle._leader import ControlCounters
from torch_mingle._record import field, record
from torch_mingle._records import JobEnd, Round, Status


@record
class Joined:
    round: Round
    claim: Claim
    #: The leader's address as this node reached it; None when this node leads.
    leader_ip: str | None
    #: A client of the round's store, connected while the join waited (None: connect now).
    client: object = None


@record
class TimedOut:
    why: str


@record
class Misconfigured:
    """The job's leader refused this node's settings (``_settings.describe_differences``)."""

    why: str


@record
class JobOver:
    """The job is over; ``was_waiting``: this node saw it run and waited for a place (a spare)."""

    was_waiting: bool
    #: How it ended (``failed``: a round could not start, or the closing agent failed: a
    #: waiting node fails too, it does not exit 0).
    end: JobEnd
    #: A round of the job formed (this node was a spare of it, or heard of it): a spare that
    #: waited for a job that never ran did no work either.
    ran: bool = False


@record
class Diagnostics:
    """A consistent snapshot of one node, for tests, benchmarks, logs and error messages."""

    node_id: str
    job: str
    role: str
    leader: str | None = None
    leader_ip: str | None = None
    leader_port: int = 0
    epoch: int = 0
    established: bool = False
    is_leader: bool = False
    round: int = 0
    #: The round this node is in, (epoch, leader, number): which one, across terms.
    round_key: RoundKey | None = None
    rank: int | None = None
    world_size: int = 0
    status: Status | None = None
    #: The round it is in broke: not every member will take its rank (``Snapshots.round_state``).
    round_broken: bool = False
    nodes_waiting: int = 0
    #: When (the loop's clock) the leader told this node that its round will change: every
    #: member hears it within milliseconds, so agents that hold their poll until a common time
    #: after it stop their workers together (``MingleRendezvousHandler.num_nodes_waiting``).
    #: None: nothing told, or this node found out on its own (a lost leader, its loop).
    told_at: float | None = None
    closed: bool = False
    trouble: str | None = None
    peers_heard: int = 0
    connected_nodes: int = 0
    stats: Stats = field(default_factory=Stats)
    recoveries: int = 0
    last_error: str | None = None
    max_epoch_seen: int = 0
    remembered_nonces: int = 0
    loop_alive: bool = True
    #: The agent's client of the next round's store is open, waiting for that round.
    store_ahead: bool = False
    #: The leader's control plane in this term (zeros on a follower).
    control: ControlCounters = field(default_factory=ControlCounters)

    @property
    def failure(self) -> str:
        """Why the job failed, as its leader said ("" while it did not)."""
        return self.status.failure if self.status is not None else ""

    def waiting_in(self, key: RoundKey) -> int:
        """What ``num_nodes_waiting()`` tells an agent running round ``key``: > 0 only on positive
        knowledge that the round cannot go on, never because this snapshot is older than the
        round (docs/faults.md#the-world-of-a-round).

        The loop died, or the job failed: 1. A newer round than ``key`` came: at least 1. An
        older one (a snapshot from before the round was handed over): 0, nothing is known of
        ``key`` yet. The same round: what the node says of it (a loss, a departure, a newcomer).
        """
        if not self.loop_alive or self.failure:
            return 1
        mine = self.round_key
        if mine == key:
            return self.nodes_waiting
        if mine is not None and age(mine) > age(key):
            return max(1, self.nodes_waiting)
        return 0

    def round_broke(self, key: RoundKey) -> bool:
        """Whether round ``key`` is known to have broken: a member will not take its rank (it
        is lost or left, or the leader is), a newer round formed, the job failed or the loop
        died. A snapshot older than ``key`` knows nothing of it: False. A newcomer waiting
        does not break a round (``waiting_in`` restarts it once its workers started)."""
        if not self.loop_alive or self.failure:
            return True
        mine = self.round_key
        if mine == key:
            return self.round_broken
        return mine is not None and age(mine) > age(key)
