"""One job per --rdzv_id: partitions and a failover with multicast gone, one agent per namespace.

Each node is a torchrun agent in its own network namespace on one bridge. A partition moves
some hosts' cables to a second bridge (and back to heal); "multicast gone" turns multicast
and broadcast flooding off on every port after the round formed, as a snooping switch that
forgot the group does.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers import (
    assert_trained_together,
    dump,
    final_reports,
    finish_all,
    joined_after,
    latest_round,
    leader_of,
    logged_at,
    start_training,
    wait_until,
)

pytestmark = pytest.mark.netns

HEARTBEAT = {"keep_alive_interval": 1, "keep_alive_max_attempt": 2}


def _start(segment, tmp_path, *, n, steps, step_time, bridge="br0", net="198.18.0"):
    hosts = [segment.add_host(f"{net}.{10 + i}", bridge=bridge) for i in range(1, n + 1)]
    conf = {"join_timeout": 180, "rejoin_delay": 2, "last_call_timeout": 8, **HEARTBEAT}
    agents = start_training(
        hosts, tmp_path, conf, nnodes=f"2:{n}", steps=steps, step_time=step_time, prefix="q", trained_step=3
    )
    return hosts, agents


def _rounds_joined_after(agents, since: float) -> list[float]:
    return [t for a in agents if (t := logged_at(a, "joined round", after=since)) is not None]


def test_an_even_split_trains_on_neither_side_until_it_heals(segment, tmp_path):
    hosts, agents = _start(segment, tmp_path, n=4, steps=200, step_time=0.1)
    leader = leader_of(agents)
    li = agents.index(leader)
    side = [hosts[i] for i in range(4) if i != li][:2]  # two non-leaders: the leader's side has 2 too
    split_at = time.time()
    segment.split(side)
    # Each side loses half the job: the leader's side drops the other two, the other side loses
    # its leader and elects one. Neither has a majority of round 1: no round forms for 16 s.
    # Without the quorum rule the leader's side forms at once (its other two are dead) and the
    # other side within its last call (8 s) of electing: both well inside the split.
    time.sleep(16)  # the partition's length is the test's input, not a wait for a condition
    joined = _rounds_joined_after(agents, split_at)
    assert joined == [], f"a side formed a round during the split\n{dump(agents)}"
    healed_at = time.time()
    segment.heal(side)
    assert finish_all(agents) == [0, 0, 0, 0], dump(agents)
    reports = final_reports(tmp_path / "report")
    assert_trained_together(reports, 4, 200, agents)
    # From the progress log: no round started training between the split and the heal.
    firsts = [json.loads(p.read_text()) for p in (tmp_path / "report").glob("first-*.json")]
    during = [f for f in firsts if split_at < f["t_first_step"] < healed_at]
    assert during == [], during
    # ...and the split did cut a running job (the test would prove nothing if it had finished).
    assert any(f["t_first_step"] > healed_at for f in firsts), firsts


def test_three_of_four_go_on_without_the_cut_leader_which_waits(segment, tmp_path):
    hosts, agents = _start(segment, tmp_path, n=4, steps=200, step_time=0.1)
    leader = leader_of(agents)
    cut_host = hosts[agents.index(leader)]
    before = len(leader.output())
    job_round = latest_round(agents)
    split_at = time.time()
    segment.split([cut_host])
    three = [a for a in agents if a is not leader]
    wait_until(
        lambda: all(joined_after(a, job_round) for a in three),
        60,
        "the three's round",
        0.2,
        agents,
    )
    took = max(_rounds_joined_after(three, split_at)) - split_at
    print(f"split 3|1: the three joined a new round {took:.2f}s after the cut")
    timeout_s = HEARTBEAT["keep_alive_interval"] * HEARTBEAT["keep_alive_max_attempt"]
    assert took <= timeout_s + 3, dump(agents)
    assert "joined round" not in leader.output()[before:], dump(agents)  # the one waits
    segment.heal([cut_host])
    assert finish_all(agents) == [0, 0, 0, 0], dump(agents)
    assert_trained_together(final_reports(tmp_path / "report"), 4, 200, agents)


def test_the_leader_is_replaced_by_unicast_when_multicast_has_stopped(segment, tmp_path):
    segment.create_bridge("brq", mcast_snooping=False)
    _, agents = _start(segment, tmp_path, n=4, steps=120, step_time=0.1, bridge="brq", net="198.18.2")
    segment.drop_multicast(broadcast=True)  # after the round formed: the switch forgot the group
    old = leader_of(agents)
    killed_at = time.time()
    old.kill()
    survivors = [a for a in agents if a is not old]
    assert finish_all(survivors) == [0, 0, 0], dump(agents)
    assert_trained_together(final_reports(tmp_path / "report"), 3, 120, agents)
    took = max(_rounds_joined_after(survivors, killed_at)) - killed_at
    print(f"multicast off: the survivors joined a round under a new leader {took:.2f}s after the kill")
    assert took <= 5.0, dump(agents)
