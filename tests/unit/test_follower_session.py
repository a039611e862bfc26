"""The follower's session, sans I/O: the next round's store it was told survives a retry."""

from __future__ import annotations

from torch_mingle._follower import FollowerSession
from torch_mingle._protocol import Claim
from torch_mingle._rounds import Status

LEADER = 0x1


def _ready_session() -> FollowerSession:
    s = FollowerSession(
        claim=Claim(1, LEADER), ip="198.18.0.1", port=4000, node=0x2, own_ip="198.18.0.2", history=None,
        interval_s=1.0, timeout_s=3.0, connect_timeout_s=3.0, label="", started=0.0,
    )  # fmt: skip
    s.connected(0.1)
    s.received([{"t": "welcome", "epoch": 1, "status": Status().to_json()}], 0.2)
    assert s.ready, s.events()
    return s


def test_a_retry_keeps_the_store_named_for_the_next_round():
    """The leader names each store once per node: a node that forgot it would connect late."""
    s = _ready_session()
    s.received([{"t": "next", "port": 5001}], 0.3)
    s.received([{"t": "retry", "id": 7, "why": "superseded by a newer join of the same node"}], 0.4)
    assert s.next_store_port == 5001
    s.received([{"t": "timeout", "id": 8, "why": "join_timeout"}], 0.5)
    assert s.next_store_port == 5001
