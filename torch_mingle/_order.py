"""Where a node sorts in rank order: its *place*, computed once from ``rank_order``.

How it works
------------
Each node turns the job's ``rank_order`` policy into one short string, its place, and sends it
with every join. The leader admits members whatever their places (itself, the previous round,
then arrival order), sorts the admitted by place (digit runs compare as numbers, ``/``-separated
parts one by one: ``natural_key``) and reads the sorted list as a ring that starts at itself,
since rank 0 hosts the store (``_rounds.rank_order``).

* ``arrival``: no place; the previous round's order, then arrival order (the leader first).
* ``host``: the host name (``node7`` before ``node66``; ties fall back to arrival order).
* ``env:VAR``: the value of ``$VAR`` on the node (``SLURM_NODEID``, ``JOB_COMPLETION_INDEX``).
* ``topology``: ``$TORCH_MINGLE_TOPOLOGY`` (``zone1/rack12/leaf3``), then the host name, so
  nodes that share a longer prefix get neighbouring ranks.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping

from torch_mingle._places import MAX_PLACE_CHARS
from torch_mingle.errors import MingleConfigError

POLICIES = ("host", "arrival", "topology", "env:VAR")
DEFAULT_POLICY = "host"
TOPOLOGY_ENV = "TORCH_MINGLE_TOPOLOGY"
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_README = "docs/usage.md#rank-order"


def parse_policy(key: str, raw: object) -> str:
    """``rank_order`` as given: one of ``POLICIES`` (``env:`` with a variable name)."""
    text = str(raw).strip()
    if text.lower() in ("host", "arrival", "topology"):
        return text.lower()
    if text[:4].lower() == "env:" and _VAR.fullmatch(text[4:]):
        return "env:" + text[4:]
    raise MingleConfigError(
        f"rdzv_conf {key}={raw!r} is not one of {', '.join(POLICIES)}; e.g. --rdzv_conf "
        f"{key}=env:SLURM_NODEID (see {_README})"
    )


def place_of(policy: str, environ: Mapping[str, str], hostname: str | None = None) -> str:
    """This node's place under ``policy``; a node that lacks what the policy reads fails here,
    before it joins, naming the variable and the fix."""
    host = hostname if hostname is not None else socket.gethostname()
    if policy == "arrival":
        return ""
    if policy == "host":
        place = host
    elif policy == "topology":
        label = environ.get(TOPOLOGY_ENV, "").strip().strip("/")
        if not label:
            raise MingleConfigError(
                f"rank_order=topology, but ${TOPOLOGY_ENV} is not set on this node ({host}); set it "
                f"to the node's place in the network, e.g. {TOPOLOGY_ENV}=zone1/rack12/leaf3, on "
                f"every node (see {_README})"
            )
        place = f"{label}/{host}"
    else:
        var = policy[4:]
        place = environ.get(var, "").strip()
        if not place:
            raise MingleConfigError(
                f"rank_order={policy}, but ${var} is not set on this node ({host}); set it on every "
                f"node, or use rank_order=host (see {_README})"
            )
    if len(place) > MAX_PLACE_CHARS:
        raise MingleConfigError(
            f"rank_order={policy}: this node's place {place[:40]!r}... is {len(place)} characters "
            f"long; at most {MAX_PLACE_CHARS} are sent (see {_README})"
        )
    return place
