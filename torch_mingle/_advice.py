"""A node's early words to whoever runs it, each at its own time, and one decision.

* Nothing heard of the job's other nodes ``discovery_warning`` after the start: what was heard
  instead (datagrams naming the job signed with another secret, of another version, from a
  clock far apart), else the other jobs it hears on its group (a job id that differs, with
  the closest one, or nodes not started yet), else that multicast may be blocked (said once,
  with the interfaces and what to try); nothing in a job of one node.
* A join still waits after ``discovery_warning``, and for a quorum of an earlier round's
  votes: a relaunch of a job that is over, on fewer of its hosts, finds the votes its nodes
  kept (``_identity``); it says at once what that means and how to go on, not only when
  ``join_timeout`` ends.
* A node without a secret that hears its job's datagrams signed (``SIGNED_TO_REFUSE``) and no
  other node refuses its joins at once (``heard``): the job uses a secret it lacks.
* A health check that runs longer than the heartbeat timeout, on a node of a job that has
  other nodes, makes the node unfit meanwhile: the members' next round waits for its
  leader's join, so it gives up its term and another node leads (``due`` says so).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from typing import Protocol

from torch_mingle._errors import README_NETWORKS, README_SECURITY
from torch_mingle._leader import LeaderTerm
from torch_mingle._protocol import Discovery
from torch_mingle._records import WaitKind
from torch_mingle._settings import NodeSettings
from torch_mingle._wire import REPLAY_WINDOW_MS

log = logging.getLogger(__name__)

#: Signed datagrams of its job that a node without a secret hears before it refuses itself.
SIGNED_TO_REFUSE = 3


class Waiting(Protocol):
    """What the leader last answered the node's join (``_joining.Joining``)."""

    wait_reason: str
    wait_kind: WaitKind
    refused: str

    def refuse(self, why: str) -> None: ...


class Advised(Protocol):
    """What the advice reads of its node (``_node.Node``)."""

    settings: NodeSettings
    core: Discovery

    @property
    def joining(self) -> Waiting: ...

    @property
    def label(self) -> str: ...
    @property
    def term(self) -> LeaderTerm | None: ...
    def waits_for_a_round(self) -> bool: ...
    def describe_network(self) -> str: ...


