"""One connection to a leader's control port, and what the term knows of the node on it: its
hello, its liveness, its join and what it was answered, told and offered."""

from __future__ import annotations

from torch_mingle._record import field, record
from torch_mingle._records import Round, Status
from torch_mingle._wire import Seal

ConnId = int


@record(frozen=False)
class Member:
    conn: ConnId | None  # None: the leader's own node
    opened: float
    node: int | None = None
    last_heard: float = 0.0
    #: (epoch, round, size) of the last round the node was a member of, from its hello or join.
    last: tuple[int, int, int] | None = None
    join_id: int | None = None
    join_deadline: float | None = None
    join_timeout_s: float = 0.0
    parked: bool | None = None
    answered: int | None = None
    told: tuple[object, ...] | None = None  # the status this member was last sent
    offered: int | None = None  # the spare store this member was last named
    connects_ahead: bool = False  # its hello said it reads ``next`` frames (older nodes do not)
    said_bye: bool = False  # it closes the connection itself, alive (it follows another leader)
    incarnation: int = 1  # which process of its node id (``_identity``)
    source: str = ""  # the address it connected from
    seal: Seal | None = None  # with a secret: its connection's authentication
    #: The rounds answered on this connection, by number, kept as the follower keeps them
    #: (``FollowerSession.delivered``): its join names one of them by number (``ref``).
    delivered: dict[int, Round] = field(default_factory=dict)


def status_key(status: Status) -> tuple[object, ...]:
    """What of a status a running member acts on: a member told this key needs no new frame."""
    return (status.epoch, status.round, status.size, status.stale, status.closed, min(status.waiting, 1))
