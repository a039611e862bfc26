"""The world a round's workers start in (``_world``): stand-ins carry the round's world, and
ranks that would put an agent's workers in a smaller one are refused."""

from __future__ import annotations

import json

import pytest

from torch_mingle._errors import StateError
from torch_mingle._world import (
    ASSIGNED_RANKS_PREFIX,
    ROLE_INFO_PREFIX,
    checked,
    stand_in,
    store_error_wait_s,
)

TWO_WORKERS = b'{"role": "default", "rank": 3, "local_world_size": 2}'


def test_a_broken_round_stands_in_with_the_rounds_world_never_one_nodes():
    """A lost member never wrote its role info: each agent reads its own in its place, and
    ranks in a world of the round's five nodes (the bug of 2026-11-27 gave WORLD_SIZE=1)."""
    assert stand_in(f"{ROLE_INFO_PREFIX}4", TWO_WORKERS, world_size=5) == TWO_WORKERS
    base, world, role_base, role_world = json.loads(stand_in(f"{ASSIGNED_RANKS_PREFIX}3", TWO_WORKERS, 5))
    assert (base, world, role_base, role_world) == (6, 10, 6, 10)
    assert json.loads(stand_in(f"{ASSIGNED_RANKS_PREFIX}0", None, 5))[1] == 5  # no role info written yet


@pytest.mark.parametrize(
    ("ranks", "ok"),
    [
        ([0, 5, 0, 5], True),
        ([4, 5, 4, 5], True),
        ([0, 1, 0, 1], False),
        ([5, 5, 5, 5], False),
        ([-1, 5, 0, 5], False),
    ],
)
def test_ranks_outside_the_rounds_world_are_refused(ranks, ok):
    key, value = f"{ASSIGNED_RANKS_PREFIX}0", json.dumps(ranks).encode()
    if ok:
        assert checked(key, value, None, world_size=5) == value
    else:
        with pytest.raises(StateError, match="a world of their own"):
            checked(key, value, None, world_size=5)


def test_what_is_not_torchs_ranks_is_refused_and_other_keys_pass():
    with pytest.raises(StateError, match="not torch's assigned ranks"):
        checked(f"{ASSIGNED_RANKS_PREFIX}0", b"garbage", None, world_size=2)
    assert checked(f"{ROLE_INFO_PREFIX}0", b"anything", None, world_size=2) == b"anything"


def test_a_failed_store_call_waits_longer_than_the_nodes_heartbeat_timeout():
    assert store_error_wait_s(1.4) > 1.4
