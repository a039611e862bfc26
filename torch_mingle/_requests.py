"""What the agent asks of its node beside its join, each with its deadline: the exit barrier
(``arrive``), ``set_closed()`` (``close``), ``shutdown()`` and a preemption notice (``leave``).

* **Arrive.** torch's exit barrier: the leader must know before it counts this node.
* **Close.** No further rounds for anyone, told to the leader, or to the next one if there
  is none now (``deliver_close`` once one welcomes this node).
* **Shutdown.** Close the job and leave: a leader first waits for the others to leave (its
  stores serve their exit barriers) or for ``close_timeout``; a follower leaves once its close
  is out, or, between leaders, gives the next one until the heartbeat timeout.
* **Leave.** At once, the job going on without this node: its ticket resolves once the others
  no longer need its workers (a follower: the leader formed a round without it; a leader:
  every other member re-joined, then it hands the job over). Only then may the agent stop
  its own workers: stopped earlier, they would make the others' workers fail, and those
  failures would count against ``--max-restarts``.

Each is written to the disk first where it takes the vote (``Ballot.leave``).
"""

from __future__ import annotations

import logging
from typing import Protocol

from torch_mingle import _following as following
from torch_mingle import _leading as leading
from torch_mingle._following import Follower
from torch_mingle._leading import Leader
from torch_mingle._ready import Ticket
from torch_mingle._records import JobEnd

log = logging.getLogger(__name__)


class Requests:
    """The agent's requests beside its join, as the node keeps them."""

    def __init__(self) -> None:
        self.arrivals: dict[int, Ticket] = {}
        self.shutdown: Ticket | None = None
        #: When a shutdown gives up waiting (for the others to leave, or for a leader).
        self.shutdown_due = 0.0
        self.leaving: Ticket | None = None
        #: A close not told yet (no leader now): how the job ends (``close``).
        self.pending_close: JobEnd | None = None

    def next_timer(self) -> float | None:
        shutdown, leaving = self.shutdown, self.leaving
        times = [
            self.shutdown_due if shutdown is not None and not shutdown.decided else None,
            leaving.due if leaving is not None and not leaving.decided else None,
            *(t.due for t in self.arrivals.values()),
        ]
        present = [t for t in times if t is not None]
        return min(present) if present else None


class Requester(Leader, Follower, Protocol):
    """What the requests read of their node and ask of it (``_node.Node``)."""

    requests: Requests

    def unlead(self, why: str, now: float, *, leaving: bool = False) -> None: ...


def acked(node: Requester, ticket_id: int) -> None:
    """The leader counted this node in its exit barrier."""
    ticket = node.requests.arrivals.pop(ticket_id, None)
    if ticket is not None:
        node.resolve(ticket, result=True)


def arrive(node: Requester, ticket: Ticket, round_number: int, now: float) -> None:
    """The agent enters torch's exit barrier: the leader must know before it counts us."""
    node.requests.arrivals[ticket.id] = ticket
    node.extend(ticket, now + ticket.timeout_s)
    if (term := node.leading) is not None:
        term.arrive_local(ticket.id, round_number, now)
    elif node.session is not None and node.in_round is not None:
        node.session.arrive(ticket.id, round_number, node.in_round.epoch)
    else:
        node.requests.arrivals.pop(ticket.id)
        node.resolve(ticket, result=False)
    node.flush(now)


def close(node: Requester, end: JobEnd, now: float) -> None:
    """``set_closed()``: no further rounds for anyone (told to the next leader if there is none now).

    ``end.stops_round``: the job cannot go on (this node's round cannot start): the members
    running that round stop their workers too, and every agent fails with ``end.why``.
    """
    node.requests.pending_close = end
    deliver_close(node, now)
    node.flush(now)


def deliver_close(node: Requester, now: float) -> None:
    end = node.requests.pending_close
    if end is None:
        return
    if (term := node.leading) is not None:
        term.close_job(node.settings.node_id, end, now)
        node.requests.pending_close = None
    elif node.session is not None and node.session.ready:
        node.session.close_job(end)
        node.requests.pending_close = None
        if node.requests.shutdown is not None and not node.requests.shutdown.decided:
            leave_for_good(node, now)  # the close of a shutdown waited for this leader


