"""Rank order (``rank_order``): each node's place, and the leader's order of the members."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_mingle._frames import Join
from torch_mingle._order import parse_policy, place_of
from torch_mingle._places import natural_key
from torch_mingle._rounds import JoinRequest, rank_order
from torch_mingle.config import MingleConfig
from torch_mingle.errors import MingleConfigError


def joins(places: dict[int, str]) -> dict[int, JoinRequest]:
    return {n: JoinRequest(node=n, join=Join(0, "198.18.0.1", place=p)) for n, p in places.items()}


def test_host_names_sort_by_their_numbers_not_as_strings():
    names = ["node66", "node7", "node10", "node2", "gpu-a100-3", "gpu-a100-12"]
    assert sorted(names, key=natural_key) == [
        "gpu-a100-3",
        "gpu-a100-12",
        "node2",
        "node7",
        "node10",
        "node66",
    ]
    assert sorted(names) != sorted(names, key=natural_key)  # what c10d does: node10 before node2


def test_topology_labels_keep_longer_shared_prefixes_together():
    labels = ["z1/rack10/n1", "z1/rack2/n9", "z2/rack1/n1", "z1/rack2/n10", "z1/rack2"]
    assert sorted(labels, key=natural_key) == [
        "z1/rack2",
        "z1/rack2/n9",
        "z1/rack2/n10",
        "z1/rack10/n1",
        "z2/rack1/n1",
    ]


def test_the_leader_is_rank_0_and_the_others_follow_the_place_ring():
    places = {5: "node66", 3: "node7", 9: "node10", 1: "node2"}
    assert rank_order(9, joins(places)) == (9, 5, 1, 3)  # node10, node66, then around: node2, node7
    assert rank_order(1, joins(places)) == (1, 3, 9, 5)  # the first in order leads: plain order


def test_without_places_the_previous_round_then_arrival_order():
    pending = joins({5: "", 3: "", 9: "", 1: ""})
    assert rank_order(9, pending, previous=(1, 9)) == (9, 1, 5, 3)
    assert rank_order(9, pending) == (9, 5, 3, 1)


def test_equal_places_fall_back_to_the_previous_round_then_arrival():
    pending = joins({5: "h", 3: "h", 9: "h", 1: "h"})
    assert rank_order(9, pending, previous=(1, 9)) == (9, 1, 5, 3)  # as without places


@given(
    st.lists(
        st.tuples(st.integers(1, 50), st.sampled_from(["", "a1", "a2", "b1", "b10"])),
        min_size=1,
        max_size=12,
        unique_by=lambda t: t[0],
    ),
    st.data(),
)
def test_rank_order_is_a_permutation_from_the_leader_that_keeps_place_neighbours(members, data):
    pending = joins(dict(members))
    leader = data.draw(st.sampled_from([n for n, _ in members]))
    order = rank_order(leader, pending)
    assert order[0] == leader and sorted(order) == sorted(pending)
    if any(p for _, p in members):
        # Read as a ring, the ranks visit places in ascending order exactly once around.
        ring = [natural_key(pending[n].join.place) for n in order]
        descents = sum(ring[i] > ring[(i + 1) % len(ring)] for i in range(len(ring)))
        assert descents <= 1


def test_each_policy_gives_its_place():
    env = {"SLURM_NODEID": "3", "TORCH_MINGLE_TOPOLOGY": "/zone1/rack12/"}
    assert place_of("host", env, "node7") == "node7"
    assert place_of("arrival", env, "node7") == ""
    assert place_of("env:SLURM_NODEID", env, "node7") == "3"
    assert place_of("topology", env, "node7") == "zone1/rack12/node7"


@pytest.mark.parametrize(
    ("policy", "needle"),
    [
        ("env:SLURM_NODEID", "$SLURM_NODEID is not set on this node (n1)"),
        ("topology", "$TORCH_MINGLE_TOPOLOGY is not set"),
    ],
)
def test_a_node_without_what_its_policy_reads_fails_before_joining(policy, needle):
    with pytest.raises(MingleConfigError) as err:
        place_of(policy, {}, "n1")
    assert needle in str(err.value) and "docs/usage.md#rank-order" in str(err.value)


def test_a_place_too_long_to_send_is_refused():
    with pytest.raises(MingleConfigError, match="at most 256"):
        place_of("env:X", {"X": "x" * 300}, "n1")


def test_the_policy_is_checked_and_host_is_the_default():
    assert MingleConfig.from_mapping(run_id="j", min_nodes=1, max_nodes=1, conf={}).rank_order == "host"
    assert parse_policy("rank_order", " Topology ") == "topology"
    assert parse_policy("rank_order", "env:JOB_COMPLETION_INDEX") == "env:JOB_COMPLETION_INDEX"
    for bad in ("env:", "env:1X", "racks", "env:A-B"):
        with pytest.raises(MingleConfigError, match="env:SLURM_NODEID"):
            MingleConfig.from_mapping(run_id="j", min_nodes=1, max_nodes=1, conf={"rank_order": bad})


def test_a_shuffled_arrival_gives_the_same_ring_whoever_leads():
    rng = random.Random(7)
    places = {n: f"node{n * 7 % 16}" for n in range(1, 17)}
    for _ in range(20):
        arrived = list(places)
        rng.shuffle(arrived)
        pending = joins({n: places[n] for n in arrived})
        leader = rng.choice(arrived)
        order = rank_order(leader, pending)
        at = order.index(min(places, key=lambda n: natural_key(places[n])))
        assert [places[n] for n in order[at:] + order[:at]] == sorted(places.values(), key=natural_key)


def test_a_spare_never_takes_a_running_members_place_whatever_its_place():
    pending = joins({9: "n5", 1: "n1", 4: "n4", 2: "n2"})  # 2 arrived last: a spare
    assert rank_order(9, pending, previous=(9, 4, 1), limit=3) == (9, 4, 1)  # ranks kept
    assert rank_order(9, pending, limit=3) == (9, 1, 4)  # first round: arrival decides who


@pytest.mark.parametrize("places", [False, True])
def test_ranks_are_kept_a_replacement_takes_the_lost_rank_and_only_a_shrink_renumbers(places):
    """The contract (docs/usage.md#ranks-across-rounds): whatever the policy, a member keeps its
    rank; a spare takes the rank of the node it replaces; a new leader takes rank 0 and its
    old rank goes to the replacement (or, without one, to the member whose rank fell off the end)."""

    def order(leader, nodes, previous, limit=None):
        return rank_order(leader, joins({n: f"z{99 - n}" if places else "" for n in nodes}), previous, limit)

    prev = (10, 11, 12, 13)
    assert order(10, [10, 11, 13, 20], prev) == (10, 11, 20, 13)  # 12 died: the spare takes rank 2
    assert order(10, [10, 11, 13], prev) == (10, 11, 13)  # 12 died, no spare: 13 moves down, alone
    assert order(10, [10, 12, 13], prev) == (10, 13, 12)  # 11 died: 13 (rank 3 is gone) takes 1
    assert order(11, [11, 12, 13, 20], prev) == (11, 20, 12, 13)  # the leader died: 11 leads, spare takes 1
    assert order(11, [11, 12, 13], prev) == (11, 13, 12)  # ... without a spare: the last takes 1
    assert order(11, [10, 11, 12, 13], prev) == (11, 10, 12, 13)  # leaders swapped ranks
    grown = order(10, [10, 11, 12, 13, 20, 21], prev)  # newcomers after the kept: by place, else arrival
    assert grown == (10, 11, 12, 13, *((21, 20) if places else (20, 21)))


@given(st.lists(st.integers(1, 30), min_size=1, max_size=10, unique=True), st.data())
def test_a_member_of_the_previous_round_keeps_its_rank_where_the_round_still_has_it(previous, data):
    pool = sorted(set(range(1, 31)) - set(previous))
    stay = data.draw(st.lists(st.sampled_from(previous), unique=True))
    new = data.draw(st.lists(st.sampled_from(pool), unique=True, max_size=5))
    leader = data.draw(st.sampled_from(stay + new)) if stay + new else previous[0]
    nodes = list(dict.fromkeys([leader, *stay, *new]))
    order = rank_order(leader, joins({n: f"p{n % 4}" for n in nodes}), tuple(previous))
    assert order[0] == leader and sorted(order) == sorted(nodes)
    for node in stay:
        rank = previous.index(node)
        if node != leader and 0 < rank < len(order):
            assert order[rank] == node