class Advice:
    def __init__(self, settings: NodeSettings) -> None:
        self._warning_s = settings.discovery_warning_s
        self._timeout_s = settings.beats.timeout_s
        #: When to say that nothing was heard of the other nodes.
        self._quiet_at: float | None = None
        #: When a join that waits for a quorum says what to do, once.
        self._quorum_check_at: float | None = None
        self._quorum_warned = False
        #: Since when its health check runs; None while none runs.
        self._checking_since: float | None = None

    def heard(self, node: Advised) -> None:
        """A datagram came: a node without a secret that hears its job only signed refuses
        itself at once (it trusts any sender anyway; one with a secret only warns, since a
        forged datagram must not stop it)."""
        stats = node.core.stats
        if (
            node.joining.refused
            or node.core.codec.authenticated
            or stats.invalid_of_job["unexpected_tag"] < SIGNED_TO_REFUSE
            or node.core.peers
        ):
            return
        node.joining.refuse(
            f"datagrams of job {node.settings.job!r} signed with a secret arrive, and this node has "
            f"none: every node of the job needs the same secret_file ({README_SECURITY})"
        )

    def started(self, now: float) -> None:
        if self._warning_s > 0:
            self._quiet_at = now + self._warning_s

    def join_requested(self, now: float) -> None:
        if self._warning_s > 0 and not self._quorum_warned:
            self._quorum_check_at = now + self._warning_s

    def checking(self, running: bool, now: float) -> None:
        """The node's health check starts (or ended) before a join."""
        self._checking_since = now if running else None

    def next_timer(self, *, unfit: bool) -> float | None:
        times = [self._quiet_at, self._quorum_check_at, self._check_too_long_at(unfit)]
        present = [t for t in times if t is not None]
        return min(present) if present else None

    def due(self, node: Advised, now: float, *, unfit: bool) -> bool:
        """Say what is due by ``now``; True if the node must count itself unfit now."""
        if self._quiet_at is not None and now >= self._quiet_at:
            self._quiet_at = None
            self._warn_if_alone(node)
        if self._quorum_check_at is not None and now >= self._quorum_check_at:
            self._quorum_check_at = None
            self._warn_if_no_quorum(node)
        return self._check_runs_long(node, now, unfit)

    def _check_too_long_at(self, unfit: bool) -> float | None:
        """When a running health check has run too long for this node to keep leading (None:
        none runs, or the node is unfit already)."""
        if self._checking_since is None or unfit:
            return None
        return self._checking_since + self._timeout_s

    def _check_runs_long(self, node: Advised, now: float, unfit: bool) -> bool:
        since, at = self._checking_since, self._check_too_long_at(unfit)
        if since is None or at is None or now < at or not node.core.peers:
            return False
        log.warning(
            "%s its health check has run for %.1fs: it gives up leading meanwhile (the job's "
            "next round must not wait for it)",
            node.label, now - since,
        )  # fmt: skip
        return True

    def _warn_if_alone(self, node: Advised) -> None:
        """Nothing heard from the job's other nodes yet: say what was heard instead (datagrams
        naming the job that it must drop: another secret, another version, clocks apart; else
        other jobs on its group), or that multicast may be blocked; nothing in a job of one
        node, which has nobody to hear."""
        if node.core.peers or node.settings.rules.max_nodes <= 1:
            return
        job = node.settings.job
        mine = node.core.stats.invalid_of_job
        meaning = what_drops_mean(mine)
        if meaning:
            log.warning(
                "%s no other node of job %r heard in %gs, but %d datagram(s) naming the job arrived "
                "that this node must drop (%s): %s",
                node.label, job, self._warning_s, sum(mine.values()),
                ", ".join(f"{reason} x{n}" for reason, n in sorted(mine.items())), meaning,
            )  # fmt: skip
            return
        stats = node.core.stats
        if stats.other_jobs:
            log.warning(
                "%s no other node of job %r heard on %s in %gs, but nodes of other jobs are heard "
                "there: %s. If one of them is meant to be this job, start every node with the same "
                "job id (--rdzv_id; compared exactly)%s; otherwise the job's other nodes have not "
                "started, or do not reach this one (docs/networks.md#when-multicast-is-blocked)",
                node.label, job, node.describe_network(), self._warning_s,
                _most_heard(stats.other_jobs, stats.other_jobs_overflow),
                _did_you_mean(job, stats.other_jobs),
            )  # fmt: skip
            return
        log.warning(
            "%s no other node of job %r heard on %s in %gs: either they have not started, or "
            "multicast does not reach them (probably blocked between the nodes). Check with "
            "`python -m torch_mingle doctor --job %s` on each node; fallback=broadcast or "
            "peers=HOST;HOST work without multicast (%s)",
            node.label,
            job,
            node.describe_network(),
            self._warning_s,
            job,
            README_NETWORKS,
        )

    def _warn_if_no_quorum(self, node: Advised) -> None:
        """The join still waits, for a quorum of an earlier round's votes: say what that means."""
        if not node.waits_for_a_round():
            return
        term = node.term
        kind = term.book.wait_kind if term is not None else node.joining.wait_kind
        if kind is not WaitKind.NO_QUORUM:
            return
        why = term.book.explain() if term is not None else node.joining.wait_reason
        self._quorum_warned = True
        log.warning(
            "%s no round after %gs: %s. If the job that ran under this --rdzv_id before is over "
            "(this is a relaunch), the votes its nodes kept in state_dir still count: relaunch under "
            "a new --rdzv_id, or with --rdzv_conf state_dir=none on every node "
            "(docs/usage.md#relaunching-a-job); otherwise start the missing nodes",
            node.label, self._warning_s, why,
        )  # fmt: skip


def _most_heard(others: Mapping[str, int], overflow: int, shown: int = 5) -> str:
    """The other jobs heard most, with their datagram counts, and how many more there are
    (``overflow``: datagrams of jobs beyond those the node counts one by one)."""
    ranked = sorted(others.items(), key=lambda item: (-item[1], item[0]))
    said = ", ".join(f"{job!r} ({n} datagrams)" for job, n in ranked[:shown])
    if len(ranked) > shown:
        said += f" and {len(ranked) - shown} more job(s)"
    return said + (f", and {overflow} datagrams of jobs not counted one by one" if overflow else "")


def _did_you_mean(job: str, others: Mapping[str, int]) -> str:
    """``": did you mean 'x'?"`` for the other job whose id is closest to ``job``, if one is close."""
    close = difflib.get_close_matches(job, list(others), n=1, cutoff=0.6)
    return f": did you mean {close[0]!r}?" if close else ""


#: What each kind of dropped datagram says about secrets, versions and clocks.
_DROP_ADVICE = {
    "bad_tag": "datagrams signed with a different secret arrived: every node of the job needs the same "
    "secret (secret_file)",
    "missing_tag": "unsigned datagrams arrived: some nodes run without a secret; give them the same "
    "secret_file",
    "unexpected_tag": "signed datagrams arrived: the other nodes use a secret and this node has none; give "
    f"it the same secret_file (see {README_SECURITY})",
    "bad_version": "datagrams of another torch_mingle version arrived: nodes of different versions cannot "
    "read each other's rounds; install the same version on every node",
    "outside_replay_window": f"signed datagrams older or newer than {REPLAY_WINDOW_MS // 1000} s arrived: if "
    "they are not replays, the nodes' clocks differ; sync them (NTP)",
}


def what_drops_mean(invalid: Mapping[str, int]) -> str:
    """What dropped datagrams say about secrets, versions and clocks, if anything."""
    return "; ".join(advice for reason, advice in _DROP_ADVICE.items() if invalid.get(reason))