def shutdown(node: Requester, ticket: Ticket, close_timeout_s: float, end: JobEnd, now: float) -> None:
    """``shutdown()``: close the job and leave; a leader first waits for the others to leave.
    ``end.failed``: this agent failed, and so did the job for the nodes still waiting for a place."""
    node.ballot.leave()  # (as ``request_leave``)
    node.requests.shutdown = ticket
    node.requests.shutdown_due = now + close_timeout_s
    node.joining.give_up(node, "the handler was shut down")
    if node.term is not None:
        node.term.close_job(node.settings.node_id, end, now)
        node.term.leave_local(now, node.own_key())
    else:
        if node.job_closed:
            node.requests.pending_close = None
        elif node.requests.pending_close is None:  # a close still pending (a failed job's) stands
            node.requests.pending_close = end
        if (node.session is not None and node.session.ready) or node.job_closed:
            deliver_close(node, now)  # and leaves, once its close (if any) is out
            if not ticket.decided:
                leave_for_good(node, now)  # the job closed already: nothing to tell
        else:
            # Between leaders (ours was just lost): the close goes to the next one, if one
            # welcomes this node in time; else the others would go on as if it had died.
            node.requests.shutdown_due = now + min(close_timeout_s, node.settings.beats.timeout_s)
            log.info("%s shutting down: waiting for a leader to tell that the job closed", node.label)
    node.flush(now)


def leave_for_good(node: Requester, now: float) -> None:
    """A follower's shutdown, its close (if any) delivered: its leave goes out, the session ends."""
    session = node.session
    if session is not None and session.ready:
        session.leave(node.own_key())
        for frame in session.frames():
            node.out.send(session.conn, frame)
    following.end_session(node)
    node.core.stop()
    if node.requests.shutdown is not None:
        node.resolve(node.requests.shutdown, result=True)


def leave(node: Requester, ticket: Ticket, now: float) -> None:
    """Leave the job at once (a preemption notice), the job going on without this node.

    The ticket resolves once the others no longer need this node's workers: a follower
    waits until the leader formed a round without it; a leader until every other member
    stopped its workers and re-joined, then hands the job to the next member in rank order.
    Only then may the agent stop its own workers: stopped earlier, they would make the
    others' workers fail, and those failures would count against ``--max-restarts``.
    """
    node.ballot.leave()  # on the disk before the leave goes out: its vote goes with it
    ticket.due = ticket.deadline  # (the handler's: it waits that long for the others)
    node.requests.leaving = ticket
    node.joining.give_up(node, "this node is leaving the job")
    if node.term is not None:
        node.term.leave_local(now, node.own_key())
    elif node.session is not None:
        node.session.leave(node.own_key())
    node.flush(now)


def leaving_deadline(node: Requester, now: float) -> None:
    """The others did not go on in time: leave anyway (a leader still hands over)."""
    ticket = node.requests.leaving
    if ticket is None or ticket.decided or ticket.due is None or now < ticket.due:
        return
    if node.term is not None:
        leading.hand_over(node, now)
    else:
        following.end_session(node)
        node.core.stop()
    node.resolve(ticket, result=False)


def check_leaving(node: Requester, now: float) -> None:
    ticket = node.requests.leaving
    if ticket is None or ticket.decided:
        return
    rnd = node.in_round
    if node.term is not None:
        if not node.term.others_rejoined():
            return
        log.info("%s leaving: every other member re-joined; handing the job over", node.label)
        leading.hand_over(node, now)
    elif node.session is not None and node.session.ready and rnd is not None:
        status = node.session.status
        if status is None or (status.epoch == rnd.epoch and status.round <= rnd.number):
            return  # no round without us yet
        following.end_session(node)
        node.core.stop()
    elif rnd is not None:
        # Between leaders (ours was lost, with our leave maybe): the leave goes to the next
        # one that welcomes us (``_session_event``); else, at the deadline, the others keep
        # our vote (only our own word takes it: ``_evidence``).
        return
    else:
        following.end_session(node)  # not in a round: nobody waits for us
        node.core.stop()
        node.resolve(ticket, result=False)
        return
    node.resolve(ticket, result=True)


def expire(node: Requester, now: float) -> None:
    node.joining.expire(node, now)
    for key, ticket in list(node.requests.arrivals.items()):
        if ticket.due is not None and now >= ticket.due:
            del node.requests.arrivals[key]
            node.resolve(ticket, result=False)
    if (
        node.requests.shutdown is not None
        and not node.requests.shutdown.decided
        and now >= node.requests.shutdown_due
    ):
        finish_shutdown(node, now, timed_out=True)


def finish_shutdown(node: Requester, now: float, *, timed_out: bool = False) -> None:
    term, ticket = node.term, node.requests.shutdown
    if ticket is None or ticket.decided:
        return
    if term is not None:
        if not term.all_gone() and not timed_out:
            return
        if timed_out:
            log.warning("%s stopping the store although not every node left within close_timeout", node.label)
        term.release_stores()
        node.unlead("the leader shut down", now, leaving=True)
        node.core.resign(now)
    else:
        if node.requests.pending_close is not None:
            log.warning(
                "%s shut down without telling the job that it closed: no leader welcomed this "
                "node in time; the others treat it as lost",
                node.label,
            )
        following.end_session(node)
        node.core.stop()
    for data, dest in node.core.datagrams_to_send(now):
        node.out.send_datagram(data, dest)
    node.resolve(ticket, result=True)
