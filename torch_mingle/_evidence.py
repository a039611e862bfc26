"""Who is gone: the one rule that turns what a node saw of a peer into what it may conclude.

How it works
------------
A control connection ends, or goes quiet, for many reasons, and a partition can produce
almost all of them: a firewall that rejects with a TCP reset, a NAT or middlebox that lost
its flow table, a proxy that closes, a cable that is cut. Such a peer may be alive on the
other side, with a leader of its own; if the side that lost it stopped counting its vote, both
sides of a 2|2 split would each hold "a majority" and train as two jobs. So the transport
reports *what it saw* (``Evidence``), and ``judge`` alone decides what that proves:

* only the peer's own word takes its vote away: it said it leaves (a ``leave`` frame, a leader's
  ``bye`` that says it leaves) (``LEFT``). A restarted agent does not lose its host's vote: it
  comes back under the same node id (``_identity``), so the vote is its again at once;
* everything else (closed, reset, refused, silent, unreachable, a protocol error) ends the
  connection and the round it served, and proves nothing about the process: the node keeps
  its vote. The claim that connection served is only suspected for a while
  (``Discovery.leader_failed``), as any lost claim is: a leader that stepped down never
  announces that claim again, so nothing more is needed (a rule that also fenced such claims
  for good was removed: broken on purpose, in the swarm and in every seed of it, it changed
  nothing; docs/faults.md). A follower's session reads no evidence at all: a leader that
  leaves names itself among the nodes gone in its ``bye`` (``leader_reported_gone``).

Invariant: ``judge(e).votes`` is False only for evidence a partition cannot forge. The
fault swarm checks what this rule protects (one round at a time) with every kind of
evidence the network can produce, and ``tests/unit/test_evidence.py`` shows the split brain
that a rule trusting a reset lets through.
"""

from __future__ import annotations

import enum
import errno

from torch_mingle._record import record


class Evidence(enum.Enum):
    """What a node saw of a peer (a connection's end, or silence)."""

    LEFT = "it said it leaves"
    CLOSED = "its end closed the connection"
    RESET = "the connection was reset"
    REFUSED = "the connection was refused"
    SILENT = "it went silent"
    UNREACHABLE = "it could not be reached"
    BROKEN = "it broke the protocol"


@record
class Verdict:
    """What evidence proves: whether the peer still votes on the next round."""

    votes: bool


_VERDICTS = {
    Evidence.LEFT: Verdict(votes=False),
    Evidence.CLOSED: Verdict(votes=True),
    Evidence.RESET: Verdict(votes=True),
    Evidence.REFUSED: Verdict(votes=True),
    Evidence.SILENT: Verdict(votes=True),
    Evidence.UNREACHABLE: Verdict(votes=True),
    Evidence.BROKEN: Verdict(votes=True),
}


def judge(evidence: Evidence) -> Verdict:
    """What ``evidence`` proves about a peer (see the module doc): the only place that decides."""
    return _VERDICTS[evidence]


def of_errno(code: int | None) -> Evidence:
    """The evidence a socket error is: what the kernel reported, not what it may mean."""
    if code == errno.ECONNREFUSED:
        return Evidence.REFUSED
    if code in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
        return Evidence.RESET
    return Evidence.UNREACHABLE
