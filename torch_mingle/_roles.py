"""What a node is to its job, stated once: ``Electing`` (no term, no session: the election runs,
its claim's control port opens, or its leader announced that the job closed), ``Leading`` (it
holds its term: ``_leading``) or ``Following`` (it holds its session with the leader). The
term and the session are what a role holds, not how a role is guessed: ``Node.role`` is the
one value."""

from __future__ import annotations

from torch_mingle._follower import FollowerSession
from torch_mingle._leader import LeaderTerm
from torch_mingle._record import record


@record
class Electing:
    """No term and no session: the election runs, or its leader announced that the job closed."""

    #: The epoch this node won, while its control port opens (``lead``, ``start_term``).
    claiming: int | None = None


@record
class Leading:
    term: LeaderTerm
    #: Which of this node's terms it is: a background job's answer for an older term is not its own.
    tag: int


@record
class Following:
    session: FollowerSession


NodeRole = Electing | Leading | Following
