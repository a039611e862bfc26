"""What a host must allow a leader: descriptors for every node's connections, and an accept
queue for them all connecting at once. The first is raised where it can be; for the second,
and what cannot be raised, the operator is told what to set (docs/networks.md#limits)."""

from __future__ import annotations

import logging
import resource
from pathlib import Path

log = logging.getLogger(__name__)

#: Descriptors a leader needs per node: control connection, agent's clients of the running
#: round's store and of the next one's (opened ahead), 8 workers'.
DESCRIPTORS_PER_NODE = 11
DESCRIPTOR_MARGIN = 256
MAX_NODES_FOR_DESCRIPTORS = 65536


def connections_to_lead(max_nodes: int) -> int:
    """Connections a leader of ``max_nodes`` nodes holds: ``DESCRIPTORS_PER_NODE`` each."""
    return min(max_nodes, MAX_NODES_FOR_DESCRIPTORS) * DESCRIPTORS_PER_NODE


def raise_descriptor_limit(max_nodes: int, label: str) -> None:
    """Raise this process's soft descriptor limit to what leading ``max_nodes`` nodes takes.

    A leader holds, per node, its control connection and its agent's clients of the running
    round's store and of the next round's, and the round store holds one client per worker
    (``DESCRIPTORS_PER_NODE`` counts 8 GPUs a node).
    Many systems start processes with a soft limit of 1,024 and a far higher hard limit; the
    soft one is raised up to the hard one, as far as needed. Past the hard limit only the
    administrator can help: the warning says what to set.
    """
    need = connections_to_lead(max_nodes) + DESCRIPTOR_MARGIN
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.debug("%s descriptor limit raised from %d to %d", label, soft, target)
        except (OSError, ValueError) as exc:
            log.debug("%s could not raise the descriptor limit: %s", label, exc)
            target = soft
    if target < need:
        log.warning(
            "%s leading up to %d nodes takes about %d open descriptors, but this process may open "
            "only %d (hard limit %d): raise it where the agents start (`ulimit -n %d`, LimitNOFILE= "
            "in systemd, a container's nofile ulimit); see docs/networks.md#limits",
            label, max_nodes, need, target, hard, need,
        )  # fmt: skip


SOMAXCONN_PATH = Path("/proc/sys/net/core/somaxconn")
_warned_backlog = False


def warn_if_accept_queue_short(max_nodes: int, label: str) -> None:
    """Warn (once per process) when the kernel caps the leader's accept queue below the job.

    Every node, then every worker (``DESCRIPTORS_PER_NODE`` counts 8 a node), connects to the
    leader at once; a shorter queue drops connection attempts, which wait out SYN retries.
    """
    global _warned_backlog  # noqa: PLW0603 - once per process
    if _warned_backlog:
        return
    try:
        somaxconn = int(SOMAXCONN_PATH.read_text())
    except (OSError, ValueError):
        return
    need = connections_to_lead(max_nodes)
    if somaxconn >= need:
        return
    _warned_backlog = True
    log.warning(
        "%s up to %d nodes and their workers connect to the leader at once (about %d connections), "
        "but net.core.somaxconn caps its accept queue at %d: connection attempts beyond it wait for "
        "SYN retries. Raise it on every host that may lead (`sysctl -w net.core.somaxconn=%d`); "
        "see docs/networks.md#limits",
        label, max_nodes, need, somaxconn, need,
    )  # fmt: skip
