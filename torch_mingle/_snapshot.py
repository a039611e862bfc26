"""The snapshot a node publishes for its agent's thread (``Diagnostics``), and when.

The agent's thread never asks the loop: it reads the newest snapshot on the board. A snapshot
goes out at once when something the agent acts on changed (the leader, the round, whether it
broke, ``num_nodes_waiting``, the job closed, a recovery), else at most every
``DIAG_REFRESH_S``; and always before an answer to the agent, which then never reads a
snapshot older than its answer (``Node._hand_over_answer``).
"""

from __future__ import annotations

from typing import Protocol

from torch_mingle import _failpoints
from torch_mingle._ahead import StoreAhead
from torch_mingle._follower import FollowerSession
from torch_mingle._keys import RoundKey
from torch_mingle._leader import ControlCounters, LeaderTerm
from torch_mingle._protocol import Discovery
from torch_mingle._ready import Ready
from torch_mingle._record import replace
from torch_mingle._records import History, Round, Status
from torch_mingle._settings import NodeSettings
from torch_mingle._view import Diagnostics

DIAG_REFRESH_S = 0.1


class Shown(Protocol):
    """What a snapshot shows of its node (``_node.Node``)."""

    settings: NodeSettings
    core: Discovery
    ahead: StoreAhead
    in_round: Round | None
    job_closed: bool
    trouble: str | None
    recoveries: int
    last_error: str | None

    @property
    def out(self) -> Ready: ...
    @property
    def term(self) -> LeaderTerm | None: ...
    @property
    def leading(self) -> LeaderTerm | None: ...
    @property
    def session(self) -> FollowerSession | None: ...
    def status(self, now: float) -> Status | None: ...


class Snapshots:
    """When the node last published, what, and when its leader first told that its round changes."""

    def __init__(self) -> None:
        self._published: tuple[object, ...] = ()
        self._published_at = float("-inf")
        self._told: tuple[RoundKey, float] | None = None  # (round, when) for Diagnostics.told_at

    @staticmethod
    def round_state(node: Shown, status: Status | None) -> tuple[bool, int]:
        """The round this node is in: whether it broke (a member or the leader is lost or left,
        a newer round formed, the job failed: not every member will take its rank), and what
        ``num_nodes_waiting()`` answers (a newcomer waiting too, though the round is whole)."""
        rnd = node.in_round
        if rnd is None:
            return False, 0
        if status is not None and status.failure and status.epoch == rnd.epoch:
            return True, 1  # its round cannot start: stop the workers (the next join fails with why)
        if node.job_closed or (status is not None and status.closed and status.epoch == rnd.epoch):
            # The job is over. A round that is whole finishes (a member that finished and waits
            # in the exit barrier breaks nothing); one that a member left or lost before it
            # finished, or that a newer round replaced, cannot: its workers would wait for the
            # missing ones until their own timeout. It broke: its rank exchange stands in, and
            # its workers stop, their next join failing with why.
            # So did a round whose leader this node lost (it follows another term, or none):
            # the round's store went with its term, and no round of the job will replace it.
            lost = status is None or _term_of(node) != (rnd.epoch, rnd.key[1])
            broke = lost or (
                status is not None
                and status.epoch == rnd.epoch
                and (status.round > rnd.number or (status.round == rnd.number and status.stale))
            )
            return broke, int(broke)
        if node.trouble is not None:
            return True, 1
        if status is None:
            alone = node.term is None and node.session is None
            return alone, int(alone)
        if status.epoch != rnd.epoch or status.round < rnd.number or status.closed:
            return False, 0  # the status of our round is still on its way, or the job is over
        if status.round > rnd.number or status.stale:
            return True, max(1, status.waiting)
        return False, status.waiting

    def _told_at(
        self, node: Shown, now: float, rnd: Round | None, status: Status | None, waiting: int
    ) -> float | None:
        """When the leader's status first said that round ``rnd`` will change (see
        ``Diagnostics.told_at``); None when the change is not the leader's word."""
        told = waiting > 0 and status is not None and not status.failure and node.trouble is None
        if rnd is None or not told:
            self._told = None
            return None
        key = History.of(rnd).key
        if self._told is None or self._told[0] != key:
            self._told = (key, now)
        return self._told[1]

    def publish(self, node: Shown, now: float, *, force: bool = False) -> None:
        """Refresh the board: at once when something the agent acts on changed, else at most every
        0.1 s; ``force``: now (an answer to the agent follows)."""
        view = node.core.leader
        status = node.status(now)
        rnd = node.in_round
        broken, waiting = self.round_state(node, status)
        told_at = self._told_at(node, now, rnd, status, waiting)
        # What the snapshot shows of the leader; not when it was last heard, which every
        # announcement changes (a thousand followers would publish at every one).
        shown = (
            None
            if view is None
            else (view.claim, view.store_ip, view.store_port, view.is_self, view.established)
        )
        key = (
            node.core.role,
            shown,
            rnd,
            status,
            broken,
            waiting,
            node.job_closed,
            node.trouble,
            node.term is not None,
            node.recoveries,
            node.ahead.ready,
        )
        if not force and key == self._published and now - self._published_at < DIAG_REFRESH_S:
            return
        try:
            _failpoints.hit("node.publish")
        except _failpoints.FailpointError:
            return  # a test holds this snapshot back (the agent's thread must not depend on it)
        self._published, self._published_at = key, now
        node.out.publish(
            Diagnostics(
                node_id=f"{node.settings.node_id:016x}",
                job=node.settings.job,
                role=node.core.role.value,
                leader=f"{view.claim.leader:016x}" if view else None,
                leader_ip=(
                    None if view is None else (node.settings.advertised_ip if view.is_self else view.store_ip)
                ),
                leader_port=view.store_port if view else 0,
                epoch=view.claim.epoch if view else 0,
                established=bool(view and view.established),
                is_leader=node.leading is not None,
                round=rnd.number if rnd else 0,
                round_key=History.of(rnd).key if rnd else None,
                rank=rnd.rank_of(node.settings.node_id) if rnd else None,
                world_size=rnd.world_size if rnd else 0,
                status=status,
                round_broken=broken,
                nodes_waiting=waiting,
                told_at=told_at,
                closed=node.job_closed or bool(status and status.closed),
                trouble=node.trouble,
                peers_heard=len(node.core.peers),
                connected_nodes=node.term.connected_nodes() if node.term is not None else 0,
                stats=node.core.stats.copy(),
                recoveries=node.recoveries,
                last_error=node.last_error,
                max_epoch_seen=node.core.max_epoch_seen,
                remembered_nonces=node.core.codec.remembered,
                store_ahead=node.ahead.ready,
                control=replace(node.term.counters) if node.term is not None else ControlCounters(),
            )
        )


def _term_of(node: Shown) -> tuple[int, int] | None:
    """The term (epoch, leader) this node leads or follows now; None: neither."""
    claim = node.term.claim if node.term is not None else (node.session.claim if node.session else None)
    return (claim.epoch, claim.leader) if claim is not None else None
