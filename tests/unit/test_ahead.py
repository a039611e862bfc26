"""The client of the next round's store, opened ahead: kept only for the store aimed at,
handed over once, and every connect toward a lost leader known for the cut."""

from __future__ import annotations

from torch_mingle._ahead import StoreAhead
from torch_mingle._claims import Claim
from torch_mingle._jobs import OpenClient

A, B = Claim(1, 0xA), Claim(2, 0xB)


def ready(ahead: StoreAhead) -> bool:
    return ahead.ready  # (a call: mypy would keep a property narrowed across ``opened``)


def test_a_client_is_kept_only_for_the_store_aimed_at_and_handed_over_once():
    ahead = StoreAhead()
    assert ahead.aim(None) is None
    started = ahead.aim((A, "198.18.0.1", 5001))
    assert started is not None and started[0] == OpenClient("198.18.0.1", 5001)
    assert ahead.aim((A, "198.18.0.1", 5001)) is None  # the same store: no second connect
    first_tag = started[1]
    newer = ahead.aim((B, "198.18.0.2", 6001))  # the leader changed before the connect ended
    assert newer is not None
    ahead.opened(first_tag, "old client", None)
    assert not ready(ahead)  # the round it was for is gone
    ahead.opened(newer[1], "client", None)
    assert ready(ahead)
    assert ahead.take(A, 5001) is None  # another claim's round
    assert ahead.take(B, 6001) == "client"
    assert ahead.take(B, 6001) is None and not ready(ahead)
    assert ahead.aim((B, "198.18.0.2", 6001)) is None  # still aimed: not connected again


def test_a_failed_connect_keeps_nothing_and_the_connects_toward_a_leader_are_known():
    ahead = StoreAhead()
    tag = ahead.aim((A, "198.18.0.1", 5001))
    assert tag is not None
    assert ahead.toward(A) == {("198.18.0.1", 5001)} and ahead.toward(B) == set()
    ahead.opened(tag[1], None, "refused")
    assert not ready(ahead) and ahead.pending == {}
    assert ahead.toward(A) == {("198.18.0.1", 5001)}  # aimed at still: cut if A is lost
    own = StoreAhead()
    own.aim((A, None, 5001))  # this node's own term: nothing to cut on a peer
    assert own.toward(A) == set()
